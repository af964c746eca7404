#!/usr/bin/env bash
# Builds the other Kubernetes versions the multi-version tier runs on
# (tests/versions/, docs/deploy.md#kubernetes-versions): one Go module per minor,
# testenv/versions/<minor>/ (k8s.io/kubernetes and the etcd it pins), from the Go
# module proxy only, as testenv/build.sh builds the default one (testenv/kubernetes.sh).
#
#   testenv/versions/build.sh [--force] [MINOR...]    (default: every testenv/versions/*/)
#
# Output, per minor: $GPUHEAL_TESTENV_DIR-<minor> (default .cache/testenv-<minor> at the
# repo root): bin/<the five binaries>, and links to the default build's kwok, its stage
# file and helm (version-independent: testenv/build.sh builds them, run it first), and
# a stamp: a hash of testenv/versions/<minor>/, this script, testenv/kubernetes.sh and
# the Go version. A build runs only when its stamp changes (testenv/build.sh leaves
# versions/ out of its own), so repeated `make test` calls cost nothing. Cold, each
# minor compiles all of Kubernetes again (tens of minutes on 2 cores; the Go build
# cache keeps it for the next build on the machine): it runs under nice.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
base="${GPUHEAL_TESTENV_DIR:-$root/.cache/testenv}"
# shellcheck source=../kubernetes.sh
source "$here/../kubernetes.sh"

# Others share the machine: this build and every compiler it starts yield the CPU first.
renice -n 10 $$ >/dev/null

force=""
if [[ "${1:-}" == "--force" ]]; then force=1; shift; fi
if [[ $# -eq 0 ]]; then
  set -- $(cd "$here" && find . -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -V)
fi

for minor in "$@"; do
  module="$here/$minor"
  [[ -f "$module/go.mod" ]] || { echo "testenv: no Kubernetes $minor module ($module/go.mod)" >&2; exit 2; }
  out="$base-$minor"
  stamp="$( (cd "$module" && find . -type f ! -name '*.md' -print0 | sort -z | xargs -0 sha256sum
             sha256sum "$here/build.sh" "$here/../kubernetes.sh" | cut -d' ' -f1; go version) \
            | sha256sum | cut -d' ' -f1)"
  if [[ -f "$out/stamp" && "$(cat "$out/stamp")" == "$stamp" && -z "$force" ]]; then
    continue
  fi
  version="$(cd "$module" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
  echo "testenv: building Kubernetes $version into $out (cold: tens of minutes)" >&2
  start=$(date +%s)
  rm -rf "$out/bin.new" && mkdir -p "$out/bin.new"
  rm -f "$out/stamp"
  build_kubernetes "$module" "$out/bin.new"
  for tool in kwok kwok-stages.yaml helm; do
    ln -s "$base/bin/$tool" "$out/bin.new/$tool"
  done
  rm -rf "$out/bin"
  mv "$out/bin.new" "$out/bin"
  echo "$stamp" > "$out/stamp"
  echo "testenv: Kubernetes $version built in $(( $(date +%s) - start ))s; $(du -shL "$out/bin" 2>/dev/null | cut -f1) in $out/bin" >&2
done
