#!/usr/bin/env bash
# Builds kured (the Kubernetes reboot daemon, github.com/kubereboot/kured) from the Go
# module proxy, for the test that runs the real one on gpuheal's reboot sentinel
# (tests/integration/test_kured.py), with kured's own manifests beside it: the test
# applies kured's RBAC (kured-rbac.yaml) and creates its DaemonSet (kured-ds.yaml),
# on whose annotation kured keeps its reboot lock.
#
# Output: $GPUHEAL_KURED_DIR (default .cache/kured at the repo root):
#   bin/kured  kured-rbac.yaml  kured-ds.yaml  stamp
# The stamp is a hash of testenv/kured/ and the Go version, its own (not
# testenv/build.sh's, so a change here never rebuilds Kubernetes); `make testenv`
# runs both.
#
# kured reboots the machine it runs on: it runs its sentinel check and its reboot
# command through `/usr/bin/nsenter -m/proc/1/ns/mnt --`. Never run this binary
# outside the test's private PID and mount namespaces (gpuheal/sim/kured.py).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${GPUHEAL_KURED_DIR:-$root/.cache/kured}"

kured_version="v1.13.1"  # keep in step with go.mod (the one version the proxy serves here)

stamp="$( (cd "$here" && find . -type f ! -name '*.md' -print0 | sort -z | xargs -0 sha256sum; go version) | sha256sum | cut -d' ' -f1)"
if [[ -f "$out/stamp" && "$(cat "$out/stamp")" == "$stamp" && "${1:-}" != "--force" ]]; then
  exit 0
fi

echo "kured: building kured $kured_version into $out" >&2
start=$(date +%s)
rm -rf "$out.new"
mkdir -p "$out.new/bin"
(
  cd "$here"
  # As its release build does (goreleaser): the version into main.version, which
  # kured logs at start ("Kubernetes Reboot Daemon: 1.13.1").
  go build -trimpath -ldflags "-s -w -X main.version=${kured_version#v}" \
    -o "$out.new/bin/" github.com/kubereboot/kured/cmd/kured
  dir="$(go list -m -f '{{.Dir}}' github.com/kubereboot/kured)"
  cp "$dir/kured-rbac.yaml" "$dir/kured-ds.yaml" "$out.new/"
  chmod u+w "$out.new/"*.yaml  # the module cache is read-only
)
echo "$stamp" >"$out.new/stamp"
rm -rf "$out"
mv "$out.new" "$out"
echo "kured: built in $(( $(date +%s) - start ))s into $out" >&2
