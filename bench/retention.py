"""Benchmark: a 5,000-record retention cleanup against the real control plane, and
whether it holds remediation back.

A local control plane, a pool of fake GPU nodes, 5,000 closed GPUFault records of
60 days ago spread over 1,000 node names (what a fleet accumulates), and a real
`gpuheal controller`:

- baseline: retention off; faults reported one at a time on fresh nodes, the time
  from the fault annotation PATCH to the taint seen by a separate watch;
- cleanup: retention on (all 5,000 are due by age), the same faults reported while
  it deletes: the same latency, and the cleanup's duration and pace, the
  controller's reconciles and queue depth meanwhile, its requests by verb (the
  apiserver's audit log).

    .venv/bin/python bench/retention.py --records 5000 --deletes-per-second 20 200
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import audited_cluster, build_fleet, emit, percentiles_ms

from gpuheal.kube.api import KubeApi, gpufault_path, node_path
from gpuheal.model import FAULT_ID, FAULT_REASON, FAULT_TIME, STATUS, TAINT_KEY
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.records import PastFault, create_past_faults

USER = "gpuheal-controller"
POOL = {"bench/pool": "retention"}


class Taints:
    """When each node of the pool was first seen tainted, from one watch."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.seen: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        selector = ",".join(f"{k}={v}" for k, v in POOL.items())
        page = json.loads(
            await self.api.get(node_path(), {"labelSelector": selector, "limit": "1"})
        )
        params = {"labelSelector": selector, "resourceVersion": page["metadata"]["resourceVersion"]}
        self._task = asyncio.create_task(self._watch(params))

    async def _watch(self, params: dict[str, str]) -> None:
        async for line in self.api.watch(node_path(), {**params, "timeoutSeconds": "3600"}, 3600):
            event = json.loads(line)
            node = event["object"]
            taints = (node.get("spec") or {}).get("taints") or []
            if any(t["key"] == TAINT_KEY for t in taints):
                self.seen.setdefault(node["metadata"]["name"], time.perf_counter())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def report(api: KubeApi, node: str) -> float:
    now = dt.datetime.now(dt.UTC)
    annotations = {
        STATUS: "faulty",
        FAULT_ID: f"{node}-{now:%Y%m%dT%H%M%S}",
        FAULT_TIME: now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        FAULT_REASON: "XidCritical79",
    }
    sent = time.perf_counter()
    await api.patch(node_path(node), {"metadata": {"annotations": annotations}})
    return sent


async def records_left(api: KubeApi) -> int:
    """How many GPUFaults exist: one LIST of one item, and the server's remaining count."""
    page = json.loads(await api.get(gpufault_path(), {"limit": "1"}))
    return len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match[1]) if match else 0.0


async def faults_during(
    api: KubeApi, taints: Taints, nodes: list[str], spacing_s: float, busy: Any = None
) -> list[float]:
    """Report a fault on each node in turn; the seconds from each PATCH to its taint."""
    latencies = []
    for node in nodes:
        sent = await report(api, node)
        deadline = time.monotonic() + 30
        while node not in taints.seen:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node} not tainted within 30 s")
            await asyncio.sleep(0.005)
        latencies.append(taints.seen[node] - sent)
        if busy is not None and not busy():
            break
        await asyncio.sleep(spacing_s)
    return latencies


def start_controller(
    cp: ControlPlane, workdir: Path, name: str, retention: dict[str, Any]
) -> ControllerProcess:
    settings = {
        "nodeSelector": POOL,
        "mode": "quarantine",
        "breakerMaxNodes": 100_000,
        "breakerMaxPercent": 100,
        "rateLimitPerSecond": 1000,
        "rateLimitBurst": 1000,
        "retention": retention,
    }
    controller = ControllerProcess(workdir, cp.kubeconfig_for(USER), settings, identity=name)
    return controller.start().wait_leading()


def past_faults(count: int, tag: str) -> list[PastFault]:
    closed = dt.datetime.now(dt.UTC) - dt.timedelta(days=60)
    return [
        PastFault(f"ip-10-9-{i % 1000 // 250}-{i % 250}.{tag}.compute.internal", f"x-{i}", closed)
        for i in range(count)
    ]


@dataclass(frozen=True)
class Phase:
    nodes: list[str]  # where this phase's faults are reported
    records: int
    rate: float  # deletes per second
    spacing_s: float


