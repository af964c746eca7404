"""Benchmark: what a roll-out driven by the controller costs the API server.

A GPURollout is driven by the leader (gpuheal/controller/rollouts.py): each pass
of a roll-out in progress reads the object and the GPU nodes, then writes what
changed. This measures it on a local control plane with a real `gpuheal
controller` (its defaults: rollouts.pollSeconds 5), a fleet of --fleet GPU nodes
(EKS names, 8 one-GPU pods each) of which --pool form the pool rolled, and the
operator's tooling played by this script (it reports the new driver on each node
the roll-out has drained, as gpu-operator's driver container would):

- the roll-out, created with `gpuheal rollout start --no-wait` (canary 1, then
  batches of --batch, never more out than that; --force, as the pods are bare
  ones, which a drain otherwise leaves): wall time to Completed, and
  every request the controller's user made meanwhile (the apiserver's audit log,
  leases apart), in all, per node and by verb and resource;
- idle: --idle seconds with the roll-out Completed, then as long again with none,
  the controller's requests (leases apart): what roll-outs cost a fleet that
  runs none (the informers' caches decide, so nothing is expected).

    .venv/bin/python bench/rollout.py --fleet 500 --pool 40 --batch 4 --idle 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from common import audited_cluster, emit

# The real-shaped node names are the tests' (tests/ is not installed): the checkout's root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuheal.kube.api import KubeApi, node_path
from gpuheal.model import DRIVER_VERSION
from gpuheal.policy.rollout import rollout_name
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.bulk import create_all
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.nodes import gpu_node
from gpuheal.sim.resources import GPURollout
from gpuheal.sim.workloads import gpu_pod
from tests.corpus import eks_node_names

USER = "gpuheal-controller"
FLEET = {"bench/fleet": "rollout"}
POOL_LABEL = "bench/pool"
ROLLED, OTHER = "h100-rolled", "h100-other"
OLD, NEW = "550.54.15", "560.35.03"
PODS_PER_NODE = 8
ROLLOUTS = "/apis/gpuheal.io/v1alpha1/gpurollouts"


def fleet(cp: ControlPlane, size: int, pool: int) -> list[str]:
    """`size` GPU nodes, the first `pool` of them in the pool rolled; 8 GPU pods
    each. Returns the rolled pool's names."""
    names = [n for _ in range(0, size, 250) for n in eks_node_names(250)][:size]
    create_all(
        cp.kubeconfig,
        [
            gpu_node(
                name,
                labels={**FLEET, POOL_LABEL: ROLLED if i < pool else OTHER},
                annotations={DRIVER_VERSION: OLD},
            )
            for i, name in enumerate(names)
        ],
    )
    create_all(
        cp.kubeconfig,
        [
            gpu_pod(f"train-{i:04d}-{j}", "work", node_name=name)
            for i, name in enumerate(names[:pool])
            for j in range(PODS_PER_NODE)
        ],
    )
    return sorted(names[:pool])


async def tooling(cp: ControlPlane, timeout_s: float) -> dict[str, Any]:
    """The driver container: the new version on each node waiting for it; the
    roll-out's status when it ends (Completed, Failed or Aborted), or as it is
    after `timeout_s`. Each change of the steps' tally goes to stderr."""
    api = KubeApi.from_kubeconfig(cp.kubeconfig)
    changed: set[str] = set()
    deadline = time.monotonic() + timeout_s
    said = ""
    try:
        while True:
            raw = await api.get(f"{ROLLOUTS}/{rollout_name(ROLLED)}")
            status: dict[str, Any] = json.loads(raw).get("status") or {}
            tally = Counter(entry["step"] for entry in status.get("nodes", []))
            now = f"{status.get('phase')}: {dict(sorted(tally.items()))}"
            if now != said:
                print(f"  {time.strftime('%H:%M:%S')} {now}", file=sys.stderr)
                said = now
            if time.monotonic() > deadline:
                return status
            for entry in status.get("nodes", []):
                name = entry["name"]
                if entry["step"] == "waiting-for-change" and name not in changed:
                    patch = {"metadata": {"annotations": {DRIVER_VERSION: NEW}}}
                    await api.patch(f"{node_path()}/{name}", patch)
                    changed.add(name)
            if status.get("phase") in ("Completed", "Failed", "Aborted"):
                return status
            await asyncio.sleep(0.5)
    finally:
        await api.close()


