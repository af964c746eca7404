#!/usr/bin/env bash
# Builds the real upstream control plane for gpuheal's tests, benchmarks and demo:
# kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and etcd of the
# default Kubernetes version (testenv/k8s, through testenv/kubernetes.sh), the kwok
# controller with its stage files (testenv/kwok) and helm (testenv/helm), from the Go
# module proxy only.
#
# Output: $GPUHEAL_TESTENV_DIR (default .cache/testenv at the repo root):
#   bin/<binaries>  kwok-stages.yaml  stamp
# The stamp is a hash of everything under testenv/ but nvml/, kured/, npd/, deviceplugin/,
# node/ and versions/, and the Go version; a build runs only when it changes, so repeated
# `make test` calls cost nothing.
#
# The other Kubernetes versions the multi-version tier runs on (the oldest supported,
# the newest stable: docs/deploy.md#kubernetes-versions) are testenv/versions/<minor>/,
# built by testenv/versions/build.sh into .cache/testenv-<minor> with stamps of their
# own, so a change there never rebuilds this one; they take kwok and helm from here.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${GPUHEAL_TESTENV_DIR:-$root/.cache/testenv}"

k8s_version="v1.36.3"   # keep in step with testenv/k8s/go.mod (the default version)
kwok_version="v0.8.0"   # keep in step with testenv/kwok/go.mod
helm_version="v3.22.0"  # keep in step with testenv/helm/go.mod

# testenv/nvml, testenv/kured, testenv/npd, testenv/deviceplugin, testenv/node and
# testenv/versions are not this build: each has its own build and stamp
# (testenv/nvml/build.sh, testenv/kured/build.sh, testenv/npd/build.sh,
# testenv/deviceplugin/build.sh, testenv/node/build.sh, testenv/versions/build.sh; `make
# testenv` runs kured's, npd's and versions'; `make node` node's and the device plugin's).
stamp="$( (cd "$here" && find . \( -path ./nvml -o -path ./kured -o -path ./npd -o -path ./deviceplugin -o -path ./node -o -path ./versions \) -prune -o -type f ! -name '*.md' -print0 | sort -z | xargs -0 sha256sum; go version) | sha256sum | cut -d' ' -f1)"
if [[ -f "$out/stamp" && "$(cat "$out/stamp")" == "$stamp" && "${1:-}" != "--force" ]]; then
  exit 0
fi

echo "testenv: building control plane $k8s_version, kwok $kwok_version and helm $helm_version into $out (first build takes a while)" >&2
start=$(date +%s)
mkdir -p "$out/bin.new"
rm -f "$out/stamp"

# shellcheck source=kubernetes.sh
source "$here/kubernetes.sh"
build_kubernetes "$here/k8s" "$out/bin.new"
(
  cd "$here/kwok"
  go build -trimpath -ldflags "-s -w" \
    -o "$out/bin.new/" sigs.k8s.io/kwok/cmd/kwok
  # kwok >= v0.8 ships its lifecycle as stage files; the fake nodes need
  # initialize + lease heartbeat, the fake pods ready/complete/delete.
  stages="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    cat "$stages/$f"
  done > "$out/bin.new/kwok-stages.yaml"
)

(
  cd "$here/helm"
  # As helm's own release build does (its Makefile): the Kubernetes version of its
  # client-go is the one `helm template` renders for without --kube-version, and
  # `helm lint`'s; left out, it is v1.20.
  k8s_modules="$(go list -m -f '{{.Version}}' k8s.io/client-go)"  # v0.37.0
  k8s_minor="${k8s_modules#v0.}"; k8s_minor="${k8s_minor%%.*}"
  hv=helm.sh/helm/v3
  go build -trimpath -ldflags "-s -w -X $hv/internal/version.version=$helm_version \
    -X $hv/pkg/chartutil.k8sVersionMajor=1 -X $hv/pkg/chartutil.k8sVersionMinor=$k8s_minor \
    -X $hv/pkg/lint/rules.k8sVersionMajor=1 -X $hv/pkg/lint/rules.k8sVersionMinor=$k8s_minor" \
    -o "$out/bin.new/" $hv/cmd/helm
)

rm -rf "$out/bin"
mv "$out/bin.new" "$out/bin"
echo "$stamp" > "$out/stamp"
echo "testenv: built in $(( $(date +%s) - start ))s; $(du -sh "$out/bin" | cut -f1) in $out/bin" >&2
