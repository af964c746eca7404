#!/usr/bin/env bash
# Builds NVIDIA's Kubernetes device plugin (github.com/NVIDIA/k8s-device-plugin,
# cmd/nvidia-device-plugin) from the Go module proxy, to run over the NVML stand-in
# (testenv/nvml) on a machine without a GPU: see testenv/deviceplugin/README.md for
# what it calls and what it needs from the host.
#
# Output: $GPUHEAL_DEVICEPLUGIN_DIR (default .cache/deviceplugin at the repo root):
#   bin/nvidia-device-plugin  bin/fake-kubelet  version  stamp
# fake-kubelet (fakekubelet/ here) is the kubelet's device-plugin registration service
# and ListAndWatch client, for running the plugin without a node (standalone.sh).
# The stamp is a hash of testenv/deviceplugin/ and the Go version, its own (not
# testenv/build.sh's, so a change here never rebuilds Kubernetes).
#
# The plugin reaches NVML through go-nvml, whose cgo calls are left unresolved at link
# time and bound when it dlopens libnvidia-ml.so.1 (RTLD_GLOBAL): the link flags are
# the plugin's own Makefile's (EXTLDFLAGS), without which the link fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${GPUHEAL_DEVICEPLUGIN_DIR:-$root/.cache/deviceplugin}"

plugin_version="v0.19.3"  # keep in step with go.mod (the newest the proxy serves here)
# The tag's commit, as the proxy's .info for it records (Origin.Hash).
plugin_commit="570e776d6813cb9f3e9c8c105cf8d79989db6650"

if ! command -v "${CC:-gcc}" >/dev/null; then
  echo "deviceplugin: no C compiler on PATH (go-nvml is cgo); install gcc" >&2
  exit 1
fi

stamp="$( (cd "$here" && find . -type f ! -name '*.md' -print0 | sort -z | xargs -0 sha256sum; go version) | sha256sum | cut -d' ' -f1)"
if [[ -f "$out/stamp" && "$(cat "$out/stamp")" == "$stamp" && -x "$out/bin/nvidia-device-plugin" && "${1:-}" != "--force" ]]; then
  exit 0
fi

echo "deviceplugin: building nvidia-device-plugin $plugin_version into $out" >&2
start=$(date +%s)
rm -rf "$out.new"
mkdir -p "$out.new/bin"
(
  cd "$here"
  # As its Makefile does: the version and commit into internal/info, which the plugin
  # logs at start and prints for --version.
  pkg=github.com/NVIDIA/k8s-device-plugin/internal/info
  CGO_ENABLED=1 go build -trimpath -ldflags "-s -w \
    '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files' \
    -X $pkg.version=$plugin_version -X $pkg.gitCommit=$plugin_commit" \
    -o "$out.new/bin/" github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin
  go build -trimpath -ldflags "-s -w" -o "$out.new/bin/fake-kubelet" ./fakekubelet
)
echo "$plugin_version $plugin_commit" >"$out.new/version"
echo "$stamp" >"$out.new/stamp"
rm -rf "$out"
mv "$out.new" "$out"
echo "deviceplugin: built in $(( $(date +%s) - start ))s into $out" >&2
