"""The work queue's and the eviction retries' backoff: as configured, capped,
jittered down (never beyond the cap), reset by success."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from gpuheal.kube.workqueue import WorkQueue
from gpuheal.policy.backoff import Blocked, backoff_delay, refused_again

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    assert [backoff_delay(n, 2, 60) for n in range(8)] == [0, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_delay(10_000, 2, 60) == 60


@pytest.mark.parametrize("rand", [0.0, 0.5, 0.999])
def test_jitter_only_shortens_a_delay(rand: float) -> None:
    for n in range(1, 10):
        plain = backoff_delay(n, 2, 60)
        jittered = backoff_delay(n, 2, 60, jitter=0.1, rand=lambda: rand)
        assert plain * 0.9 <= jittered <= plain


def test_a_refused_eviction_is_retried_on_the_documented_schedule() -> None:
    # evictionRetryBaseSeconds 2, evictionRetryMaxSeconds 60 (the defaults), no jitter.
    blocked: Blocked | None = None
    now, attempts = NOW, []
    while now < NOW + dt.timedelta(hours=1):
        attempts.append(now)
        blocked = refused_again(blocked, "f1", now, "", base=2, cap=60, rand=lambda: 0.0)
        now = blocked.retry_at
    offsets = [(t - NOW).total_seconds() for t in attempts]
    assert offsets[:7] == [0, 2, 6, 14, 30, 62, 122]
    assert len(attempts) == 64  # about one a minute once at the cap
    assert blocked is not None and blocked.since == NOW and blocked.attempts == 64


def test_a_refusal_keeps_what_refused_and_a_new_fault_starts_afresh() -> None:
    first = refused_again(None, "f1", NOW, "PodDisruptionBudget ml/a", base=2, cap=60)
    again = refused_again(first, "f1", NOW + dt.timedelta(seconds=2), "", base=2, cap=60)
    assert (again.attempts, again.since, again.by) == (2, NOW, "PodDisruptionBudget ml/a")
    other = refused_again(again, "f2", NOW + dt.timedelta(seconds=5), "x", base=2, cap=60)
    assert (other.attempts, other.since) == (1, NOW + dt.timedelta(seconds=5))


def test_the_queue_backs_off_as_configured_and_success_resets_it() -> None:
    async def run() -> None:
        queue = WorkQueue(backoff_base_s=2, backoff_max_s=10)
        delays = [queue.add_rate_limited("n1") for _ in range(5)]
        assert delays == [2, 4, 8, 10, 10]
        pending = queue.pending("n1")
        assert pending is not None and 1.5 < pending <= 2  # the earliest delay wins
        queue.forget("n1")
        assert queue.add_rate_limited("n1") == 2
        queue.set_backoff(0.5, 1)  # a reloaded config
        queue.forget("n1")
        assert [queue.add_rate_limited("n1") for _ in range(3)] == [0.5, 1, 1]
        queue.shutdown()

    asyncio.run(run())


def test_an_add_while_processing_runs_the_key_once_more_after_it() -> None:
    async def run() -> None:
        queue = WorkQueue()
        queue.add("n1")
        key = await queue.get()
        queue.add("n1")
        queue.add("n1")
        assert len(queue) == 0  # never handed to a second worker meanwhile
        queue.done(key)
        assert len(queue) == 1
        assert await queue.get() == "n1"
        queue.done("n1")
        assert len(queue) == 0

    asyncio.run(run())


def test_an_add_replaces_a_pending_delay_with_a_turn_now() -> None:
    # Level-triggered: the reconcile it starts answers when to look again. This is
    # why the controller's own writes must not reach add() (see the reconciler).
    async def run() -> None:
        queue = WorkQueue()
        queue.add_after("n1", 30)
        queue.add_after("n1", 60)  # the earliest pending delay wins
        pending = queue.pending("n1")
        assert pending is not None and 29 < pending <= 30
        queue.add("n1")
        assert queue.pending("n1") is None
        assert await asyncio.wait_for(queue.get(), 1) == "n1"

    asyncio.run(run())


def test_a_key_added_behind_waits_for_every_plain_key_and_a_plain_add_brings_it_forward() -> None:
    async def run() -> None:
        queue = WorkQueue()
        queue.add("drain-1", behind=True)
        queue.add("fence-1")
        queue.add("drain-2", behind=True)
        queue.add("fence-2")
        queue.add("drain-2")  # news about it: it goes with the fresh work now
        queue.add("drain-1", behind=True)  # coalesced, keeps its place
        assert len(queue) == 4
        order = [await queue.get() for _ in range(4)]
        assert order == ["fence-1", "fence-2", "drain-2", "drain-1"]

    asyncio.run(run())


def test_a_key_behind_is_handed_out_once_it_has_waited_its_bound() -> None:
    async def run() -> None:
        queue = WorkQueue(behind_max_s=0.05)
        queue.add("drain", behind=True)
        await asyncio.sleep(0.06)
        queue.add("fresh")
        assert await queue.get() == "drain"  # not starved by a busy front lane
        assert await queue.get() == "fresh"

    asyncio.run(run())


def test_an_add_behind_while_processing_requeues_behind_and_a_plain_one_ahead() -> None:
    async def run() -> None:
        queue = WorkQueue()
        queue.add("a")
        queue.add("b")
        assert await queue.get() == "a"
        assert await queue.get() == "b"
        queue.add("a", behind=True)  # the fence pass asks for its drain turn
        queue.add("b", behind=True)
        queue.add("b")  # and an event about b came meanwhile
        queue.add("c")
        queue.done("a")
        queue.done("b")
        assert [await queue.get() for _ in range(3)] == ["c", "b", "a"]

    asyncio.run(run())
