#!/usr/bin/env bash
# Builds the gpuheal image without docker and without a registry: the same content as
# deploy/docker/Dockerfile (Python 3.11 on Debian bookworm, the wheels of
# requirements.lock checked against its hashes, gpuheal, user 65532, `gpuheal` as the
# entrypoint), as an OCI archive that `ctr images import`, `docker load` or
# `skopeo copy oci-archive:` take. The Dockerfile stays for those who build with a
# registry at hand; this recipe is what the node tier runs (tests/node) and what a
# machine that reaches only Debian's mirror and PyPI can build.
#
#   deploy/docker/build.sh [OUT_DIR]     (default .cache/image)
#
# Two layers: the base (Debian's python3 by mmdebstrap from the machine's own apt
# sources, and the locked wheels; cached under ${XDG_CACHE_HOME:-~/.cache}/gpuheal by a
# hash of the lock and this script, so only a change to them rebuilds it) and gpuheal's
# own wheel. Reproducible for one state of the mirror: SOURCE_DATE_EPOCH=0, sorted
# entries, no build times. Needs root (mmdebstrap's root mode), mmdebstrap and a
# Python 3.11 with a current pip ($PYTHON, default .venv/bin/python; the wheels are
# cp311, as Debian's python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/.cache/image}"
python="${PYTHON:-$root/.venv/bin/python}"  # make image: the virtualenv's (a current pip)
sources=/etc/apt/sources.list.d/debian.sources
[[ -f "$sources" ]] || sources=/etc/apt/sources.list
site=usr/local/lib/python3.11/dist-packages  # on Debian's python3's sys.path
export SOURCE_DATE_EPOCH=0

command -v mmdebstrap >/dev/null || { echo "image: mmdebstrap missing (Debian: apt-get install mmdebstrap; make image)" >&2; exit 1; }
"$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || { echo "image: $python is not Python 3.11 (the wheels must match Debian bookworm's python3)" >&2; exit 1; }

version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml")"
# Of the files' content, not their paths: every clone of the repository shares one base.
base_stamp="$( (cat "$here/requirements.lock" "$here/build.sh"; echo bookworm) | sha256sum | cut -c1-16)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gpuheal/image-base-$base_stamp"
stamp="$( (cd "$root" && git ls-files -z gpuheal pyproject.toml README.md | xargs -0 sha256sum; echo "$base_stamp") | sha256sum | cut -d' ' -f1)"
if [[ -f "$out/stamp" && "$(cat "$out/stamp")" == "$stamp" && "${2:-}" != "--force" ]]; then
  exit 0
fi
start=$(date +%s)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [[ ! -d "$cache" ]]; then
  echo "image: building the base (Debian bookworm's python3 and the locked wheels) into $cache" >&2
  mmdebstrap --quiet --variant=essential --include=python3 --mode=root --format=directory \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$work/base" "$sources"
  # The runtime mounts /dev, /proc and /sys; the mirror's lists are not the image's.
  rm -rf "$work/base/dev/"* "$work/base/var/lib/apt/lists/"* "$work/base/var/cache/"* \
    "$work/base/var/log/"*
  "$python" -m pip wheel --quiet --no-cache-dir --require-hashes --wheel-dir "$work/wheels" \
    -r "$here/requirements.lock"
  "$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$work/base/$site" \
    "$work/wheels/"*.whl
  mkdir -p "$(dirname "$cache")"
  rm -rf "$(dirname "$cache")"/image-base-*  # an older lock's base: one is kept
  mv "$work/base" "$cache.new" && mv "$cache.new" "$cache"
fi

# gpuheal's own layer: its wheel, and the entrypoint Debian's python3 runs.
"$python" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$work/app-wheel" "$root" \
  2>/dev/null || "$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/app-wheel" "$root"
"$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$work/app/$site" \
  "$work/app-wheel/"*.whl
# pip records where the wheel lay (a temporary path): not the image's content.
rm -rf "$work/app/$site/bin" "$work/app/$site/"*.dist-info/direct_url.json
sed -i '/direct_url\.json/d' "$work/app/$site/"*.dist-info/RECORD
mkdir -p "$work/app/usr/local/bin"
cat > "$work/app/usr/local/bin/gpuheal" <<'PY'
#!/usr/bin/python3
import sys

from gpuheal.cli import main

sys.exit(main())
PY
chmod 755 "$work/app/usr/local/bin/gpuheal"

mkdir -p "$out.new"
"$python" "$root/tools/oci_image.py" --root "$cache" --root "$work/app" \
  --name "gpuheal.dev/gpuheal:$version" --out "$out.new/gpuheal.tar" \
  --entrypoint gpuheal --cmd=--help --user 65532:65532 \
  --env PATH=/usr/local/bin:/usr/bin:/bin PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
  > "$out.new/image.txt"
rm -rf "$out" && mv "$out.new" "$out"
echo "$cache" > "$out/base"  # the base layer's files: testenv/deviceplugin/image.sh builds on it
echo "$stamp" > "$out/stamp"
echo "image: $(cat "$out/image.txt") in $(( $(date +%s) - start ))s" >&2
