"""A reconcile worker: take a node from the queue, reconcile it, requeue it as
the result says. Several run side by side while this replica leads.

The worker alone keeps the queue's books for a node (as controller-runtime's
does): a failure, or a Result asking for a rate-limited retry, is retried after
the node's exponential backoff; any other Result ends the backoff streak and the
node is looked at again when it asks (`requeue_after`), else when an event says.

Every failure is counted by reason; the first failure of a streak is
logged (with the traceback only when it is not an answer from the API server)
and put on the Node as a Warning Event; the repeats are logged only when the
reason changes or once per `repeat_s`, with how many went untold.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gpuheal.controller.result import Result
from gpuheal.kube.api import NotLeaderError
from gpuheal.kube.failures import UNEXPECTED, Streaks, describe, failure_reason
from gpuheal.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)


class ReconcileFailures:
    """What the workers share about failing nodes: one streak per node."""

    def __init__(
        self,
        *,
        counted: Callable[[str], None],
        warn: Callable[[str, str], None],
        repeat_s: float = 300.0,
        streaks: Streaks | None = None,
    ) -> None:
        self.counted = counted  # told the reason of every failure (the metric)
        self.warn = warn  # (node, note): the Warning Event, once per streak
        self.streaks = Streaks(repeat_s) if streaks is None else streaks

    def failed(self, node: str, err: Exception, retry_s: float) -> None:
        reason = failure_reason(err)
        error = describe(err)
        self.counted(reason)
        report = self.streaks.failed(node, reason, error)
        if report is None:
            return
        streak = report.streak
        if report.first:
            log.error(
                "reconcile failed",
                exc_info=err if reason == UNEXPECTED else None,
                extra={"node": node, "reason": reason, "error": error, "retry_s": retry_s},
            )
            self.warn(node, f"reconcile of this node failed ({reason}), retrying: {error}")
            return
        log.error(
            "reconcile still failing",
            extra={
                "node": node,
                "reason": reason,
                "error": error,
                "retry_s": retry_s,
                "failures": streak.failures,
                "untold": report.repeats,
                "failing_s": round(self.streaks.clock() - streak.started, 1),
            },
        )

    def succeeded(self, node: str) -> None:
        streak = self.streaks.succeeded(node)
        if streak is not None:
            log.info(
                "reconcile recovered",
                extra={
                    "node": node,
                    "failures": streak.failures,
                    "failing_s": round(self.streaks.clock() - streak.started, 1),
                },
            )


def requeue(queue: WorkQueue, key: str, result: Result) -> None:
    """Turn a reconcile's Result into the queue's bookkeeping for its node."""
    if result.rate_limited:
        queue.add_rate_limited(key)
    else:
        queue.forget(key)
    if result.requeue_after is not None:
        # The earliest pending look wins; a look at once may wait behind fresh work.
        queue.add_after(key, result.requeue_after, behind=result.behind)


async def work(
    queue: WorkQueue,
    reconcile: Callable[[str], Awaitable[Result]],
    *,
    not_leader_retry_s: float,
    failures: ReconcileFailures,
) -> None:
    """Run until cancelled (the elector cancels the workers when the lease is lost)."""
    while True:
        key = await queue.get()
        try:
            result = await reconcile(key)
        except NotLeaderError:
            # The lease looked stale for a moment (a renewal slower than the renew
            # deadline) and the write gate refused; nothing was written. Keep the key:
            # if the lease is really lost the workers are cancelled and the next leader
            # starts from every node; if it is not, no event may ever bring it back.
            log.info("write refused: lease not renewed in time", extra={"node": key})
            queue.add_after(key, not_leader_retry_s)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            failures.failed(key, err, queue.add_rate_limited(key))
        else:
            failures.succeeded(key)
            requeue(queue, key, result)
        finally:
            queue.done(key)
