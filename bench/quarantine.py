"""Benchmark: time to quarantine, storm throughput and API cost per remediation.

A local control plane with fake GPU nodes (8 one-GPU pods each) and a real
`gpuheal controller`. This script is the separate watcher: one watch on the
pool's Nodes and one on the pods, timestamps taken as events arrive.

- single faults: the fault annotation PATCH is sent at T0; T1 is when the watch
  shows our taint; also T0 → every GPU pod of the node evicted (deletionTimestamp
  set). Faults are spaced to stay inside the default rate limit (2/s); the
  breaker is raised so that the 200 faults stay quarantined side by side.
- the floor, interleaved with the single faults on the same nodes: a bare label
  PATCH → the same watch sees it. Our latency is reported as a ratio to it.
- storms: 50 and 200 fault annotations sent at once (rate limits and breaker
  lifted); per-fault latency, and throughput = nodes tainted per second from the
  first PATCH to the last taint. A storm-sized floor (50 / 200 label PATCHes at
  once) runs first.
- API cost: one more fault on one node, every request the controller's user
  made until the node is handled and drained, then for its recovery, from the
  apiserver's audit log; `requests` counts the remediation's (leases aside).
- a warm-up storm (`--warmup`, 50 nodes) runs first, unmeasured, with the storms'
  controller: before it, whichever phase ran first met a cold API server (its
  caches, its watch cache, the connections) and the phase order changed the result.

    .venv/bin/python bench/quarantine.py --singles 200 --storms 50 200 --warmup 50
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    audited_cluster,
    build_fleet,
    commit_of,
    cpu_seconds,
    emit,
    percentiles_ms,
    profiler,
    pyplot,
    stop_profiler,
)

from gpuheal.kube.api import KubeApi, node_path
from gpuheal.model import FAULT_ID, FAULT_REASON, FAULT_TIME, HANDLED_FAULT_ID, STATUS, TAINT_KEY
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.controlplane import KUBE_APISERVER

USER = "gpuheal-controller"
POOL = {"bench/pool": "quarantine"}
FLOOR_LABEL = "bench/floor"
PODS_PER_NODE = 8


class Watcher:
    """Arrival times of what the benchmark waits for, from its own watches."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.tainted: dict[str, float] = {}
        self.handled: dict[str, float] = {}
        self.untainted: dict[str, float] = {}
        self.floor: dict[tuple[str, str], float] = {}
        self.evicted: dict[str, set[str]] = defaultdict(set)
        self.drained: dict[str, float] = {}
        self.changed = asyncio.Condition()
        self.rewatches = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        selector = ",".join(f"{k}={v}" for k, v in POOL.items())
        for path, selection, handle in (
            (node_path(), {"labelSelector": selector}, self._node),
            ("/api/v1/namespaces/work/pods", {}, self._pod),
        ):
            page = json.loads(await self.api.get(path, {**selection, "limit": "1"}))
            params = {
                **selection,
                "resourceVersion": page["metadata"]["resourceVersion"],
                "allowWatchBookmarks": "true",
            }
            self._tasks.append(asyncio.create_task(self._watch(path, params, handle)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _watch(self, path: str, params: dict[str, str], handle: Callable[..., None]) -> None:
        """Watch on from the last version seen whenever the server ends the stream (a
        watcher that falls behind in a storm is closed by the apiserver); a 410 means
        events were lost, which would make the timings wrong: stop the run."""
        rv = params["resourceVersion"]
        while True:
            watch = {**params, "resourceVersion": rv, "timeoutSeconds": "3600"}
            async for line in self.api.watch(path, watch, 3600):
                event = json.loads(line)
                now = time.perf_counter()
                if event["type"] == "ERROR":
                    raise RuntimeError(f"watch of {path} failed: {event['object']}")
                rv = event["object"]["metadata"].get("resourceVersion", rv)
                if event["type"] in {"ADDED", "MODIFIED", "DELETED"}:
                    handle(event["type"], event["object"], now)
                    async with self.changed:
                        self.changed.notify_all()
            self.rewatches += 1

    def _node(self, kind: str, node: dict[str, Any], now: float) -> None:
        name = node["metadata"]["name"]
        taints = node.get("spec", {}).get("taints") or []
        if any(t["key"] == TAINT_KEY for t in taints):
            self.tainted.setdefault(name, now)
        elif name in self.tainted:
            self.untainted.setdefault(name, now)
        annotations = node["metadata"].get("annotations") or {}
        if annotations.get(HANDLED_FAULT_ID):
            self.handled.setdefault(name, now)
        mark = (node["metadata"].get("labels") or {}).get(FLOOR_LABEL)
        if mark:
            self.floor.setdefault((name, mark), now)

    def _pod(self, kind: str, pod: dict[str, Any], now: float) -> None:
        meta = pod["metadata"]
        node = (meta.get("labels") or {}).get("bench/node")
        if node and (kind == "DELETED" or meta.get("deletionTimestamp")):
            self.evicted[node].add(meta["name"])
            if len(self.evicted[node]) == PODS_PER_NODE:
                self.drained.setdefault(node, now)

    async def until(self, what: str, done: Callable[[], bool], timeout_s: float = 120) -> None:
        for task in self._tasks:
            if task.done():
                task.result()  # a failed watch fails the run, loudly
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(done), timeout_s)
            except TimeoutError:
                raise TimeoutError(f"waiting for {what}") from None


async def report_fault(api: KubeApi, node: str, fault_id: str) -> float:
    """Write what the agent writes; returns T0 (just before the PATCH is sent)."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body = {
        "metadata": {
            "annotations": {
                STATUS: "faulty",
                FAULT_ID: fault_id,
                FAULT_TIME: now,
                FAULT_REASON: "XidCritical79",
            }
        }
    }
    started = time.perf_counter()
    await api.patch(node_path(node), body)
    return started


async def clear_fault(api: KubeApi, node: str) -> float:
    body = {"metadata": {"annotations": {STATUS: None, FAULT_ID: None, FAULT_REASON: None}}}
    started = time.perf_counter()
    await api.patch(node_path(node), body)
    return started


async def mark_floor(api: KubeApi, node: str, mark: str) -> float:
    started = time.perf_counter()
    await api.patch(node_path(node), {"metadata": {"labels": {FLOOR_LABEL: mark}}})
    return started


async def singles(
    api: KubeApi, watcher: Watcher, nodes: list[str], spacing_s: float
) -> dict[str, Any]:
    floor, taint, drain = [], [], []
    for i, node in enumerate(nodes):
        t0 = await mark_floor(api, node, f"single-{i}")
        await watcher.until("floor", lambda n=node, m=f"single-{i}": (n, m) in watcher.floor)
        floor.append(watcher.floor[(node, f"single-{i}")] - t0)
        t0 = await report_fault(api, node, f"single-{i}")
        await watcher.until("drained", lambda n=node: n in watcher.drained)
        taint.append(watcher.tainted[node] - t0)
        drain.append(watcher.drained[node] - t0)
        await asyncio.sleep(spacing_s)
    return {"floor": floor, "taint": taint, "evicted": drain}


async def storm(
    api: KubeApi, watcher: Watcher, nodes: list[str], tag: str, pids: dict[str, int]
) -> dict[str, Any]:
    """`pids`: the processes whose CPU the storm costs (the API server, the controller)."""
    sent = await asyncio.gather(*(mark_floor(api, n, tag) for n in nodes))
    await watcher.until("floor", lambda: all((n, tag) in watcher.floor for n in nodes))
    floor = [watcher.floor[(n, tag)] - t0 for n, t0 in zip(nodes, sent, strict=True)]
    cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
    sent = await asyncio.gather(*(report_fault(api, n, f"{tag}-{n}") for n in nodes))
    await watcher.until("tainted", lambda: all(n in watcher.tainted for n in nodes), 600)
    to_taint = {name: cpu_seconds(pid) - cpu[name] for name, pid in pids.items()}
    await watcher.until("drained", lambda: all(n in watcher.drained for n in nodes), 600)
    # Let the storm finish (every node handled) before the next phase measures anything.
    await watcher.until("handled", lambda: all(n in watcher.handled for n in nodes), 600)
    to_handled = {name: cpu_seconds(pid) - cpu[name] for name, pid in pids.items()}
    taint = [watcher.tainted[n] - t0 for n, t0 in zip(nodes, sent, strict=True)]
    drain = [watcher.drained[n] - t0 for n, t0 in zip(nodes, sent, strict=True)]
    span = max(watcher.tainted[n] for n in nodes) - min(sent)
    return {
        "floor": floor,
        "taint": taint,
        "evicted": drain,
        "nodes_per_second": len(nodes) / span,
        # CPU per faulty node, until every node is tainted and until every node is
        # drained and handled; the API server's includes serving this script's
        # fault PATCHes and watches, as it did when the peer was measured.
        "cpu_ms_per_node_to_taint": {
            n: round(1000 * c / len(nodes), 1) for n, c in to_taint.items()
        },
        "cpu_ms_per_node_to_handled": {
            n: round(1000 * c / len(nodes), 1) for n, c in to_handled.items()
        },
    }


async def api_cost(cp: ControlPlane, api: KubeApi, watcher: Watcher, node: str) -> dict[str, Any]:
    """Every request of the controller's user about this node's objects (itself,
    its pods, its record, its Events: all named after it) and its Lease, from the
    fault to handled-and-drained, then from the fault cleared to untainted; a
    storm's stragglers written in the same window are not this node's cost."""

    def this_node(since: int, until: int) -> list[audit.Request]:
        return [
            r
            for r in audit.requests(cp.audit_log, user=USER, since=since, until=until)
            if r.resource == "leases"
            or r.name == node
            or r.name.startswith((f"{node}-", f"{node}."))
        ]

    await asyncio.sleep(3)  # quiet: the storms' last status writes are done
    start = audit.offset(cp.audit_log)
    await report_fault(api, node, "cost")
    await watcher.until("handled", lambda: node in watcher.handled and node in watcher.drained)
    await asyncio.sleep(2)  # the last status write lands after the handled mark
    middle = audit.offset(cp.audit_log)
    await clear_fault(api, node)
    await watcher.until("untainted", lambda: node in watcher.untainted)
    await asyncio.sleep(2)
    end = audit.offset(cp.audit_log)
    remediation = this_node(start, middle)
    return {
        "requests": sum(1 for r in remediation if r.resource != "leases"),
        "remediation": audit.by_verb_and_resource(iter(remediation)),
        "recovery": audit.by_verb_and_resource(iter(this_node(middle, end))),
        "remediation_in_order": [
            f"{r.verb} {r.resource}" for r in remediation if r.resource != "leases"
        ],
    }


def start_controller(
    cp: ControlPlane, workdir: Path, name: str, code: Path | None, **config: Any
) -> ControllerProcess:
    settings = {
        "nodeSelector": POOL,
        "breakerMaxNodes": 100_000,
        "breakerMaxPercent": 100,
        "recoveryWindowSeconds": 1,
        **config,
    }
    controller = ControllerProcess(
        workdir, cp.kubeconfig_for(USER), settings, identity=name, code=code
    )
    return controller.start().wait_leading()


async def run(
    cp: ControlPlane,
    workdir: Path,
    nodes: list[str],
    args: argparse.Namespace,
    code: Path | None = None,
) -> dict[str, Any]:
    """Singles, storms and the API cost with the controller of this checkout, or of
    the checkout `code`."""
    tag = "base-" if code else ""
    api = KubeApi.from_kubeconfig(cp.kubeconfig)
    watcher = Watcher(api)
    await watcher.start()
    results: dict[str, Any] = {}
    try:
        used = 0
        if args.warmup:
            # Unmeasured: the API server and the machine warm before anything counts.
            controller = start_controller(
                cp,
                workdir,
                f"{tag}warmup",
                code,
                rateLimitPerSecond=100_000,
                rateLimitBurst=100_000,
                workers=args.workers,
            )
            await storm(api, watcher, nodes[: args.warmup], f"{tag}warmup", {})
            controller.stop()
            used = args.warmup
        if args.singles:
            controller = start_controller(cp, workdir, f"{tag}defaults", code)
            results["single"] = await singles(
                api, watcher, nodes[used : used + args.singles], args.spacing
            )
            controller.stop()
            used += args.singles
        # Storms: every safety throttle lifted, so what is measured is the machinery.
        controller = start_controller(
            cp,
            workdir,
            f"{tag}lifted",
            code,
            rateLimitPerSecond=100_000,
            rateLimitBurst=100_000,
            workers=args.workers,
        )
        profile = args.profile and code is None
        spy = profiler(controller.component.pid or 0, "profile-storms") if profile else None
        for size in args.storms:
            pids = {
                "apiserver": cp.components[KUBE_APISERVER].pid or 0,
                "controller": controller.component.pid or 0,
            }
            results[f"storm-{size}"] = await storm(
                api, watcher, nodes[used : used + size], f"{tag}storm{size}", pids
            )
            used += size
        if spy is not None:
            stop_profiler(spy)
        results["api_cost"] = await api_cost(cp, api, watcher, nodes[used])
        results["watch_restarts"] = watcher.rewatches
        controller.stop()
    except BaseException:
        print(f"--- controller log (tail) ---\n{controller.log()[-3000:]}", file=sys.stderr)
        raise
    finally:
        await watcher.stop()
        await api.close()
    return results


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, series in raw.items():
        if name.startswith(("api_cost", "watch_restarts")):
            out[name] = series
            continue
        floor = percentiles_ms(series["floor"])
        taint = percentiles_ms(series["taint"])
        out[name] = {
            "floor_ms": floor,
            "time_to_taint_ms": taint,
            "time_to_all_evicted_ms": percentiles_ms(series["evicted"]),
            "ratio_to_floor": {
                p: round(taint[p] / floor[p], 2) if floor[p] else None
                for p in ("p50", "p90", "p99")
            },
        }
        if "nodes_per_second" in series:
            out[name]["nodes_tainted_per_second"] = round(series["nodes_per_second"], 1)
            out[name]["cpu_ms_per_node_to_taint"] = series["cpu_ms_per_node_to_taint"]
            out[name]["cpu_ms_per_node_to_handled"] = series["cpu_ms_per_node_to_handled"]
    return out


def plot(raw: dict[str, Any]) -> list[str]:
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for name, series in raw.items():
        if name.startswith(("api_cost", "watch_restarts")):
            continue
        for key, style in (("taint", "-"), ("floor", ":")):
            values = sorted(v * 1000 for v in series[key])
            fractions = [(i + 1) / len(values) for i in range(len(values))]
            label = f"{name} {'fault → taint' if key == 'taint' else 'floor (PATCH → watch)'}"
            axis.step(values, fractions, style, where="post", label=label)
    axis.set_xscale("log")
    axis.set_xlabel("milliseconds (log scale)")
    axis.set_ylabel("fraction of faults")
    axis.set_title("Time to quarantine, seen by a separate watcher")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=7)
    figure.tight_layout()
    path = "docs/img/quarantine-cdf.png"
    figure.savefig(path, dpi=110)
    return [path]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--singles", type=int, default=200)
    parser.add_argument("--storms", type=int, nargs="*", default=[50, 200])
    parser.add_argument("--spacing", type=float, default=0.6, help="seconds between singles")
    parser.add_argument(
        "--warmup", type=int, default=50, help="nodes of the unmeasured storm run first (0: none)"
    )
    parser.add_argument("--workers", type=int, default=4, help="controller workers in storms")
    parser.add_argument(
        "--profile", action="store_true", help="py-spy flame graph of the storms' controller"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout to compare with: the same phases run with its controller, on "
        "nodes of their own in the same fleet, after this checkout's",
    )
    args = parser.parse_args()
    if args.baseline and not (args.baseline / "gpuheal" / "cli.py").exists():
        parser.error(f"--baseline {args.baseline}: not a checkout of gpuheal")
    versions: list[Path | None] = [None, *([args.baseline.resolve()] if args.baseline else [])]
    with audited_cluster(USER) as (cp, tmp):
        each = args.warmup + args.singles + sum(args.storms) + 1
        nodes = build_fleet(cp, "q", each * len(versions), pods_per_node=PODS_PER_NODE, labels=POOL)
        raw: dict[str, Any] = {}
        for i, code in enumerate(versions):
            measured = asyncio.run(run(cp, tmp, nodes[i * each : (i + 1) * each], args, code))
            suffix = " (baseline)" if code else ""
            raw.update({f"{name}{suffix}": series for name, series in measured.items()})
    result = {"benchmark": "quarantine", **summarise(raw), "plots": plot(raw)}
    if args.baseline:
        result["baseline"] = f"{args.baseline} at {commit_of(args.baseline)}"
    lines = []
    for name, entry in result.items():
        if isinstance(entry, dict) and "time_to_taint_ms" in entry:
            taint, floor = entry["time_to_taint_ms"], entry["floor_ms"]
            line = (
                f"{name}: fault → taint p50 {taint['p50']} / p99 {taint['p99']} ms "
                f"(floor p50 {floor['p50']} / p99 {floor['p99']} ms, "
                f"ratio p99 {entry['ratio_to_floor']['p99']}); all evicted p99 "
                f"{entry['time_to_all_evicted_ms']['p99']} ms"
            )
            if "nodes_tainted_per_second" in entry:
                line += (
                    f"; {entry['nodes_tainted_per_second']} nodes/s; CPU ms per node to taint "
                    f"{entry['cpu_ms_per_node_to_taint']}, to handled "
                    f"{entry['cpu_ms_per_node_to_handled']}"
                )
            lines.append(line)
    for name in (n for n in result if n.startswith("api_cost")):
        cost = result[name]
        lines.append(
            f"{name}, one node with 8 GPU pods: {cost['requests']} requests, "
            f"remediation {cost['remediation']}"
        )
        lines.append(f"  recovery {cost['recovery']}")
    emit("quarantine", result, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
