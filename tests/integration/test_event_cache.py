"""The console's cache of gpuheal's own Events (gpuheal/kube/event_cache.py) on
the real API server: the field selector `reportingController=gpuheal.io/controller`
is taken by the API server and leaves every other Event out, the watch brings new
ones, the cache indexes them by the objects they are about and keeps no more
than its bound."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable

import pytest

from gpuheal.kube.api import ApiError, KubeApi
from gpuheal.kube.event_cache import EVENTS_PATH, OURS, EventCache
from gpuheal.kube.events import EVENT_NAMESPACE, event_body, fault_ref, node_ref
from gpuheal.sim import ControlPlane
from tests import corpus


def test_the_cache_holds_only_gpuheals_events_by_object_and_within_its_bound(
    control_plane: ControlPlane,
) -> None:
    node = corpus.unique_eks_node()
    record = f"{node}-xid-79-20261201t094027z"

    def event(reason: str, *, controller: str = "gpuheal.io/controller") -> dict[str, object]:
        return event_body(
            node_ref(node),
            reason=reason,
            note=f"{reason} on {node}",
            action="Taint",
            warning=False,
            related=fault_ref(record),
            instance="gpuheal-controller-7d9f-x2k4q",
            now=dt.datetime.now(dt.UTC),
            controller=controller,
        )

    async def scenario() -> None:
        api = KubeApi.from_kubeconfig(control_plane.kubeconfig)
        path = f"/apis/events.k8s.io/v1/namespaces/{EVENT_NAMESPACE}/events"
        # The selector is one the API server knows (an unknown one is a 400).
        await api.get(EVENTS_PATH, {"fieldSelector": OURS, "limit": "1"})
        with pytest.raises(ApiError):
            await api.get(EVENTS_PATH, {"fieldSelector": "reportingComponent=x", "limit": "1"})
        ours = [event(r) for r in ("GPUFaultDetected", "GPUFaultQuarantined")]
        theirs = event("FailedScheduling", controller="default-scheduler")
        for body in (*ours, theirs):
            await api.create(path, body)
        cache = EventCache(api)
        bounded = EventCache(api, capacity=1)
        tasks = [asyncio.create_task(c.run()) for c in (cache, bounded)]
        try:
            await until("listed", lambda: len(cache.of([("Node", node)])) == 2)
            shown = cache.of([("GPUFault", record)])
            assert [e.reason for e in shown] == ["GPUFaultDetected", "GPUFaultQuarantined"]
            assert shown[0].note == f"GPUFaultDetected on {node}"
            assert shown[0].related == ("GPUFault", record)
            assert f"{EVENT_NAMESPACE}/{_name(theirs)}" not in cache.store
            assert all(e.reason != "FailedScheduling" for e in cache.store.values())

            await api.create(path, event("GPUFaultRecovered"))
            await until("watched", lambda: len(cache.of([("Node", node)])) == 3)

            # At least three of ours exist now (listed or watched): two let go.
            await until("the bound", lambda: bounded.dropped >= 2)
            assert len(bounded.store) == 1
            # The index forgets what the bound let go.
            assert sum(len(keys) for keys in bounded.about.values()) <= 2
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await api.close()

    asyncio.run(scenario())


async def until(what: str, check: Callable[[], bool]) -> None:
    for _ in range(150):
        if check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not {what}")


def _name(body: dict[str, object]) -> str:
    metadata = body["metadata"]
    assert isinstance(metadata, dict)
    return str(metadata["name"])
