"""A work queue keyed by node, with controller-runtime's semantics.

- A key queued twice is queued once (duplicate events coalesce).
- A key being processed is never handed to a second worker; if it is added
  meanwhile it is marked dirty and queued again when the first worker is done.
- `add_after` delays a key; the earliest pending delay wins.
- `add` hands a key out now and drops its pending delay: the reconcile it
  starts answers when to look again (level-triggered). So only events that
  mean something may reach `add`: the controller does not queue the echoes
  of its own writes (see controller/handlers.py), and a step that must wait (a refused
  eviction) keeps its schedule in the state it plans from, not in this queue.
- Per-key failure count feeds exponential backoff (base, doubling, capped,
  less up to `jitter` of it); `forget` resets it.
- A key added `behind` waits behind every key added plainly (controller-runtime's
  low priority): a storm's drains start once its nodes are fenced. It is handed
  out anyway once it has waited `behind_max_s`, so a busy queue cannot starve it;
  a plain add of a key waiting behind moves it to the front lane.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable

from gpuheal.policy.backoff import backoff_delay


class WorkQueue:
    def __init__(
        self,
        *,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 60.0,
        jitter: float = 0.0,
        rand: Callable[[], float] = random.random,
        behind_max_s: float = 10.0,
    ) -> None:
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        # The lane behind: (key, when it was added), in order; a key is in one lane only.
        self._behind: deque[tuple[str, float]] = deque()
        self._queued_behind: set[str] = set()
        self._behind_max_s = behind_max_s
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
        self._dirty_ahead: set[str] = set()  # dirty by a plain add: back in the front lane
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._failures: dict[str, int] = {}
        self._wakeup = asyncio.Condition()
        self._base = backoff_base_s
        self._max = backoff_max_s
        self._jitter = jitter
        self._rand = rand
        self.adds = 0
        self.coalesced = 0

    def __len__(self) -> int:
        return len(self._queue) + len(self._behind)

    def set_backoff(self, base_s: float, max_s: float) -> None:
        """Take a reloaded config's backoff; keys already waiting keep their delay."""
        self._base, self._max = base_s, max_s

    def pending(self, key: str) -> float | None:
        """Seconds until the key's delayed add, or None if none is pending."""
        timer = self._timers.get(key)
        if timer is None:
            return None
        return max(timer.when() - asyncio.get_running_loop().time(), 0.0)

    def add(self, key: str, *, behind: bool = False) -> None:
        self.adds += 1
        timer = self._timers.pop(key, None)
        if timer:
            timer.cancel()
        if key in self._processing:
            self._dirty.add(key)
            if not behind:
                self._dirty_ahead.add(key)
            return
        if key in self._queued or (behind and key in self._queued_behind):
            self.coalesced += 1
            return
        if key in self._queued_behind:  # a plain add: to the front lane
            self.coalesced += 1
            self._queued_behind.discard(key)
            self._behind = deque(e for e in self._behind if e[0] != key)
        if behind:
            self._queued_behind.add(key)
            self._behind.append((key, asyncio.get_running_loop().time()))
        else:
            self._queued.add(key)
            self._queue.append(key)
        asyncio.get_running_loop().create_task(self._notify())

    def add_after(self, key: str, delay_s: float, *, behind: bool = False) -> None:
        if delay_s <= 0:
            self.add(key, behind=behind)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay_s
        existing = self._timers.get(key)
        if existing and existing.when() <= when:
            return
        if existing:
            existing.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: str) -> float:
        """Requeue after a failure with per-key exponential backoff; returns the delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = backoff_delay(failures, self._base, self._max, jitter=self._jitter, rand=self._rand)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    async def _notify(self) -> None:
        async with self._wakeup:
            self._wakeup.notify()

    async def get(self) -> str:
        async with self._wakeup:
            await self._wakeup.wait_for(lambda: bool(self._queue or self._behind))
            waited = asyncio.get_running_loop().time() - self._behind[0][1] if self._behind else 0.0
            if self._queue and waited < self._behind_max_s:
                key = self._queue.popleft()
                self._queued.discard(key)
            else:
                key, _ = self._behind.popleft()
                self._queued_behind.discard(key)
            self._processing.add(key)
            return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            ahead = key in self._dirty_ahead
            self._dirty_ahead.discard(key)
            self.add(key, behind=not ahead)

    def shutdown(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
