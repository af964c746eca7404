"""What a reconcile answers about its node, for the worker to turn into queue
bookkeeping (controller-runtime's reconcile.Result): the reconcile itself never
touches the queue."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    # Look at the node again after this many seconds (0: at once); None: only
    # when an event or the resync brings it back.
    requeue_after: float | None = None
    # Look at it again after its backoff, which grows with each such answer in a
    # row (a refused device eviction); failures take the same backoff.
    rate_limited: bool = False
    # The look at once waits behind the nodes queued for a fresh look (the queue's
    # lane behind): a new quarantine's drain, so that a storm is fenced first.
    behind: bool = False

    def combine(self, other: Result) -> Result:
        """Both answers at once: the sooner look (behind only if every answer that
        asks for it is), rate-limited if either asks."""
        afters = [a for a in (self.requeue_after, other.requeue_after) if a is not None]
        soonest = min(afters) if afters else None
        return Result(
            requeue_after=soonest,
            rate_limited=self.rate_limited or other.rate_limited,
            behind=soonest is not None
            and all(r.behind for r in (self, other) if r.requeue_after == soonest),
        )


DONE = Result()
