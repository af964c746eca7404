"""Background tasks by key, at most one running per key: the leader's long-running
work (a roll-out, a node's maintenance request) each in a task of its own, under
the controller's supervisor (a crash is said, counted under the prefix, and the
task restarted after a backoff), started again only once the last one for that
key has ended, all cancelled together when leadership ends."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from gpuheal.supervisor import Supervisor


class KeyedTasks:
    def __init__(self, prefix: str, supervisor: Supervisor) -> None:
        self.prefix = prefix
        self.supervisor = supervisor
        self._keys: set[str] = set()

    def _name(self, key: str) -> str:
        return f"{self.prefix}-{key}"

    def ensure(self, key: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start `work` for `key` unless a task for it is still running."""
        if not self.running(key):
            self._keys.add(key)
            self.supervisor.spawn(self._name(key), work, kind=self.prefix)

    def running(self, key: str) -> bool:
        return self.supervisor.running(self._name(key))

    async def cancel_all(self) -> None:
        keys, self._keys = self._keys, set()
        await self.supervisor.stop(*(self._name(k) for k in keys))