def start_rollout(cp: ControlPlane, config: Path, batch: int) -> None:
    """`gpuheal rollout start` as an operator types it, returning once it is written."""
    gpuheal = Path(sys.executable).parent / "gpuheal"
    done = subprocess.run(
        [str(gpuheal), "rollout", "start", ROLLED, "--config", str(config),
         "--driver-version", NEW, "--reason", "bench: driver 560", "--canary", "1",
         "--batch-size", str(batch), "--max-unavailable", str(batch), "--force", "--no-wait"],
        env={**os.environ, "KUBECONFIG": str(cp.kubeconfig)},
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"rollout start exited {done.returncode}: {done.stderr}")


def cost(cp: ControlPlane, since: int, until: int) -> dict[str, int]:
    """The controller's requests in the window, leases apart (leader election's
    renewals are the same whether or not anything rolls)."""
    found = audit.requests(cp.audit_log, user=USER, since=since, until=until)
    return audit.by_verb_and_resource(r for r in found if r.resource != "leases")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", type=int, default=500, help="GPU nodes in all")
    parser.add_argument("--pool", type=int, default=40, help="nodes of the pool rolled")
    parser.add_argument("--batch", type=int, default=4, help="nodes per batch (and the budget)")
    parser.add_argument("--idle", type=float, default=30, help="seconds of each idle window")
    parser.add_argument("--timeout", type=float, default=900, help="seconds the roll-out may take")
    args = parser.parse_args()
    if not 0 < args.pool <= args.fleet:
        parser.error("--pool must be between 1 and --fleet")
    settings = {
        "nodeSelector": FLEET,
        "pools": {"label": POOL_LABEL, "byName": {ROLLED: {"gpusPerNode": 8}}},
        "maintenance": {"checkpoint": "none"},
        "breakerMaxPercent": 100,
        "breakerMaxNodes": 100_000,
    }
    with audited_cluster(USER) as (cp, tmp):
        nodes = fleet(cp, args.fleet, args.pool)
        config_file = tmp / "gpuheal.yaml"
        config_file.write_text(yaml.safe_dump(settings))
        controller = ControllerProcess(tmp, cp.kubeconfig_for(USER), settings)
        controller.start().wait_leading()
        try:
            time.sleep(5)  # the first reconcile of the fleet: not the roll-out's
            before = audit.offset(cp.audit_log)
            started = time.monotonic()
            status: dict[str, Any] = {}
            start_rollout(cp, config_file, args.batch)
            status = asyncio.run(tooling(cp, args.timeout))
            took_s = time.monotonic() - started
            after = audit.offset(cp.audit_log)
            time.sleep(args.idle)
            idle_done = audit.offset(cp.audit_log)
            cp.client().delete(GPURollout, rollout_name(ROLLED))
            gone = audit.offset(cp.audit_log)
            time.sleep(args.idle)
            idle_none = audit.offset(cp.audit_log)
        finally:
            controller.stop()
            if status.get("phase") != "Completed":
                print(controller.log()[-4000:], file=sys.stderr)
        rollout = cost(cp, before, after)
    total = sum(rollout.values())
    result = {
        "benchmark": "rollout",
        "fleet_nodes": args.fleet,
        "pool_nodes": len(nodes),
        "batch": args.batch,
        "poll_seconds": 5,
        "phase": status.get("phase"),
        "done": status.get("done"),
        "wall_s": round(took_s, 1),
        "requests": total,
        "requests_per_node": round(total / len(nodes), 1),
        "by_verb_and_resource": rollout,
        "idle_s": args.idle,
        "idle_completed": cost(cp, after, idle_done),
        "idle_none": cost(cp, gone, idle_none),
    }
    summary = (
        f"roll-out of {len(nodes)} nodes (of {args.fleet}), batches of {args.batch}: "
        f"{result['phase']} in {result['wall_s']} s; controller requests {total} "
        f"({result['requests_per_node']} per node, leases apart)\n"
        f"  {rollout}\n"
        f"  idle {args.idle:.0f} s after Completed: {result['idle_completed'] or 'none'}; "
        f"with no roll-out: {result['idle_none'] or 'none'}"
    )
    emit("rollout", result, summary)
    return 0 if status.get("phase") == "Completed" else 1


if __name__ == "__main__":
    sys.exit(main())
