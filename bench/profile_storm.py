"""Profile: where the API server's CPU goes in a storm of faults.

A control plane with --nodes fake GPU nodes (8 one-GPU pods each) and a real
controller with its throttles lifted (as bench/quarantine.py's storms). While
every node reports a fault at once and the controller quarantines and drains
them, the API server's own CPU profiler (/debug/pprof/profile) samples for
--seconds; the profile is kept in bench/results/profile-apiserver-storm.pb.gz
and its top functions (`go tool pprof -top`) in ...-top.txt.

    .venv/bin/python bench/profile_storm.py --nodes 200 --seconds 15
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import quarantine as q
from common import RESULTS, build_fleet, cpu_seconds, wait_settled

from gpuheal.kube.api import KubeApi
from gpuheal.sim import ControlPlane, ControlPlaneConfig, audit
from gpuheal.sim.controller import install_crds
from gpuheal.sim.controlplane import KUBE_APISERVER
from gpuheal.sim.workloads import create_namespace


async def storm(cp: ControlPlane, workdir: Path, nodes: list[str], seconds: int) -> bytes:
    api = KubeApi.from_kubeconfig(cp.kubeconfig, timeout_s=seconds + 30)
    watcher = q.Watcher(api)
    await watcher.start()
    controller = q.start_controller(
        cp, workdir, "lifted", None, rateLimitPerSecond=100_000, rateLimitBurst=100_000
    )
    try:
        profile = asyncio.ensure_future(api.get("/debug/pprof/profile", {"seconds": str(seconds)}))
        await asyncio.sleep(0.5)
        apiserver = cp.components[KUBE_APISERVER].pid or 0
        before = cpu_seconds(apiserver)
        await asyncio.gather(*(q.report_fault(api, n, f"prof-{n}") for n in nodes))
        await watcher.until("handled", lambda: all(n in watcher.handled for n in nodes), 600)
        print(
            f"storm of {len(nodes)}: API server {cpu_seconds(apiserver) - before:.1f} s CPU",
            file=sys.stderr,
        )
        return await profile
    finally:
        controller.stop()
        await watcher.stop()
        await api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--seconds", type=int, default=15)
    args = parser.parse_args()
    config = ControlPlaneConfig(
        scheduler=False,
        controller_manager=False,
        audit_users=[q.USER],
        extra_args={KUBE_APISERVER: ["--profiling=true"]},  # the test plane has it off
    )
    with ControlPlane(config) as cp, tempfile.TemporaryDirectory() as tmp:
        client = cp.client()
        install_crds(client)
        audit.grant_cluster_admin(client, q.USER)
        create_namespace(client, "gpuheal-system")
        create_namespace(client, "work")
        nodes = build_fleet(cp, "p", args.nodes, pods_per_node=q.PODS_PER_NODE, labels=q.POOL)
        wait_settled(cp)
        raw = asyncio.run(storm(cp, Path(tmp), nodes, args.seconds))
    RESULTS.mkdir(parents=True, exist_ok=True)
    kept = RESULTS / "profile-apiserver-storm.pb.gz"
    kept.write_bytes(raw)
    go = shutil.which("go")
    if go is None:
        print(f"profile in {kept}; `go` is needed for the summary", file=sys.stderr)
        return 1
    top = "\n".join(
        subprocess.run(
            [go, "tool", "pprof", "-top", *order, "-nodecount=40", str(kept)],
            capture_output=True, text=True, check=True,
        ).stdout
        for order in ([], ["-cum"])
    )  # fmt: skip
    (RESULTS / "profile-apiserver-storm-top.txt").write_text(top)
    print(top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
