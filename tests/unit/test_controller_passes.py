"""A new quarantine's two passes on the controller that ships (real Reconciler,
runner, Executor and informers over test_controller_properties' in-memory API
server): the fence's pass sends the taint alone; the drain's pass makes the record,
evicts, writes the record's whole status once and then sends the Events."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import pytest

from gpuheal.kube.api import ApiError, node_path
from gpuheal.vocabulary import Reason
from tests.unit.test_controller_properties import (
    FAULTS,
    NODES,
    Crash,
    MemoryApi,
    Process,
    cluster,
    report,
    start,
)


async def _reported(crash_at: int | None = None) -> tuple[MemoryApi, Process, str]:
    """The fleet in the in-memory API server, a process started over it, and an
    Xid 79 reported on its first node (an EKS name of 41 characters)."""
    api = MemoryApi(itertools.cycle([0]), crash_at=crash_at)
    cluster(api)
    process = await start(api)
    node = NODES[0]
    report(api, process, node, f"xid-79-{node}-20261203T061000Z")
    return api, process, node


def _what(verb: str, path: str) -> str:
    for suffix in ("status", "eviction"):
        if path.endswith("/" + suffix):
            return f"{verb} {suffix}"
    return f"{verb} {'gpufaults' if path.startswith(FAULTS) else 'nodes'}"


def test_the_fence_pass_sends_the_taint_alone_and_the_drain_pass_the_rest() -> None:
    async def run() -> None:
        api, process, node = await _reported()
        sent: list[str] = []
        for verb in ("create", "patch"):
            original = getattr(api, verb)

            async def counted(path: str, *a: object, _f=original, _v=verb, **k: object) -> bytes:  # type: ignore[no-untyped-def]
                sent.append(_what(_v, path))
                answer: bytes = await _f(path, *a, **k)
                return answer

            setattr(api, verb, counted)

        fenced = await process.reconciler.reconcile(node)
        assert sent == ["patch nodes"]  # the taint alone
        assert (fenced.requeue_after, fenced.behind) == (0.0, True)  # behind fresh work
        assert process.told.sent == []
        assert not [p for p in api.objects if p.startswith(FAULTS + "/")]  # the next turn's

        sent.clear()
        drained = await process.reconciler.reconcile(node)
        assert sent == [
            *("create gpufaults", "create eviction", "create eviction", "patch status")
        ], sent
        (record,) = [o for p, o in api.objects.items() if p.startswith(FAULTS + "/")]
        said = [a["action"] for a in record["status"]["actions"]]
        assert said == ["detect", "taint", "evict"] and record["status"]["phase"] == "Draining"
        reasons = [reason for reason, _ in process.told.sent]
        assert reasons == [Reason.DETECTED, Reason.QUARANTINED, Reason.EVICTED], reasons
        assert drained.behind is False

    asyncio.run(run())


def test_a_crash_between_the_taint_and_its_record_leaves_nothing_undone() -> None:
    async def run() -> None:
        api = MemoryApi(itertools.cycle([0]), crash_at=1)
        api.crash_after_write = True  # dies once the taint is stored, before the record
        cluster(api)
        process = await start(api)
        node = NODES[0]
        report(api, process, node, "xid-79-a")
        with contextlib.suppress(Crash):
            await process.reconciler.reconcile(node)
        assert api.tainted() == {node}
        assert not [p for p in api.objects if p.startswith(FAULTS + "/")]

        process = await start(api)  # a new process: it remembers nothing
        for _ in range(3):
            await process.reconciler.reconcile(node)
        ledger = api.ledger
        assert list(ledger.record_creates.values()) == [1]
        assert list(ledger.taints_set.values()) == [1]
        assert sorted(ledger.evictions.values()) == [1, 1]
        (record,) = [o for p, o in api.objects.items() if p.startswith(FAULTS + "/")]
        assert [a["action"] for a in record["status"]["actions"]] == ["detect", "taint", "evict"]

    asyncio.run(run())


def test_a_refused_taint_leaves_the_fault_on_record_and_is_retried() -> None:
    """Admission refuses our taint: the pass fails (the worker backs off and says
    so), and the fault is on record all the same, Detected, its one Event sent."""

    async def run() -> None:
        api, process, node = await _reported()
        patch = api.patch

        async def refused(path: str, body: Any, content_type: str = "") -> bytes:
            if path.startswith(node_path()):
                raise ApiError(422, "Invalid", "taints on this pool are set by the platform team")
            return await patch(path, body, content_type)

        api.patch = refused  # type: ignore[method-assign]
        with pytest.raises(ApiError):
            await process.reconciler.reconcile(node)
        (record,) = [o for p, o in api.objects.items() if p.startswith(FAULTS + "/")]
        assert [a["action"] for a in record["status"]["actions"]] == ["detect"]
        assert record["status"]["phase"] == "Detected"
        assert [reason for reason, _ in process.told.sent] == [Reason.DETECTED]
        assert not api.tainted()

        api.patch = patch  # type: ignore[method-assign]  # the policy is lifted: the retry fences
        await process.reconciler.reconcile(node)
        assert api.tainted() == {node}
        assert list(api.ledger.record_creates.values()) == [1]

    asyncio.run(run())
