"""Benchmark: the cost of one node's plan (gpuheal/policy/plan/), pure CPU.

Two states of a real-shaped EKS node with 8 GPU pods: a new P0 fault (first
sight: the record, the fence, the drain) and a healthy node (recover, nothing
open). Prints the median of 5 runs of --calls plans each, in microseconds.
Run it against another checkout with PYTHONPATH=<checkout> to compare.

    .venv/bin/python bench/plan.py [--calls 5000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time

from gpuheal.config import Config
from gpuheal.model import FAULT_ID, STATUS, Condition, NodeView, PodView
from gpuheal.policy.actions import NodeState
from gpuheal.policy.plan import plan

NODE = "ip-10-0-12-34.us-west-2.compute.internal"
NOW = dt.datetime(2026, 12, 8, tzinfo=dt.UTC)


def states() -> dict[str, NodeState]:
    pods = tuple(
        PodView("ml", f"train-{i}", f"uid-{i}", NODE, "Running", gpu=True) for i in range(8)
    )
    faulty = NodeView(
        name=NODE,
        resource_version="1",
        gpus=8,
        conditions=(Condition("Ready", "True"),),
        annotations={STATUS: "faulty", FAULT_ID: f"{NODE}-20261208T000000Z-abcdef"},
    )
    healthy = NodeView(name=NODE, resource_version="1", gpus=8)
    return {
        "new fault": NodeState(faulty, pods, (), gpu_nodes=1000, quarantined=frozenset()),
        "healthy": NodeState(healthy, pods, (), gpu_nodes=1000, quarantined=frozenset()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    calls = parser.parse_args().calls
    config = Config()
    for label, state in states().items():
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(calls):
                plan(state, config, NOW)
            runs.append((time.perf_counter() - started) / calls * 1e6)
        print(f"{label}: {statistics.median(runs):.1f} us per plan (median of 5 x {calls})")


if __name__ == "__main__":
    main()
