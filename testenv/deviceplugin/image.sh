#!/usr/bin/env bash
# The device plugin's image for the node tier (tests/node): NVIDIA's plugin binary
# (testenv/deviceplugin/build.sh) on the Debian base of gpuheal's own image
# (deploy/docker/build.sh, `make image`), an OCI archive the real node imports. The base
# layer is byte for byte gpuheal's, so the runtime stores it once. No NVML inside: the
# pod mounts the stand-in where the NVIDIA container runtime would inject the driver's.
#
# Output: $GPUHEAL_DEVICEPLUGIN_DIR (default .cache/deviceplugin): image.tar image.txt
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${GPUHEAL_DEVICEPLUGIN_DIR:-$root/.cache/deviceplugin}"
image_dir="${GPUHEAL_IMAGE_DIR:-$root/.cache/image}"
python="${PYTHON:-$root/.venv/bin/python}"

[[ -x "$out/bin/nvidia-device-plugin" ]] || { echo "deviceplugin: not built: run testenv/deviceplugin/build.sh (make node)" >&2; exit 1; }
[[ -f "$image_dir/base" && -d "$(cat "$image_dir/base")" ]] || { echo "deviceplugin: gpuheal's image base missing: run make image" >&2; exit 1; }
base="$(cat "$image_dir/base")"
version="$(awk '{print $1; exit}' "$out/version")"
stamp="$( (sha256sum "$out/bin/nvidia-device-plugin" "$here/image.sh"; echo "$base") | sha256sum | cut -d' ' -f1)"
if [[ -f "$out/image.stamp" && "$(cat "$out/image.stamp")" == "$stamp" ]]; then
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/plugin/usr/bin"
cp "$out/bin/nvidia-device-plugin" "$work/plugin/usr/bin/"
SOURCE_DATE_EPOCH=0 "$python" "$root/tools/oci_image.py" --root "$base" --root "$work/plugin" \
  --name "gpuheal.dev/nvidia-device-plugin:$version" --out "$out/image.tar" \
  --entrypoint nvidia-device-plugin --env PATH=/usr/bin:/bin > "$out/image.txt"
echo "$stamp" > "$out/image.stamp"
echo "deviceplugin: $(cat "$out/image.txt")" >&2
