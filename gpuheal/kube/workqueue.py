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
    ) -> None:
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
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
        return len(self._queue)

    def set_backoff(self, base_s: float, max_s: float) -> None:
        """Take a reloaded config's backoff; keys already waiting keep their delay."""
        self._base, self._max = base_s, max_s

    def pending(self, key: str) -> float | None:
        """Seconds until the key's delayed add, or None if none is pending."""
        timer = self._timers.get(key)
        if timer is None:
            return None
        return max(timer.when() - asyncio.get_running_loop().time(), 0.0)

    def add(self, key: str) -> None:
        self.adds += 1
        timer = self._timers.pop(key, None)
        if timer:
            timer.cancel()
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            self.coalesced += 1
            return
        self._queued.add(key)
        self._queue.append(key)
        asyncio.get_running_loop().create_task(self._notify())

    def add_after(self, key: str, delay_s: float) -> None:
        if delay_s <= 0:
            self.add(key)
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
            await self._wakeup.wait_for(lambda: bool(self._queue))
            key = self._queue.popleft()
            self._queued.discard(key)
            self._processing.add(key)
            return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def shutdown(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
