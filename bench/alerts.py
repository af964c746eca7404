"""Benchmark: the Alertmanager webhook under an alert storm.

10,000 webhook posts (repeats of 50 distinct firing alerts, one alert per post,
as Alertmanager sends them per group) from 8 concurrent clients on loopback to
a real `gpuheal controller` on the local control plane with 50 fake GPU nodes.
Reports throughput and latency percentiles, and checks that exactly 50
remediations happened. Prints JSON on stdout and a summary on stderr.

    .venv/bin/python bench/alerts.py --posts 10000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import emit, percentiles_ms

from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.controller import ControllerProcess, install_crds
from gpuheal.sim.nodes import create_gpu_nodes, wait_nodes_ready
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import create_namespace

TOKEN = "bench-token"  # noqa: S105 -- a throw-away token for a loopback benchmark


def body(node: str, index: int) -> bytes:
    alert = {
        "status": "firing",
        "labels": {"alertname": "GPUXidError", "Hostname": node, "severity": "critical"},
        "startsAt": "2026-11-29T10:00:00Z",
        "fingerprint": f"{index:016x}",
    }
    return json.dumps({"version": "4", "status": "firing", "alerts": [alert]}).encode()


def post(url: str, data: bytes) -> float:
    request = urllib.request.Request(url, data=data, method="POST")  # noqa: S310 -- loopback
    request.add_header("Authorization", f"Bearer {TOKEN}")
    request.add_header("Content-Type", "application/json")
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=10_000)
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()

    with ControlPlane(ControlPlaneConfig(scheduler=False, controller_manager=False)) as cp, \
            tempfile.TemporaryDirectory() as tmp:  # fmt: skip
        client = cp.client()
        install_crds(client)
        create_namespace(client, "gpuheal-system")
        pool = {"bench/pool": "alerts"}
        nodes = create_gpu_nodes(
            client, [f"alert-gpu-{i:03d}" for i in range(args.faults)], labels=pool
        )
        wait_nodes_ready(client, nodes)
        token = Path(tmp) / "token"
        token.write_text(TOKEN)
        config = {
            "nodeSelector": pool,
            "apiTokenFile": str(token),
            "apiClientRatePerSecond": 1e6,
            "apiClientBurst": 1_000_000,
            "rateLimitPerSecond": 1000,
            "rateLimitBurst": 1000,
            "breakerMaxNodes": 1000,
            "breakerMaxPercent": 100,
        }
        controller = ControllerProcess(Path(tmp), cp.kubeconfig, config, identity="bench").start()
        controller.wait_leading()
        url = f"{controller.url}/api/v1/alerts"
        payloads = [body(nodes[i % args.faults], i % args.faults) for i in range(args.posts)]
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.clients) as pool_:
            latencies = list(pool_.map(lambda data: post(url, data), payloads))
        elapsed = time.perf_counter() - started
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            metrics = controller.metrics()
            if (
                f'gpuheal_remediations_total{{action="AddTaint",result="tainted"}} {args.faults}.0'
                in metrics
            ):
                break
            time.sleep(0.5)
        time.sleep(2)
        metrics = controller.metrics()
        records = len(list(client.list(GPUFault)))
        taints = next(
            (float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
             if line.startswith('gpuheal_remediations_total{action="AddTaint",result="tainted"}')),
            0.0,
        )  # fmt: skip
        controller.stop()

    result = {
        "benchmark": "alerts",
        "posts": args.posts,
        "distinct_faults": args.faults,
        "clients": args.clients,
        "seconds": round(elapsed, 2),
        "posts_per_second": round(args.posts / elapsed),
        "latency_ms": percentiles_ms(latencies),
        "gpufault_records": records,
        "taints": taints,
        "exactly_once": records == args.faults and taints == args.faults,
    }
    lat = result["latency_ms"]
    emit(
        "alerts",
        result,
        f"alert storm: {args.posts} posts in {result['seconds']}s "
        f"({result['posts_per_second']}/s), p50 {lat['p50']} ms, p99 {lat['p99']} ms; "
        f"{records} GPUFault records, {taints:.0f} taints for {args.faults} faults",
    )
    return 0 if result["exactly_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
