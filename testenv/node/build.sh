#!/usr/bin/env bash
# Builds what a real node of the test cluster runs beside Debian's container runtime
# (containerd, runc and the CNI plugins, installed by `make node`): the kubelet of the
# default Kubernetes release (from testenv/k8s, the control plane's own module, through
# testenv/kubernetes.sh), the pod sandbox image from that release's own pause.c, and a
# small workload image of Debian's busybox-static for the tier's test pods. The images
# are OCI archives (tools/oci_image.py) that gpuheal/sim/realnode.py imports into
# the node's containerd: no registry is involved.
#
# Output: $GPUHEAL_NODE_DIR (default .cache/node at the repo root):
#   bin/kubelet  images/pause.tar  images/workload.tar  images.txt  stamp
# The stamp is a hash of testenv/node/, testenv/k8s/, testenv/kubernetes.sh,
# tools/oci_image.py, the Go version and busybox's; a build runs only when it changes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
testenv="$(cd "$here/.." && pwd)"
root="$(cd "$testenv/.." && pwd)"
out="${GPUHEAL_NODE_DIR:-$root/.cache/node}"
busybox=/bin/busybox  # Debian's busybox-static: one static binary, every applet

for tool in gcc go "$busybox"; do
  command -v "$tool" >/dev/null || { echo "node: $tool missing: run \`make node\`" >&2; exit 1; }
done
if [[ "$(ldd "$busybox" 2>&1 || true)" != *"not a dynamic executable"* ]]; then
  echo "node: $busybox is not static (Debian's busybox, not busybox-static): run \`make node\`" >&2
  exit 1
fi
stamp="$( (cd "$root" && find testenv/node testenv/k8s testenv/kubernetes.sh tools/oci_image.py -type f ! -name '*.md' -print0 | sort -z \
            | xargs -0 sha256sum; go version; sha256sum "$busybox") | sha256sum | cut -d' ' -f1)"
if [[ -f "$out/stamp" && "$(cat "$out/stamp")" == "$stamp" && "${1:-}" != "--force" ]]; then
  exit 0
fi

echo "node: building the kubelet and the node's images into $out" >&2
start=$(date +%s)
rm -rf "$out.new"
mkdir -p "$out.new/bin" "$out.new/images"

# shellcheck source=../kubernetes.sh
source "$testenv/kubernetes.sh"
build_kubernetes_commands "$testenv/k8s" "$out.new/bin" k8s.io/kubernetes/cmd/kubelet

release="$(cd "$testenv/k8s" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
k8s_src="$(cd "$testenv/k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The sandbox image: the release's build/pause/linux/pause.c, static, as its Makefile
# builds it (-Os -Wall -Werror -static, the version as VERSION).
mkdir -p "$work/pause"
gcc -Os -Wall -Werror -static -DVERSION="\"$release\"" -o "$work/pause/pause" \
  "$k8s_src/build/pause/linux/pause.c"
strip "$work/pause/pause"
python3 "$root/tools/oci_image.py" --root "$work/pause" --name "gpuheal.dev/pause:$release" \
  --out "$out.new/images/pause.tar" --cmd /pause >>"$out.new/images.txt"

# The workload image: busybox and a link per applet, a shell and coreutils for test pods.
mkdir -p "$work/workload/bin"
cp "$busybox" "$work/workload/bin/busybox"
for applet in $("$busybox" --list); do
  [[ "$applet" == busybox ]] || ln -s busybox "$work/workload/bin/$applet"
done
mkdir -p "$work/workload/tmp" && chmod 1777 "$work/workload/tmp"
python3 "$root/tools/oci_image.py" --root "$work/workload" --name "gpuheal.dev/workload:1" \
  --out "$out.new/images/workload.tar" --cmd sh --env PATH=/bin >>"$out.new/images.txt"

rm -rf "$out"
mv "$out.new" "$out"
echo "$stamp" > "$out/stamp"
echo "node: built in $(( $(date +%s) - start ))s; $(du -sh "$out" | cut -f1) in $out" >&2
