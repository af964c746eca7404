"""A reconcile answers with a Result; the worker alone turns it into the queue's
books: a rate-limited answer backs off like a failure, any other forgets the
backoff, and `requeue_after` asks for a look then (the earliest look wins)."""

from __future__ import annotations

import asyncio

from gpuheal.controller.result import DONE, Result
from gpuheal.controller.worker import requeue
from gpuheal.kube.workqueue import WorkQueue
from tests.corpus import EKS_NODE, GKE_NODE


def test_results_combine_to_the_sooner_look_and_keep_a_rate_limit() -> None:
    assert DONE.combine(DONE) == DONE
    assert Result(30.0).combine(Result(5.0)) == Result(5.0)
    assert Result(30.0).combine(DONE) == Result(30.0)
    assert Result(rate_limited=True).combine(Result(2.0)) == Result(2.0, rate_limited=True)


def test_the_worker_turns_each_result_into_one_kind_of_requeue() -> None:
    async def run() -> None:
        queue = WorkQueue(backoff_base_s=1.0, backoff_max_s=60.0)
        # A refused device eviction: the node's backoff grows with each such answer.
        requeue(queue, EKS_NODE, Result(rate_limited=True))
        requeue(queue, EKS_NODE, Result(rate_limited=True))
        assert queue.failures(EKS_NODE) == 2
        pending = queue.pending(EKS_NODE)
        assert pending is not None and 0.9 < pending <= 1.0  # the first backoff's look
        # Rate-limited and asked for sooner: one retry, the earliest of the two.
        requeue(queue, EKS_NODE, Result(0.25, rate_limited=True))
        pending = queue.pending(EKS_NODE)
        assert pending is not None and pending <= 0.25
        assert queue.failures(EKS_NODE) == 3
        # Any other answer ends the streak: the next failure starts from the base.
        requeue(queue, EKS_NODE, Result(30.0))
        assert queue.failures(EKS_NODE) == 0
        requeue(queue, GKE_NODE, DONE)
        assert queue.pending(GKE_NODE) is None and queue.failures(GKE_NODE) == 0
        requeue(queue, GKE_NODE, Result(requeue_after=0.0))  # at once
        assert len(queue) == 1 and await queue.get() == GKE_NODE
        queue.shutdown()

    asyncio.run(run())
