"""The Xids each GPU threw lately: the context NVIDIA's workflows read, and the
count of application Xids that only as a rate becomes a node fault.

Two threads feed it (the kernel log's and NVML's event thread), and both may
report the same Xid: the other source's copy of one (GPU, code) within
`same_event_s` is the same event, counted once. Kept in memory: an agent restart forgets it
(its kernel-log cursor means old lines are not read again either).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from gpuheal.agent.findings import ProbeFinding
from gpuheal.model import Severity
from gpuheal.xid import Kind

REPEATED_APPLICATION_XIDS = "RepeatedApplicationXids"


@dataclass(frozen=True)
class Seen:
    at: float  # monotonic seconds
    xid: int
    kind: Kind
    source: str  # the event source that told it: "kmsg" or "nvml"


@dataclass(frozen=True)
class RateRule:
    """`per_gpu` application Xids on one GPU within `window_s` make a node fault;
    0 turns the rule off."""

    per_gpu: int = 20
    window_s: float = 3600.0


class XidHistory:
    def __init__(self, context_s: float, rule: RateRule, same_event_s: float = 5.0) -> None:
        self.context_s = context_s
        self.rule = rule
        self.same_event_s = same_event_s
        self._keep_s = max(context_s, rule.window_s, same_event_s)
        self._lock = threading.Lock()
        self._by_gpu: dict[str, deque[Seen]] = {}

    def _trim(self, seen: deque[Seen], now: float) -> None:
        while seen and now - seen[0].at > self._keep_s:
            seen.popleft()

    def recent(self, gpu: str, now: float) -> tuple[int, ...]:
        """The codes this GPU threw within the context window before `now`."""
        with self._lock:
            seen = self._by_gpu.get(gpu, deque())
            return tuple(dict.fromkeys(s.xid for s in seen if now - s.at <= self.context_s))

    def add(self, gpu: str, xid: int, kind: Kind, now: float, source: str) -> bool:
        """Record an Xid; False when it is the other source's copy of one just seen
        (the same source telling it twice is two events: two processes crashed)."""
        with self._lock:
            seen = self._by_gpu.setdefault(gpu, deque())
            self._trim(seen, now)
            if any(
                s.xid == xid and s.source != source and now - s.at <= self.same_event_s
                for s in seen
            ):
                return False
            seen.append(Seen(now, xid, kind, source))
            return True

    def application_counts(self, now: float) -> dict[str, int]:
        """Application Xids per GPU within the rate rule's window."""
        with self._lock:
            counts = {}
            for gpu, seen in self._by_gpu.items():
                self._trim(seen, now)
                n = sum(
                    1
                    for s in seen
                    if s.kind is Kind.APPLICATION and now - s.at <= self.rule.window_s
                )
                if n:
                    counts[gpu] = n
            return counts

    def rate_findings(self, now: float) -> tuple[ProbeFinding, ...]:
        """A P1 finding for each GPU over the rule: NVIDIA's WORKFLOW_XID_13/31 read a
        burst of application faults on the same GPU as a possible hardware issue (run
        the diagnostics), and on many GPUs as the application's. So one GPU alone."""
        if self.rule.per_gpu <= 0:
            return ()
        counts = self.application_counts(now)
        over = [gpu for gpu, n in counts.items() if n >= self.rule.per_gpu]
        if len(over) != 1:
            return ()  # none, or several GPUs at once: the application's
        (gpu,) = over
        minutes = self.rule.window_s / 60
        return (
            ProbeFinding(
                REPEATED_APPLICATION_XIDS,
                Severity.P1,
                f"{counts[gpu]} application Xids on {gpu} within {minutes:g} min, the node's "
                "only GPU over the rate: NVIDIA's workflow runs the GPU's diagnostics",
                (gpu,) if gpu.startswith(("GPU-", "MIG-")) else (),
            ),
        )
