"""Checkpoint before eviction, on the fault path: where each GPU pod of a draining
node stands, from its own annotations, the config and now (no memory).

The protocol is `gpuheal maintenance start`'s (docs/cli-maintenance.md): the pod
is asked with CHECKPOINT_REQUESTED, whose value is its deadline; it says it is done
with CHECKPOINT_DONE (or by leaving on its own). The deadline lives on the pod, so
a restarted or new leader waits for the one asked for, never asks again, and
evicts at that deadline.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

from gpuheal.clock import iso, parse_time
from gpuheal.config import CheckpointConfig
from gpuheal.model import PodView


class CheckpointStep(StrEnum):
    REQUEST = "request"  # not asked yet: ask now, evict later
    WAITING = "waiting"  # asked, its deadline ahead, not done
    DONE = "done"  # it said its checkpoint is saved: evict now
    TIMED_OUT = "timed-out"  # its deadline passed (or cannot be read): evict now


@dataclass(frozen=True)
class PodCheckpoint:
    pod: PodView
    step: CheckpointStep
    # The pod's deadline, RFC 3339 (whole seconds): the one asked now for REQUEST;
    # "" when the pod's value cannot be read.
    deadline: str

    @property
    def evict_now(self) -> bool:
        return self.step in (CheckpointStep.DONE, CheckpointStep.TIMED_OUT)

    def seconds_left(self, now: dt.datetime) -> float:
        """Until the deadline (0 when it is passed or unknown)."""
        at = parse_time(self.deadline)
        return max((at - now).total_seconds(), 0.0) if at is not None else 0.0


def where(pod: PodView, config: CheckpointConfig, now: dt.datetime) -> PodCheckpoint:
    """Where the pod stands. A request already on the pod is kept as it is, whoever
    wrote it (`maintenance start` writes the same annotation): asking again would
    move its deadline."""
    if not pod.checkpoint_requested:
        asked = iso(now + dt.timedelta(seconds=config.wait_seconds), "seconds")
        return PodCheckpoint(pod, CheckpointStep.REQUEST, asked)
    deadline = parse_time(pod.checkpoint_requested)
    if deadline is None:
        # Not a time: no deadline to wait for, and the fault's drain must not hang.
        return PodCheckpoint(pod, CheckpointStep.TIMED_OUT, "")
    said = iso(deadline, "seconds")
    if pod.checkpoint_done:
        return PodCheckpoint(pod, CheckpointStep.DONE, said)
    if now >= deadline:
        return PodCheckpoint(pod, CheckpointStep.TIMED_OUT, said)
    return PodCheckpoint(pod, CheckpointStep.WAITING, said)


def next_look(standing: list[PodCheckpoint], now: dt.datetime) -> float | None:
    """Seconds until the first deadline of the pods still waiting (None: none waits):
    the node is looked at again then, not polled; a pod saying done is an event."""
    waits = [
        c.seconds_left(now)
        for c in standing
        if c.step in (CheckpointStep.REQUEST, CheckpointStep.WAITING)
    ]
    # A request's deadline is in whole seconds: never look before it has passed.
    return max(min(waits), 0.05) if waits else None
