#!/usr/bin/env bash
# Builds the NVML stand-in for machines without a GPU: libnvidia-ml.so.1 (nvml.c) and
# nvidia-smi (smi.c), both over the fake GPU node's spec file, with the machine's C
# compiler and libyaml (Debian's libyaml-dev; `make nvml` installs it when missing).
#
# Output: $GPUHEAL_NVML_DIR (default .cache/nvml at the repo root):
#   lib/libnvidia-ml.so.1  lib/libnvidia-ml.so  bin/nvidia-smi  stamp
# The stamp is a hash of testenv/nvml/ and the compiler's version, its own (not
# testenv/build.sh's, so a change here never rebuilds Kubernetes).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${GPUHEAL_NVML_DIR:-$root/.cache/nvml}"
cc="${CC:-gcc}"

if ! command -v "$cc" >/dev/null; then
  echo "nvml: no C compiler ($cc) on PATH; install gcc (Debian: apt-get install gcc)" >&2
  exit 1
fi
if [[ ! -f /usr/include/yaml.h ]]; then
  echo "nvml: libyaml's header is missing; install it (Debian: apt-get install libyaml-dev, or make nvml)" >&2
  exit 1
fi

stamp="$( (cd "$here" && find . -type f ! -name '*.md' -print0 | sort -z | xargs -0 sha256sum; "$cc" --version | head -1) | sha256sum | cut -d' ' -f1)"
if [[ -f "$out/stamp" && "$(cat "$out/stamp")" == "$stamp" && "${1:-}" != "--force" ]]; then
  exit 0
fi

rm -rf "$out.new"
mkdir -p "$out.new/lib" "$out.new/bin"
flags=(-std=c11 -O2 -g -Wall -Wextra -Werror -fvisibility=hidden)
# libyaml is linked statically into both: the library is dlopened by whatever process
# loads NVML, and must not depend on the loader finding libyaml-0.so.2 beside it. Its
# symbols stay inside (--exclude-libs): a process with its own libyaml (PyYAML's C
# loader) must bind neither copy to the other. It is never unloaded (-z nodelete): go-nvml
# (NVIDIA's device plugin) dlcloses it when its last user shuts NVML down and dlopens it
# again, while the program's lazily bound calls into it still hold the first mapping's
# addresses; staying loaded also keeps its state (Xid events delivered) for the process.
"$cc" "${flags[@]}" -fPIC -shared -Wl,-soname,libnvidia-ml.so.1 -Wl,--no-undefined \
  -Wl,--exclude-libs,ALL -Wl,-z,nodelete \
  -o "$out.new/lib/libnvidia-ml.so.1" "$here/nvml.c" "$here/spec.c" \
  -Wl,-Bstatic -lyaml -Wl,-Bdynamic -lpthread
ln -s libnvidia-ml.so.1 "$out.new/lib/libnvidia-ml.so"
"$cc" "${flags[@]}" -o "$out.new/bin/nvidia-smi" "$here/smi.c" "$here/spec.c" \
  -Wl,-Bstatic -lyaml -Wl,-Bdynamic
echo "$stamp" >"$out.new/stamp"
rm -rf "$out"
mv "$out.new" "$out"
echo "nvml: built the NVML stand-in into $out" >&2
