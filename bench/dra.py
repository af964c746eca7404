"""Benchmark: what DRA-native GPU nodes cost the controller.

Two fleets of the same size, each on its own local control plane, and a cold
`gpuheal controller` started on each (--starts times; ready is the median):

- device plugins: N nodes with `nvidia.com/gpu: 8`, half their GPUs held by
  one-GPU pods (4 per node);
- DRA: N DRA-only nodes (no `nvidia.com/gpu`), NVIDIA's DRA driver's DeviceClasses
  and one ResourceSlice per node with 8 GPU devices (sim/dra.py), and half the
  devices held: 4 pods per node, each with a ResourceClaim allocated one device
  (the allocation written as the scheduler writes it, through the status
  subresource: 4 N claims scheduled one by one would measure the scheduler).

Measured for each: ready (start → /readyz 200 and leading: every cache synced,
slices and claims included), RSS 5 s after ready, and that the controller counts
the DRA fleet's GPUs (8 N) in gpuheal_dra_gpus. The goal: DRA's ready time and memory
at most 1.3 times the device-plugin fleet's.

    .venv/bin/python bench/dra.py --nodes 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import audited_cluster, build_fleet, emit, rss_mib, wait_settled

from gpuheal.kube.api import RESOURCE_API, ApiError, KubeApi
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import gpu_spec
from gpuheal.sim.bulk import create_all, create_new, write_each
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.dra import DRIVER, claim_pod, device_classes, dra_node, gpu_claim, resource_slice

USER = "gpuheal-controller"
NAMESPACE = "work"
HELD = 4  # of each node's 8 GPUs


def start(cp: ControlPlane, workdir: Path, identity: str) -> tuple[float, float, str]:
    """Seconds to ready and leading, RSS (MiB) 5 s later, and its /metrics."""
    controller = ControllerProcess(workdir, cp.kubeconfig_for(USER), {}, identity=identity)
    started = time.monotonic()
    controller.component.start()
    controller.component.wait_ready(controller.leading, started + 900)
    ready_s = time.monotonic() - started
    time.sleep(5)
    rss = rss_mib(controller.component.pid or 0)
    with urllib.request.urlopen(f"{controller.url}/metrics", timeout=10) as answer:  # noqa: S310
        metrics = answer.read().decode()
    controller.stop()
    return ready_s, rss, metrics


def measure(cp: ControlPlane, workdir: Path, fleet: str, starts: int) -> dict[str, Any]:
    runs = [start(cp, workdir, f"{fleet}-{i}") for i in range(starts)]
    ready = [round(r[0], 2) for r in runs]
    return {
        "ready_seconds": round(statistics.median(ready), 2),
        "ready_seconds_each": ready,
        "rss_mib": round(runs[0][1], 1),
        "dra_gpus_metric": _gauge(runs[0][2], "gpuheal_dra_gpus"),
    }


def _gauge(metrics: str, name: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def device_plugin_fleet(cp: ControlPlane, nodes: int) -> None:
    build_fleet(cp, "dp", nodes, pods_per_node=HELD, namespace=NAMESPACE)


def dra_fleet(cp: ControlPlane, nodes: int) -> None:
    names = [f"dra-{i:05d}" for i in range(nodes)]
    write_each(cp.kubeconfig, device_classes(), _create(f"{RESOURCE_API}/deviceclasses"))
    create_all(cp.kubeconfig, [dra_node(n) for n in names])
    write_each(
        cp.kubeconfig,
        [resource_slice(n, gpu_spec(n)) for n in names],
        _create(f"{RESOURCE_API}/resourceslices"),
    )
    held = [(n, j) for n in names for j in range(HELD)]
    claims = f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims"
    write_each(cp.kubeconfig, held, _allocated(claims), concurrency=16)
    pods = []
    for node, j in held:
        pod = claim_pod(f"{node}-{j}", NAMESPACE, f"{node}-{j}-gpus")
        pod["spec"]["nodeName"] = node
        pods.append(pod)
    create_all(cp.kubeconfig, pods)


def _create(path: str) -> Any:
    async def write(api: KubeApi, body: dict[str, Any]) -> bool:
        return await create_new(api, path, body)

    return write


def _allocated(path: str) -> Any:
    """A claim for one GPU, then its allocation of gpu-<j> on its node, as the
    scheduler writes it."""

    async def write(api: KubeApi, item: tuple[str, int]) -> bool:
        node, j = item
        name = f"{node}-{j}-gpus"
        await create_new(api, path, gpu_claim(name, NAMESPACE))
        result = {"request": "gpus", "driver": DRIVER, "pool": node, "device": f"gpu-{j}"}
        allocation = {
            "devices": {"results": [result]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
        try:
            await api.patch(f"{path}/{name}/status", {"status": {"allocation": allocation}})
        except ApiError as err:
            raise RuntimeError(f"claim {name}: {err}") from err
        return True

    return write


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--starts", type=int, default=3)
    args = parser.parse_args()
    result: dict[str, Any] = {"benchmark": "dra", "nodes": args.nodes, "gpus": 8 * args.nodes}
    for fleet, build in (("device-plugins", device_plugin_fleet), ("dra", dra_fleet)):
        with audited_cluster(USER) as (cp, tmp):
            started = time.monotonic()
            build(cp, args.nodes)
            populate_s = time.monotonic() - started
            settle_s = wait_settled(cp)
            run = measure(cp, tmp, fleet, args.starts)
            run.update(
                populate_seconds=round(populate_s, 1), kwok_settle_seconds=round(settle_s, 1)
            )
            result[fleet] = run
            print(f"{fleet}: {run}", file=sys.stderr)
    plugins, dra = result["device-plugins"], result["dra"]
    result["ready_ratio"] = round(dra["ready_seconds"] / plugins["ready_seconds"], 2)
    result["rss_ratio"] = round(dra["rss_mib"] / plugins["rss_mib"], 2)
    summary = (
        f"{args.nodes} nodes, {HELD * args.nodes} GPU pods: device plugins ready "
        f"{plugins['ready_seconds']} s, RSS {plugins['rss_mib']} MiB; DRA ({args.nodes} "
        f"slices, {HELD * args.nodes} allocated claims) ready {dra['ready_seconds']} s, "
        f"RSS {dra['rss_mib']} MiB: {result['ready_ratio']}x and {result['rss_ratio']}x "
        "(goal at most 1.3x)"
    )
    emit("dra", result, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
