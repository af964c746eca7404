"""What tells the console's pages that the caches changed: a version counter the
controller's informers bump on every event, and a wait for the next bump. The
server-sent events of /console/events come from it, not from the API server."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Any


class ChangeFeed:
    def __init__(self) -> None:
        self.version = 0
        # Names this process's counter: a restarted controller (or another replica
        # behind the same Service) counts from 0 again, and a page must not take
        # its small numbers for old news.
        self.epoch = secrets.token_hex(4)
        self._changed = asyncio.Event()

    def on_change(self, _old: Any, _new: Any) -> None:
        """An informer's change handler: called on the event loop, never blocks."""
        self.version += 1
        # Wake who waits now; who comes later waits for the next change.
        self._changed.set()
        self._changed = asyncio.Event()

    def tag(self, version: int | None = None) -> str:
        """What a page and the event stream say: epoch and version."""
        return f"{self.epoch}.{self.version if version is None else version}"

    async def after(self, version: int, timeout_s: float) -> int:
        """The version once it is past `version`, or as it is after `timeout_s`."""
        if self.version > version:
            return self.version
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        return self.version
