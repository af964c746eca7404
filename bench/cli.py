"""Benchmark: the operator CLI on a large fleet.

One local control plane with --nodes fake GPU nodes (8 one-GPU pods each, bound
directly, marked Running by kwok), a few of them in maintenance, one with a
skewed driver. Each read-only command runs --runs times as a fresh process
(`python -m gpuheal.cli ...`, as an operator would run it):

- wall time from exec to exit (median and max), with the Python start included;
- peak RSS of the process.

With --baseline DIR (a checkout of the code to compare with, e.g. a throwaway
worktree at an older commit) each command also runs from DIR (PYTHONPATH),
alternately with this tree's, on the same fleet: a before/after under the same
load on shared cores.

    .venv/bin/python bench/cli.py --nodes 1000
    git worktree add /tmp/base main && .venv/bin/python bench/cli.py --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import build_fleet, commit_of, emit, wait_settled
from lightkube.resources.core_v1 import Node

from gpuheal.model import DRIVER_VERSION, STATE_LABEL, STATE_MAINTENANCE
from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.controller import install_crds
from gpuheal.sim.workloads import create_namespace

POOL = {"gpuheal.io/pool": "bench"}


def timed(argv: list[str], code: Path | None = None) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (MiB) and exit code of one run of the CLI (this
    tree's, or the checkout `code`)."""
    env = {**os.environ, "PYTHONPATH": str(code)} if code else None
    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-m", "gpuheal.cli", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=code,  # `-m` puts the working directory first on sys.path
    )
    _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
    wall = time.monotonic() - started
    return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def seed(cp: ControlPlane, names: list[str]) -> None:
    """Some state for the commands to find: maintenance, one drifted driver."""
    client = cp.client()
    for name in names:
        client.patch(Node, name, {"metadata": {"annotations": {DRIVER_VERSION: "550.54.15"}}})
    for name in names[:5]:
        client.patch(Node, name, {"metadata": {"labels": {STATE_LABEL: STATE_MAINTENANCE}}})
    client.patch(Node, names[-1], {"metadata": {"annotations": {DRIVER_VERSION: "535.1"}}})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--baseline", type=Path, help="a checkout to compare with, run alternately on one fleet"
    )
    args = parser.parse_args()
    if args.baseline and not (args.baseline / "gpuheal" / "cli.py").exists():
        parser.error(f"--baseline {args.baseline}: not a checkout of gpuheal")
    config = ControlPlaneConfig(scheduler=False, controller_manager=False)
    results: dict[str, Any] = {"benchmark": "cli", "nodes": args.nodes, "pods": args.nodes * 8}
    with ControlPlane(config) as cp:
        client = cp.client()
        install_crds(client)
        create_namespace(client, "work")
        names = build_fleet(cp, "cli", args.nodes, labels=POOL)
        wait_settled(cp)  # kwok done marking pods Running: it shares the cores
        seed(cp, names)
        common = ["--kubeconfig", str(cp.kubeconfig), "-o", "json"]
        commands = {
            "status": ["status", *common],
            "audit": ["audit", *common],
            "doctor": ["doctor", names[0], *common],
            "gate": ["gate", names[1], *common],
        }
        versions: dict[str, Path | None] = {"": None}
        if args.baseline:
            versions[" (baseline)"] = args.baseline.resolve()
            results["baseline"] = f"{args.baseline} at {commit_of(args.baseline)}"
        for name, argv in commands.items():
            runs: dict[str, list[tuple[float, float, int]]] = {v: [] for v in versions}
            for _ in range(args.runs):
                for version, code in versions.items():
                    runs[version].append(timed(argv, code))
            for version, measured in runs.items():
                walls = [w for w, _, _ in measured]
                results[name + version] = {
                    "wall_seconds_median": round(statistics.median(walls), 3),
                    "wall_seconds_max": round(max(walls), 3),
                    "peak_rss_mib": round(max(r for _, r, _ in measured), 1),
                    "exit_codes": sorted({c for _, _, c in measured}),
                }
    summary = "\n".join(
        f"{name}: {r['wall_seconds_median']} s median ({r['wall_seconds_max']} s max), "
        f"peak RSS {r['peak_rss_mib']} MiB, exit {r['exit_codes']}"
        for name, r in results.items()
        if isinstance(r, dict)
    )
    emit("cli", results, f"{args.nodes} nodes / {args.nodes * 8} pods\n{summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
