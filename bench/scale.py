"""Benchmark: the controller at cluster scale.

One local control plane grows through the given fleet sizes (fake GPU nodes
with 8 one-GPU pods each, bound directly, marked Running by kwok). At each size
a `gpuheal controller` is started cold and measured:

- ready: start → /readyz 200 (Node, Pod and GPUFault caches synced, leading)
- RSS 5 s after ready
- idle (no faults) for --idle-seconds: the controller's CPU time, and the API
  requests it made, counted by the apiserver itself twice over: the audit log
  (requests by the controller's user only) and apiserver_request_total (every
  client; kwok is paused for the window, so the rest is the apiserver's own
  housekeeping).

Each size is started --starts times (default 3): ready is the median, the
idle window and RSS are the first start's.

    .venv/bin/python bench/scale.py --nodes 1000 2500 5000
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    apiserver_requests,
    audited_cluster,
    build_fleet,
    cpu_seconds,
    delta,
    emit,
    profiler,
    pyplot,
    rss_mib,
    stop_profiler,
    wait_settled,
)

from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.controlplane import KWOK

USER = "gpuheal-controller"


def cold_start(cp: ControlPlane, workdir: Path, identity: str) -> float:
    """Seconds from exec to ready and leading, of a controller stopped right after."""
    controller = ControllerProcess(workdir, cp.kubeconfig_for(USER), {}, identity=identity)
    started = time.monotonic()
    controller.component.start()
    controller.component.wait_ready(controller.leading, started + 600)
    ready_s = time.monotonic() - started
    controller.stop()
    return ready_s


def measure(
    cp: ControlPlane, workdir: Path, nodes: int, idle_s: float, profile: bool
) -> dict[str, Any]:
    controller = ControllerProcess(workdir, cp.kubeconfig_for(USER), {}, identity=f"scale-{nodes}")
    started = time.monotonic()
    controller.component.start()
    spy = profiler(controller.component.pid or 0, f"profile-start-{nodes}") if profile else None
    controller.component.wait_ready(controller.leading, started + 600)
    ready_s = time.monotonic() - started
    if spy is not None:
        stop_profiler(spy)
    time.sleep(5)
    pid = controller.component.pid or 0
    rss = rss_mib(pid)

    kwok = cp.components[KWOK]
    kwok.signal(signal.SIGSTOP)
    try:
        time.sleep(1)  # let requests already in flight finish
        counted_before = apiserver_requests(cp)
        audited_from = audit.offset(cp.audit_log)
        cpu_before = cpu_seconds(pid)
        time.sleep(idle_s)
        cpu_idle = cpu_seconds(pid) - cpu_before
        everyone = delta(apiserver_requests(cp), counted_before)
        ours = audit.by_verb_and_resource(
            audit.requests(cp.audit_log, user=USER, since=audited_from)
        )
    finally:
        kwok.signal(signal.SIGCONT)
    controller.stop()
    lists_after_sync = sum(n for k, n in ours.items() if k.startswith("list "))
    writes = {
        k: n for k, n in ours.items() if k.split()[0] in {"create", "update", "patch", "delete"}
    }
    return {
        "nodes": nodes,
        "ready_seconds": round(ready_s, 2),
        "rss_mib": round(rss, 1),
        "idle_seconds": idle_s,
        "idle_cpu_seconds": round(cpu_idle, 3),
        "idle_cpu_percent_of_core": round(100 * cpu_idle / idle_s, 3),
        "idle_requests_by_controller": ours,
        "idle_lists_by_controller": lists_after_sync,
        # The Lease renewals are the elector's heartbeat, not work on the fleet.
        "idle_writes_by_controller": writes,
        "idle_apiserver_request_total_delta": everyone,
    }


def plot(runs: list[dict[str, Any]]) -> list[str]:
    plt = pyplot()
    nodes = [r["nodes"] for r in runs]
    figure, left = plt.subplots(figsize=(6, 4))
    left.plot(nodes, [r["rss_mib"] for r in runs], "o-", color="tab:blue", label="RSS (MiB)")
    left.set_xlabel("fake GPU nodes (8 GPU pods each)")
    left.set_ylabel("controller RSS after sync (MiB)", color="tab:blue")
    left.set_ylim(bottom=0)
    right = left.twinx()
    right.plot(nodes, [r["ready_seconds"] for r in runs], "s--", color="tab:orange")
    right.set_ylabel("start → ready (s)", color="tab:orange")
    right.set_ylim(bottom=0)
    left.set_title("gpuheal controller: memory and cold start against fleet size")
    left.grid(alpha=0.3)
    figure.tight_layout()
    path = "docs/img/scale-rss.png"
    figure.savefig(path, dpi=110)
    return [path]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 2500, 5000])
    parser.add_argument("--pods-per-node", type=int, default=8)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument(
        "--starts", type=int, default=3, help="cold starts per size (ready is their median)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy flame graph of each cold start in bench/results/profile-start-N.svg",
    )
    args = parser.parse_args()
    runs = []
    with audited_cluster(USER) as (cp, tmp):
        have = 0
        for target in sorted(args.nodes):
            started = time.monotonic()
            build_fleet(cp, "scale", target - have, start=have, pods_per_node=args.pods_per_node)
            populate_s = time.monotonic() - started
            settle_s = wait_settled(cp)
            have = target
            run = measure(cp, tmp, target, args.idle_seconds, args.profile)
            starts = [run["ready_seconds"]] + [
                round(cold_start(cp, tmp, f"scale-{target}-{i}"), 2) for i in range(1, args.starts)
            ]
            run.update(ready_seconds=round(statistics.median(starts), 2), ready_seconds_each=starts)
            run.update(
                pods=target * args.pods_per_node,
                populate_seconds=round(populate_s, 1),
                kwok_settle_seconds=round(settle_s, 1),
            )
            print(
                f"{target} nodes: ready {run['ready_seconds']} s, RSS {run['rss_mib']} MiB, "
                f"idle CPU {run['idle_cpu_percent_of_core']} %",
                file=sys.stderr,
            )
            runs.append(run)
    plots = plot(runs)
    summary = "\n".join(
        f"{r['nodes']} nodes / {r['pods']} pods: ready {r['ready_seconds']} s, "
        f"RSS {r['rss_mib']} MiB, idle CPU {r['idle_cpu_percent_of_core']} % of a core, "
        f"idle requests {r['idle_requests_by_controller']}"
        for r in runs
    )
    emit("scale", {"benchmark": "scale", "runs": runs, "plots": plots}, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
