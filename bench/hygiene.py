"""Benchmark: one run of the controller's hygiene loop over a large fleet's caches.

The loop (gpuheal/controller/hygiene.py) runs `gpuheal audit`'s checks over what
the informers hold, every `hygiene.intervalSeconds` (60 by default), on every
replica, in the event loop's thread: its run time is time no reconcile runs. This
builds --nodes NodeViews and --pods-per-node PodViews each (8 GPU pods and a
device-plugin pod per node, as gpu-operator's fleets run), with a few findings
seeded (a skewed driver, dropped allocatable, a node without its device plugin,
a zombie GPU process), and times `HygieneLoop.examine_once` --runs times:

- median and max run time, and what share of the default interval that is;
- the findings found (the seeded ones: the examination is not a no-op).

No control plane: the loop reads only the caches, so nothing else is in play.

    .venv/bin/python bench/hygiene.py --nodes 1000 5000
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import emit

# The real-shaped node names are the tests' (tests/ is not installed): the checkout's root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuheal.clock import iso
from gpuheal.config import Config
from gpuheal.controller.hygiene import HygieneLoop
from gpuheal.model import DRIVER_VERSION, GPU_PROCESSES, Condition, NodeView, PodView
from tests.corpus import eks_node_names
from tests.port import Port

NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.UTC)
READY = (Condition("Ready", "True", last_transition_time=iso(NOW - dt.timedelta(days=3))),)


def fleet(count: int, per_node: int) -> tuple[dict[str, NodeView], dict[str, PodView]]:
    nodes: dict[str, NodeView] = {}
    pods: dict[str, PodView] = {}
    names = [n for _ in range(0, count, 250) for n in eks_node_names(250)][:count]
    for i, name in enumerate(names):
        driver = "535.104.05" if i % 97 == 0 else "550.54.15"
        offered = 7 if i % 89 == 0 else 8
        annotations = {DRIVER_VERSION: driver}
        if i % 83 == 0:
            annotations[GPU_PROCESSES] = "4242@0b9d6c1e-2f3a-4b5c-8d7e-6f5a4b3c2d1e"
        nodes[name] = NodeView(
            name=name,
            resource_version=str(i),
            labels={
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": "8",
                "gpuheal.io/pool": f"h100-{i % 8}",
                "topology.kubernetes.io/zone": "us-west-2a",
            },
            annotations=annotations,
            conditions=READY,
            gpus=8,
            capacity=(("nvidia.com/gpu", 8),),
            allocatable=(("nvidia.com/gpu", offered),),
        )
        if i % 79 != 0:
            plugin = PodView(
                "gpu-operator", f"nvidia-device-plugin-daemonset-{i}", f"dp-{i}", name,
                "Running", daemonset=True, device_plugin=True,
            )  # fmt: skip
            pods[plugin.key] = plugin
        for j in range(per_node):
            pod = PodView(
                "ml-train", f"trainer-{i}-{j}", f"u-{i}-{j}", name, "Running",
                gpu=True, gpu_count=1 if j < 7 else 0,
            )  # fmt: skip
            pods[pod.key] = pod
    return nodes, pods


def measure(count: int, per_node: int, runs: int) -> dict[str, Any]:
    nodes, pods = fleet(count, per_node)
    by_node: dict[str, set[str]] = {}
    for key, pod in pods.items():
        by_node.setdefault(pod.node, set()).add(key)
    loop = HygieneLoop(
        Config,
        nodes=nodes.values,
        pod=pods.get,
        pods_by_node=by_node,
        records=lambda: (),
        port=Port(),
        clock=lambda: NOW,
    )
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        seen = loop.examine_once()
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    return {
        "nodes": count,
        "pods": len(pods),
        "runs": runs,
        "median_ms": round(median * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
        "share_of_default_interval": round(median / Config().hygiene.interval_seconds, 5),
        "findings": seen.counts(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--pods-per-node", type=int, default=8)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    results = [measure(n, args.pods_per_node, args.runs) for n in args.nodes]
    lines = [
        f"{r['nodes']} nodes, {r['pods']} pods: {r['median_ms']} ms median, "
        f"{r['max_ms']} ms max ({r['share_of_default_interval']:.3%} of a 60 s interval); "
        f"findings {r['findings']}"
        for r in results
    ]
    emit("hygiene", {"results": results}, "\n".join(lines))


if __name__ == "__main__":
    main()
