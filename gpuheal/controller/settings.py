"""The controller's running configuration, one way to each part: a part reads
`current()` where it needs a value, or subscribes and is told each new one (a
part that keeps values from it: the queue's backoff, a signal's time to live,
the notification sinks, ...). A reload replaces it, then tells the subscribers
in the order they subscribed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from gpuheal.config import Config


class Settings:
    def __init__(self, config: Config) -> None:
        self._config = config
        self._subscribers: list[Callable[[Config], object]] = []

    def current(self) -> Config:
        return self._config

    def subscribe(self, told: Callable[[Config], object]) -> None:
        """`told(config)` on every replacement from now on."""
        self._subscribers.append(told)

    def replace(self, config: Config) -> None:
        self._config = config
        for told in self._subscribers:
            told(config)


async def watch_file(path: Path, hangup: asyncio.Event, reload: Callable[[Path], object]) -> None:
    """Reload on SIGHUP, or when the file changes (a ConfigMap update swaps it)."""

    def stamp() -> tuple[float, int]:
        try:
            info = path.stat()
        except OSError:
            return (0.0, 0)
        return (info.st_mtime, info.st_ino)

    seen = stamp()
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(hangup.wait(), timeout=5.0)
        current = stamp()
        if hangup.is_set() or current != seen:
            hangup.clear()
            seen = current
            reload(path)
