#!/usr/bin/env bash
# Builds the real node-problem-detector (k8s.io/node-problem-detector, pinned in
# testenv/npd/go.mod and go.sum) from the Go module proxy, for the tests of the NPD
# monitor config the chart ships (deploy/npd/): its system log monitor over a log
# file and its Kubernetes exporter, nothing else.
#
# Output: $GPUHEAL_TESTENV_DIR/bin/node-problem-detector (default .cache/testenv at the
# repo root, beside the control plane) and $GPUHEAL_TESTENV_DIR/npd.stamp. The stamp is
# a hash of testenv/npd/ and the Go version, its own (testenv/build.sh leaves npd/ out
# of its stamp, so a change here never rebuilds Kubernetes); a control-plane rebuild
# replaces bin/, and a missing binary is built again whatever the stamp says.
#
# Build tags, as NPD's Makefile and cmd/nodeproblemdetector name them: journald is
# opt-in (tag `journald`, cgo and libsystemd) and left out; the custom plugin monitor,
# the system stats monitor and the Stackdriver exporter are compiled out. What is left
# reads only the log file its config names (the filelog watcher; the kmsg watcher is
# always compiled in, used only by a config that says `"plugin": "kmsg"`).
#
# Re-locking after a version change: cd testenv/npd && GONOSUMDB=k8s.io/node-problem-detector
# go mod tidy (the checksum database does not answer for this module; go.sum pins its
# hash, so a build from go.sum needs no GONOSUMDB).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${GPUHEAL_TESTENV_DIR:-$root/.cache/testenv}"
binary="$out/bin/node-problem-detector"

npd_version="v0.8.20"  # keep in step with go.mod

stamp="$( (cd "$here" && find . -type f ! -name '*.md' -print0 | sort -z | xargs -0 sha256sum; go version) | sha256sum | cut -d' ' -f1)"
if [[ -x "$binary" && -f "$out/npd.stamp" && "$(cat "$out/npd.stamp")" == "$stamp" && "${1:-}" != "--force" ]]; then
  exit 0
fi

echo "npd: building node-problem-detector $npd_version into $out/bin" >&2
start=$(date +%s)
mkdir -p "$out/bin"
rm -f "$out/npd.stamp" "$binary.new"
(
  cd "$here"
  CGO_ENABLED=0 go build -trimpath \
    -tags "disable_custom_plugin_monitor disable_system_stats_monitor disable_stackdriver_exporter" \
    -ldflags "-s -w -X k8s.io/node-problem-detector/pkg/version.version=$npd_version" \
    -o "$binary.new" k8s.io/node-problem-detector/cmd/nodeproblemdetector
)
mv "$binary.new" "$binary"
echo "$stamp" > "$out/npd.stamp"
echo "npd: built in $(( $(date +%s) - start ))s" >&2
