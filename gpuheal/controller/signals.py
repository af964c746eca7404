"""Signals from outside the node (Alertmanager, manual requests, DCGM metrics),
held in memory until resolved or no longer repeated.

Every replica keeps them (a standby that becomes leader needs no replay for
what it already heard); only the leader acts on them. Losing them in a restart
is safe: Alertmanager repeats firing alerts, and the GPUFault record of a
signal already acted on makes the repeat a duplicate.

What is lost must not read as "cleared", though: a source that polls (DCGM) is
*expected* from the start and *settled* by its first complete look, and until then
the plan starts no recovery for the faults it reported (`unsettled`), so a restarted
or newly elected controller does not release a node before it has asked again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol

from gpuheal.model import FaultSignal


class SignalPort(Protocol):
    """What a pushed source of the controller's own (the DCGM poller, the hygiene
    loop, the idle-node sweep) does with what it finds: one named part in place of
    four loose callbacks. The controller's is `ControllerIntake.port(source)`."""

    def submit(self, signal: FaultSignal) -> bool:
        """Hold the signal and queue its node; False for a repeat of one held."""
        ...

    def resolve(self, node: str, fault_id: str) -> int:
        """Drop the node's signal of that fault; how many were dropped."""
        ...

    def managed(self, node: str) -> bool:
        """gpuheal acts on the node (known and not opted out): a finding elsewhere is
        not submitted."""
        ...

    def settled(self) -> None:
        """The source has looked at everything once: what it does not report now is
        not there (until then its silence ends no fault)."""
        ...


@dataclass
class _Held:
    signal: FaultSignal
    last_seen: float


class ExternalSignals:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._by_node: dict[str, dict[str, _Held]] = {}
        self._lock = threading.Lock()
        self._unsettled: set[str] = set()

    def expect(self, source: str) -> None:
        """`source` will report what it sees; until `settled`, its silence is no news."""
        with self._lock:
            self._unsettled.add(source)

    def settled(self, source: str) -> None:
        with self._lock:
            self._unsettled.discard(source)

    def unsettled(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._unsettled)

    def add(self, signal: FaultSignal, now: float | None = None) -> bool:
        """Remember a signal; True if it is new (not a repeat)."""
        seen = time.monotonic() if now is None else now
        with self._lock:
            faults = self._by_node.setdefault(signal.node, {})
            held = faults.get(signal.fault_id)
            if held is not None:
                held.last_seen = seen
                return False
            faults[signal.fault_id] = _Held(signal, seen)
            return True

    def resolve(self, node: str, fault_id: str) -> bool:
        with self._lock:
            faults = self._by_node.get(node, {})
            return faults.pop(fault_id, None) is not None

    def active(self, node: str, now: float | None = None) -> tuple[FaultSignal, ...]:
        with self._lock:
            return tuple(h.signal for h in self._current(node, now).values())

    def _current(self, node: str, now: float | None) -> dict[str, _Held]:
        """The node's signals that have not expired (the expired ones are dropped)."""
        current = time.monotonic() if now is None else now
        faults = self._by_node.get(node, {})
        for fault_id in [f for f, h in faults.items() if current - h.last_seen >= self.ttl_s]:
            del faults[fault_id]
        if not faults:
            self._by_node.pop(node, None)
        return faults

    def expires_in(self, node: str, now: float | None = None) -> float | None:
        """Seconds until the node's next held signal expires (None: it holds none).

        The node's reconcile asks for this and is queued again at that moment, so
        a fault known only from an alert ends when its signal does, not at the
        next event that happens to touch the node."""
        current = time.monotonic() if now is None else now
        with self._lock:
            faults = self._current(node, current)
            if not faults:
                return None
            return min(h.last_seen for h in faults.values()) + self.ttl_s - current

    def nodes(self) -> list[str]:
        with self._lock:
            return [n for n, faults in self._by_node.items() if faults]
