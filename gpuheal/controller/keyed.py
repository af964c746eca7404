"""Background tasks by key, at most one running per key: the leader's long-running
work (a roll-out, a node's maintenance request) each in a task of its own, started
again only once the last one for that key has ended, all cancelled together when
leadership ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any


class KeyedTasks:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def ensure(self, key: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start `work` for `key` unless a task for it is still running."""
        task = self._tasks.get(key)
        if task is None or task.done():
            self._tasks[key] = asyncio.create_task(work(), name=f"{self.prefix}-{key}")

    def running(self, key: str) -> bool:
        task = self._tasks.get(key)
        return task is not None and not task.done()

    async def cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
