"""Benchmark: client CPU per request, KubeApi's aiohttp transport against the
httpx2 transport it replaced (lightkube's client_adapter), on one control plane.

--nodes fake nodes (no kwok: nothing else writes them); each round PATCHes every
node once (a merge patch of one annotation, as the controller's marks are),
through one transport, then through the other, alternating for --rounds rounds
so drift on the machine falls on both alike. Client CPU is time.process_time()
of this process around each request (the API server is another process), first
one request at a time, then --concurrency in flight (the controller's workers).

    .venv/bin/python bench/transport.py --nodes 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
from common import emit, percentiles_ms
from lightkube import KubeConfig
from lightkube.config import client_adapter

from gpuheal.kube.api import MERGE_PATCH, KubeApi, node_path
from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.bulk import create_all
from gpuheal.sim.nodes import gpu_node

Patch = Callable[[str, dict[str, Any]], Awaitable[bytes]]


class Httpx2Transport:
    """What kube/api.py sent requests through before: httpx2 via lightkube."""

    def __init__(self, kubeconfig: Path) -> None:
        single = KubeConfig.from_file(kubeconfig).get()
        if single is None:
            raise SystemExit(f"{kubeconfig}: no current context")
        params = client_adapter.ConnectionParams(timeout=httpx2.Timeout(30.0), trust_env=False)
        self.http = client_adapter.AsyncClient(single, params)

    async def patch(self, path: str, body: dict[str, Any]) -> bytes:
        response = await self.http.request(
            "PATCH",
            path,
            content=json.dumps(body).encode(),
            headers={"Accept": "application/json", "Content-Type": MERGE_PATCH},
        )
        response.raise_for_status()
        return response.content

    async def close(self) -> None:
        await self.http.aclose()


async def one_at_a_time(patch: Patch, nodes: list[str], tag: str) -> list[float]:
    """Client CPU seconds of each request, sent one after the other."""
    spent = []
    for node in nodes:
        body = {"metadata": {"annotations": {"bench.gpuheal.io/round": tag}}}
        started = time.process_time()
        await patch(node_path(node), body)
        spent.append(time.process_time() - started)
    return spent


async def in_flight(patch: Patch, nodes: list[str], tag: str, concurrency: int) -> float:
    """Client CPU seconds per request with `concurrency` requests in flight."""
    gate = asyncio.Semaphore(concurrency)

    async def one(node: str) -> None:
        async with gate:
            await patch(node_path(node), {"metadata": {"annotations": {"bench/c": tag}}})

    started = time.process_time()
    await asyncio.gather(*(one(n) for n in nodes))
    return (time.process_time() - started) / len(nodes)


async def measure(kubeconfig: Path, nodes: list[str], rounds: int, concurrency: int) -> Any:
    aio = KubeApi.from_kubeconfig(kubeconfig)
    old = Httpx2Transport(kubeconfig)
    patches: dict[str, Patch] = {
        "aiohttp": aio.patch,
        "httpx2": old.patch,
    }
    sequential: dict[str, list[float]] = {name: [] for name in patches}
    concurrent: dict[str, list[float]] = {name: [] for name in patches}
    try:
        for patch in patches.values():  # warm: connections, imports, caches
            await one_at_a_time(patch, nodes[:50], "warm")
        for r in range(rounds):
            order = list(patches) if r % 2 == 0 else list(reversed(patches))
            for name in order:
                sequential[name] += await one_at_a_time(patches[name], nodes, f"{name}-{r}")
                concurrent[name].append(
                    await in_flight(patches[name], nodes, f"{name}-{r}", concurrency)
                )
    finally:
        await aio.close()
        await old.close()
    return sequential, concurrent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    config = ControlPlaneConfig(scheduler=False, controller_manager=False, kwok=False)
    with ControlPlane(config) as cp:
        nodes = [f"ip-10-0-{i // 250}-{i % 250 + 1}.us-west-2.compute.internal" for i in
                 range(args.nodes)]  # fmt: skip
        create_all(cp.kubeconfig, [gpu_node(n) for n in nodes])
        sequential, concurrent = asyncio.run(
            measure(cp.kubeconfig, nodes, args.rounds, args.concurrency)
        )
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "one_at_a_time_ms": {
            name: {
                "mean": round(statistics.fmean(spent) * 1000, 3),
                **percentiles_ms(spent),
            }
            for name, spent in sequential.items()
        },
        f"{args.concurrency}_in_flight_ms_per_request": {
            name: [round(s * 1000, 3) for s in per_round] for name, per_round in concurrent.items()
        },
    }
    seq = {n: result["one_at_a_time_ms"][n]["mean"] for n in sequential}
    par = {n: statistics.median(v) * 1000 for n, v in concurrent.items()}
    summary = (
        f"client CPU per PATCH, one at a time: aiohttp {seq['aiohttp']:.3f} ms, "
        f"httpx2 {seq['httpx2']:.3f} ms ({seq['httpx2'] / seq['aiohttp']:.2f}x); "
        f"{args.concurrency} in flight: aiohttp {par['aiohttp']:.3f} ms, "
        f"httpx2 {par['httpx2']:.3f} ms ({par['httpx2'] / par['aiohttp']:.2f}x)"
    )
    emit("transport", result, summary)


if __name__ == "__main__":
    main()
