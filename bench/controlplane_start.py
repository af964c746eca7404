"""Benchmark: how long the local control plane takes to start, and its disk cost.

Starts the full control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, kwok) N times, cold processes each time, and reports
the median and spread of the time until every component is ready, plus the
size of the built binaries. Prints JSON on stdout and a summary on stderr.

    .venv/bin/python bench/controlplane_start.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

from common import emit

from gpuheal.sim import ControlPlane
from gpuheal.sim.binaries import default_binaries


def _version(binary: str, *args: str) -> str:
    out = subprocess.run([binary, *args], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).strip().splitlines()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    binaries = default_binaries()
    seconds = []
    for _ in range(args.runs):
        begin = time.monotonic()
        with ControlPlane() as cp:
            seconds.append(cp.started_in_s or time.monotonic() - begin)

    sizes = {p.name: p.stat().st_size for p in sorted(binaries.directory.iterdir()) if p.is_file()}
    result = {
        "benchmark": "controlplane_start",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "runs": args.runs,
        "start_seconds": [round(s, 3) for s in seconds],
        "start_seconds_median": round(statistics.median(seconds), 3),
        "start_seconds_min": round(min(seconds), 3),
        "start_seconds_max": round(max(seconds), 3),
        "binary_bytes": sizes,
        "binary_bytes_total": sum(sizes.values()),
        "versions": {
            "kube-apiserver": _version(str(binaries.kube_apiserver), "--version"),
            "etcd": _version(str(binaries.etcd), "--version"),
            "kwok": _version(str(binaries.kwok), "--version"),
        },
    }
    emit(
        "controlplane_start",
        result,
        f"control plane start: median {result['start_seconds_median']}s "
        f"(min {result['start_seconds_min']}s, max {result['start_seconds_max']}s, "
        f"{args.runs} runs); binaries {result['binary_bytes_total'] / 2**20:.0f} MiB",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
