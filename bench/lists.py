"""Benchmark: ways to fill the controller's pod cache at cluster scale.

One control plane with --nodes fake GPU nodes (8 Running one-GPU pods each).
Each strategy fills a dict of the controller's pod views (the same projection,
view function and field selector as the pod informer) from a fresh process
state, alternating strategies for --rounds rounds so drift on the machine falls
on all alike:

- informer:   the controller's Informer._list as it is (pages of 500, each item
              decoded on its own so one bad object skips only itself)
- paged-500 / paged-5000: pages decoded whole, the next page requested while
  the current one is decoded
- unpaged:    one LIST
- watch-list: one WATCH with sendInitialEvents=true (the API server's streaming
  list, served from its watch cache), read until the initial-events-end bookmark

Wall seconds and this process's CPU seconds per fill (the API server's work is
in the wall time, not the CPU).

    .venv/bin/python bench/lists.py --nodes 5000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from common import build_fleet, emit, wait_settled

from gpuheal.config import Config
from gpuheal.controller.caches import POD_FIELD_SELECTOR
from gpuheal.kube.api import KubeApi
from gpuheal.kube.informer import Informer
from gpuheal.kube.projections import PodJson, pod_view_factory
from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.workloads import create_namespace

PODS = "/api/v1/pods"
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class _Meta(msgspec.Struct):
    resourceVersion: str = ""  # noqa: N815
    annotations: dict[str, str] = {}
    next_page: str = msgspec.field(default="", name="continue")


class _Page(msgspec.Struct):
    metadata: _Meta
    items: list[msgspec.Raw]


class _PageMeta(msgspec.Struct):
    metadata: _Meta


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _Bookmark(msgspec.Struct):
    metadata: _Meta


VIEW = pod_view_factory(Config().is_gpu_resource)


def _take(store: dict[str, Any], raw: msgspec.Raw | bytes) -> None:
    view = VIEW(msgspec.json.decode(raw, type=PodJson))
    store[view.key] = view


async def informer(api: KubeApi) -> int:
    pods: Informer[PodJson, Any] = Informer(
        api, PODS, PodJson, VIEW, lambda p: p.key, name="pods", field_selector=POD_FIELD_SELECTOR
    )
    await pods._list()  # the fill itself, without the watch after it
    return len(pods.store)


def paged(limit: int) -> Callable[[KubeApi], Awaitable[int]]:
    async def fill(api: KubeApi) -> int:
        store: dict[str, Any] = {}
        params = {"fieldSelector": POD_FIELD_SELECTOR, "limit": str(limit)}
        raw = await api.get(PODS, params)
        while True:
            after = msgspec.json.decode(raw, type=_PageMeta).metadata.next_page
            ahead = (
                asyncio.create_task(api.get(PODS, {**params, "continue": after})) if after else None
            )
            for item in msgspec.json.decode(raw, type=_Page).items:
                _take(store, item)
            if ahead is None:
                return len(store)
            raw = await ahead

    return fill


async def unpaged(api: KubeApi) -> int:
    store: dict[str, Any] = {}
    page = msgspec.json.decode(
        await api.get(PODS, {"fieldSelector": POD_FIELD_SELECTOR}), type=_Page
    )
    for item in page.items:
        _take(store, item)
    return len(store)


async def watch_list(api: KubeApi) -> int:
    store: dict[str, Any] = {}
    params = {
        "fieldSelector": POD_FIELD_SELECTOR,
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
    }
    stream = api.watch(PODS, params, read_timeout_s=120)
    try:
        async for line in stream:
            event = msgspec.json.decode(line, type=_Event)
            if event.type != "BOOKMARK":
                _take(store, event.object)
                continue
            bookmark = msgspec.json.decode(event.object, type=_Bookmark)
            if bookmark.metadata.annotations.get(INITIAL_EVENTS_END) == "true":
                break
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return len(store)


STRATEGIES: dict[str, Callable[[KubeApi], Awaitable[int]]] = {
    "informer": informer,
    "paged-500": paged(500),
    "paged-5000": paged(5000),
    "unpaged": unpaged,
    "watch-list": watch_list,
}


async def timed(cp: ControlPlane, fill: Callable[[KubeApi], Awaitable[int]]) -> dict[str, float]:
    api = KubeApi.from_kubeconfig(cp.kubeconfig)
    try:
        wall, cpu = time.monotonic(), time.process_time()
        count = await fill(api)
        return {
            "wall": time.monotonic() - wall,
            "cpu": time.process_time() - cpu,
            "pods": count,
        }
    finally:
        await api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    config = ControlPlaneConfig(scheduler=False, controller_manager=False)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in STRATEGIES}
    with ControlPlane(config) as cp:
        create_namespace(cp.client(), "work")
        build_fleet(cp, "lists", args.nodes)
        wait_settled(cp)
        for _ in range(args.rounds):
            for name, fill in STRATEGIES.items():
                runs[name].append(asyncio.run(timed(cp, fill)))
    result: dict[str, Any] = {"nodes": args.nodes, "pods": args.nodes * 8}
    for name, measured in runs.items():
        result[name] = {
            "wall_seconds_median": round(statistics.median(m["wall"] for m in measured), 2),
            "cpu_seconds_median": round(statistics.median(m["cpu"] for m in measured), 2),
            "pods": sorted({int(m["pods"]) for m in measured}),
        }
    summary = "\n".join(
        f"{name}: {r['wall_seconds_median']} s wall, {r['cpu_seconds_median']} s CPU (median)"
        for name, r in result.items()
        if isinstance(r, dict)
    )
    emit("lists", result, f"{args.nodes} nodes / {args.nodes * 8} pods\n{summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
