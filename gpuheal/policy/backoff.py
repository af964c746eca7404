"""Exponential backoff, and the retry schedule of a refused eviction."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from dataclasses import dataclass


def backoff_delay(
    failures: int,
    base: float,
    cap: float,
    *,
    jitter: float = 0.0,
    rand: Callable[[], float] = random.random,
) -> float:
    """base * 2**(failures-1), capped; 0 failures waits 0.

    `jitter` (0..1) takes up to that fraction off, so that many keys failing at
    once spread their retries out without any of them waiting beyond `cap`.
    """
    if failures <= 0:
        return 0.0
    delay = float(min(cap, base * 2.0 ** min(failures - 1, 32)))
    return delay * (1.0 - jitter * rand())


@dataclass(frozen=True)
class Blocked:
    """A pod whose eviction for a fault was refused (429: a PodDisruptionBudget, or
    throttling)."""

    fault_id: str
    since: dt.datetime  # the first refusal
    attempts: int  # refusals in a row
    retry_at: dt.datetime  # not tried again before this
    by: str = ""  # what refused it, for people: "PodDisruptionBudget <name>" or the message


EVICTION_JITTER = 0.1


def refused_again(
    previous: Blocked | None,
    fault_id: str,
    now: dt.datetime,
    by: str,
    *,
    base: float,
    cap: float,
    rand: Callable[[], float] = random.random,
) -> Blocked:
    """The schedule after one more refusal: the n-th waits base·2ⁿ⁻¹ capped at
    `cap` (less up to EVICTION_JITTER of it), counted from this refusal. A refusal
    for another fault than `previous`'s starts afresh."""
    if previous is not None and previous.fault_id != fault_id:
        previous = None
    attempts = (previous.attempts if previous else 0) + 1
    delay = backoff_delay(attempts, base, cap, jitter=EVICTION_JITTER, rand=rand)
    return Blocked(
        fault_id=fault_id,
        since=previous.since if previous else now,
        attempts=attempts,
        retry_at=now + dt.timedelta(seconds=delay),
        by=by or (previous.by if previous else ""),
    )