async def cleanup(
    cp: ControlPlane, api: KubeApi, taints: Taints, workdir: Path, phase: Phase
) -> dict[str, Any]:
    nodes, records, rate, spacing_s = phase.nodes, phase.records, phase.rate, phase.spacing_s
    base = await records_left(api)  # the earlier phases' fault records stay
    started_at = time.perf_counter()
    create_past = await asyncio.to_thread(
        create_past_faults, cp.kubeconfig, past_faults(records, f"r{int(rate)}")
    )
    created_s = time.perf_counter() - started_at
    if await records_left(api) < base + records:
        raise RuntimeError("the old records were not all created")
    offset = cp.audit_log.stat().st_size
    retention = {"deletesPerSecond": rate, "intervalSeconds": 3600}
    controller = start_controller(cp, workdir, f"cleanup-{int(rate)}", retention)
    began = time.perf_counter()
    before = controller.metrics()
    left = records
    depth_max = 0.0
    done: dict[str, float] = {}

    async def watch_cleanup() -> None:
        nonlocal left, depth_max
        while True:
            ours = len([n for n in nodes if n in taints.seen])  # this phase's new faults
            left = await records_left(api) - base - ours
            depth_max = max(depth_max, metric(controller.metrics(), "gpuheal_queue_depth"))
            if left <= 0:
                done["at"] = time.perf_counter()
                return
            await asyncio.sleep(0.5)

    watcher = asyncio.create_task(watch_cleanup())
    latencies = await faults_during(api, taints, nodes, spacing_s, busy=lambda: left > 0)
    during_cleanup = left > 0
    await asyncio.wait_for(watcher, timeout=records / rate * 3 + 120)
    after = controller.metrics()
    controller.stop()
    duration = done["at"] - began
    reconciles = metric(after, "gpuheal_reconcile_duration_seconds_count") - metric(
        before, "gpuheal_reconcile_duration_seconds_count"
    )
    requests = audit.by_verb_and_resource(audit.requests(cp.audit_log, user=USER, since=offset))
    return {
        "records": records,
        "records_created_in_s": round(created_s, 1),
        "created": create_past,
        "deletes_per_second_configured": rate,
        "cleanup_s": round(duration, 1),
        "deletes_per_second_achieved": round(records / duration, 1),
        "faults_reported_during_cleanup": len(latencies),
        "all_faults_inside_cleanup": during_cleanup,
        "time_to_taint_ms": percentiles_ms(latencies),
        "reconciles_during_cleanup": int(reconciles),
        "queue_depth_max_sampled": depth_max,
        "collected": {
            why: metric(after, f'gpuheal_fault_records_collected_total{{why="{why}"}}')
            for why in ("age", "count")
        },
        "controller_requests": {
            k: v for k, v in requests.items() if not k.startswith("get leases")
        },
    }


async def run(
    cp: ControlPlane, workdir: Path, nodes: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    per_phase = args.faults
    api = KubeApi.from_kubeconfig(cp.kubeconfig)
    taints = Taints(api)
    await taints.start()
    try:
        baseline_ctl = start_controller(cp, workdir, "baseline", {"enabled": False})
        baseline = await faults_during(api, taints, nodes[:per_phase], args.spacing)
        baseline_ctl.stop()
        result: dict[str, Any] = {
            "benchmark": "retention",
            "baseline": {"time_to_taint_ms": percentiles_ms(baseline)},
        }
        for i, rate in enumerate(args.deletes_per_second, start=1):
            chunk = nodes[per_phase * i : per_phase * (i + 1)]
            phase = Phase(chunk, args.records, rate, args.spacing)
            result[f"cleanup_{int(rate)}_per_s"] = await cleanup(cp, api, taints, workdir, phase)
        return result
    finally:
        await taints.stop()
        await api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--deletes-per-second", type=float, nargs="+", default=[20.0, 200.0])
    parser.add_argument("--faults", type=int, default=40, help="faults reported per phase")
    parser.add_argument("--spacing", type=float, default=0.5, help="seconds between faults")
    args = parser.parse_args()
    with audited_cluster(USER) as (cp, tmp):
        phases = 1 + len(args.deletes_per_second)
        nodes = build_fleet(cp, "ret", args.faults * phases, pods_per_node=0, labels=POOL)
        result = asyncio.run(run(cp, tmp, nodes, args))
    lines = [f"baseline: fault → taint {result['baseline']['time_to_taint_ms']}"]
    for name, entry in result.items():
        if name.startswith("cleanup_"):
            lines.append(
                f"{name}: {entry['records']} records deleted in {entry['cleanup_s']} s "
                f"({entry['deletes_per_second_achieved']}/s); fault → taint meanwhile "
                f"{entry['time_to_taint_ms']}; reconciles {entry['reconciles_during_cleanup']}, "
                f"queue depth max {entry['queue_depth_max_sampled']}"
            )
    emit("retention", result, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
