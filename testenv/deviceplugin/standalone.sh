#!/usr/bin/env bash
# Runs NVIDIA's device plugin (built by build.sh) over the NVML stand-in (testenv/nvml)
# on a machine without a GPU, against fake-kubelet, and checks what it streams:
#   1. the 8 GPUs of a fake H100 node, all Healthy;
#   2. what a pod of 2 GPUs would get (GetPreferredAllocation, then Allocate);
#   3. after the spec gains an Xid (default 79) on one GPU (default 2), more than one
#      5 s event wait of the plugin's health checker later, that GPU Unhealthy and the
#      other 7 Healthy.
#
# Usage (as root: it needs a mount namespace): testenv/deviceplugin/standalone.sh [XID [GPU]]
# (not an Xid the plugin ignores: 13, 31, 43, 45, 68 or 109, nor one DP_DISABLE_HEALTHCHECKS
# names).
#
# The plugin insists on /var/lib/kubelet/device-plugins/ (its own socket's directory is a
# constant of the kubelet's API). The machine's /var/lib/kubelet is never written: both
# processes run in a private mount namespace where a scratch directory is bind-mounted
# over it. When /var/lib/kubelet does not exist, the empty directory the bind mount needs
# is made and removed again afterwards.
#
# Output: the plugin's log, fake-kubelet's log and the ListAndWatch stream (JSON lines)
# under a scratch directory ($GPUHEAL_DEVICEPLUGIN_WORK, or a new one under /tmp), whose
# path it prints; exit 0 when both steps were seen.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
xid="${1:-79}"
gpu="${2:-2}"
gpus=8

"$root/testenv/nvml/build.sh"
"$here/build.sh"
nvml="${GPUHEAL_NVML_DIR:-$root/.cache/nvml}"
dp="${GPUHEAL_DEVICEPLUGIN_DIR:-$root/.cache/deviceplugin}"

work="${GPUHEAL_DEVICEPLUGIN_WORK:-$(mktemp -d /tmp/gpuheal-deviceplugin.XXXXXX)}"
mkdir -p "$work/kubelet/device-plugins"
spec="$work/nvml-spec.yaml"

# The spec of gpuheal/sim/agent.py's gpu_spec(): a healthy 8-GPU H100 node; with an
# argument, also one Xid event (on GPU $gpu) for event sets registered for Xids.
write_spec() {
  {
    echo 'driverVersion: "550.54.15"'
    echo 'devices:'
    for ((i = 0; i < gpus; i++)); do
      printf '  - uuid: GPU-5e2a9c1d-0000-4000-8000-%012d\n' "$i"
      printf '    pciBusId: "00000000:%02X:00.0"\n' $((0x18 + i))
      echo '    temperature: 41'
      echo '    eccUncorrectedVolatile: 0'
      echo '    remappedRows: {pending: false, failure: false}'
      echo '    nvlinks: 18'
    done
    if [[ -n "${1:-}" ]]; then
      echo 'xidEvents:'
      echo "  - {id: 1, device: $gpu, xid: $1}"
    fi
  } >"$spec.tmp"
  mv "$spec.tmp" "$spec"  # by rename, as the tests write it: the stand-in sees a whole file
}
write_spec
uuid="$(printf 'GPU-5e2a9c1d-0000-4000-8000-%012d' "$gpu")"

made_kubelet_dir=""
if [[ ! -e /var/lib/kubelet ]]; then
  mkdir /var/lib/kubelet
  made_kubelet_dir=1
fi
cleanup() {
  if [[ -n "$made_kubelet_dir" ]]; then rmdir /var/lib/kubelet; fi
}
trap cleanup EXIT

stream="$work/listandwatch.jsonl"
: >"$stream"
healthy() { grep -o '"health":"Healthy"' <<<"$1" | wc -l; }

# Waits (up to $2 s) for a ListAndWatch line for which `$1 LINE` succeeds.
wait_line() {
  local check="$1" deadline=$((SECONDS + $2)) line
  while ((SECONDS < deadline)); do
    while IFS= read -r line; do
      if "$check" "$line"; then echo "$line"; return 0; fi
    done <"$stream"
    sleep 0.2
  done
  return 1
}
all_healthy() { [[ "$(healthy "$1")" == "$gpus" ]]; }
one_unhealthy() {
  [[ "$(healthy "$1")" == $((gpus - 1)) && "$1" == *"{\"id\":\"$uuid\",\"health\":\"Unhealthy\"}"* ]]
}

export GPUHEAL_FAKE_NVML_SPEC="$spec" LD_LIBRARY_PATH="$nvml/lib" stream work dp
export -f write_spec wait_line healthy all_healthy one_unhealthy
export xid gpu gpus uuid spec
# shellcheck disable=SC2016  # expanded by the inner shell
unshare --mount --propagation private bash -euo pipefail -c '
  mount --bind "$work/kubelet" /var/lib/kubelet
  "$dp/bin/fake-kubelet" -allocate 2 >"$stream" 2>"$work/fake-kubelet.log" &
  kubelet=$!
  until [[ -S /var/lib/kubelet/device-plugins/kubelet.sock ]]; do sleep 0.1; done
  "$dp/bin/nvidia-device-plugin" >"$work/plugin.log" 2>&1 &
  plugin=$!
  trap "kill $plugin $kubelet 2>/dev/null; wait" EXIT
  if ! line=$(wait_line all_healthy 60); then
    echo "standalone: no list of $gpus Healthy GPUs; see $work" >&2; exit 1
  fi
  echo "standalone: listed: $line"
  sleep 6  # the health checker is inside nvmlEventSetWait_v2(5000 ms): one times out first
  grep -E "\"(preferred|allocated)\"" "$stream" | sed "s/^/standalone: /"
  write_spec "$xid"
  echo "standalone: the spec gains Xid $xid on GPU $gpu ($uuid)"
  if ! line=$(wait_line one_unhealthy 30); then
    echo "standalone: GPU $gpu never Unhealthy; see $work" >&2; exit 1
  fi
  echo "standalone: listed: $line"
'
echo "standalone: ok: $gpus GPUs Healthy, then $uuid Unhealthy after Xid $xid; logs in $work"
