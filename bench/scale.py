"""Benchmark (first cut for the scale work): the controller started cold on a
cluster of N fake GPU nodes with P GPU pods each — time until its caches are
synced (/readyz), and its resident memory afterwards.

    .venv/bin/python bench/scale.py --nodes 1000 --pods-per-node 8
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.controller import ControllerProcess, install_crds
from gpuheal.sim.nodes import create_gpu_nodes
from gpuheal.sim.workloads import apply, create_namespace, gpu_pod


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods-per-node", type=int, default=8)
    args = parser.parse_args()
    config = ControlPlaneConfig(scheduler=False, controller_manager=False)
    with ControlPlane(config) as cp, tempfile.TemporaryDirectory() as tmp:
        client = cp.client()
        install_crds(client)
        create_namespace(client, "gpuheal-system")
        create_namespace(client, "work")
        started = time.monotonic()
        names = create_gpu_nodes(client, [f"scale-{i:05d}" for i in range(args.nodes)])
        for name in names:
            for j in range(args.pods_per_node):
                apply(client, gpu_pod(f"{name}-{j}", "work", node_name=name))
        populated = time.monotonic() - started
        started = time.monotonic()
        controller = ControllerProcess(Path(tmp), cp.kubeconfig, {}, identity="scale")
        controller.start(timeout_s=600)
        synced = time.monotonic() - started
        time.sleep(5)
        pid = controller.component.pid
        rss = rss_mib(pid) if pid else 0.0
        controller.stop()
    result = {
        "benchmark": "scale",
        "nodes": args.nodes,
        "pods": args.nodes * args.pods_per_node,
        "populate_seconds": round(populated, 1),
        "controller_ready_seconds": round(synced, 2),
        "controller_rss_mib": round(rss, 1),
    }
    json.dump(result, sys.stdout, indent=2)
    print(file=sys.stdout)
    print(
        f"{args.nodes} nodes, {result['pods']} pods: controller ready (caches synced) in "
        f"{result['controller_ready_seconds']}s, RSS {result['controller_rss_mib']} MiB",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
