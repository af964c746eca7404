"""The reconcile worker keeps going, and keeps the key, when a write is refused
because the lease looked stale for a moment."""

from __future__ import annotations

import asyncio

from gpuheal.controller.worker import work
from gpuheal.kube.api import NotLeaderError
from gpuheal.kube.workqueue import WorkQueue


async def _run(reconcile_results: dict[str, list[object]], keys: list[str]) -> list[str]:
    queue = WorkQueue()
    seen: list[str] = []
    done = asyncio.Event()

    async def reconcile(key: str) -> float | None:
        seen.append(key)
        result = reconcile_results[key].pop(0)
        if not reconcile_results[key] and all(not r for r in reconcile_results.values()):
            done.set()
        if isinstance(result, BaseException):
            raise result
        assert result is None or isinstance(result, float)
        return result

    worker = asyncio.create_task(work(queue, reconcile, not_leader_retry_s=0.01))
    for key in keys:
        queue.add(key)
    await asyncio.wait_for(done.wait(), timeout=5)
    worker.cancel()
    return seen


def test_a_refused_write_requeues_the_node_and_the_worker_goes_on() -> None:
    results: dict[str, list[object]] = {
        "n1": [NotLeaderError("refusing PATCH: not the leader"), None],
        "n2": [None],
    }
    seen = asyncio.run(_run(results, ["n1", "n2"]))
    assert seen.count("n1") == 2, seen  # looked at again after the refusal
    assert "n2" in seen  # the worker did not stop at the refusal


def test_a_failed_reconcile_is_retried_with_backoff() -> None:
    results: dict[str, list[object]] = {"n1": [RuntimeError("boom"), None]}
    seen = asyncio.run(_run(results, ["n1"]))
    assert seen == ["n1", "n1"]
