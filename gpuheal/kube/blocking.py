"""KubeApi for synchronous callers: the agent's probe loop and the operator CLI.

One client stack for every program: the blocking calls run the same KubeApi
coroutines on a private event loop in a daemon thread, so connection pooling,
credentials and error types are the controller's. Calls from several threads
are safe (each is a coroutine handed to the one loop).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from gpuheal.kube.api import MERGE_PATCH, KubeApi

T = TypeVar("T")


class BlockingKube:
    def __init__(self, connect: Callable[[], KubeApi], *, timeout_s: float = 60.0) -> None:
        """`connect` builds the KubeApi; it runs on the loop's thread because an
        HTTP session belongs to the loop it was made on. `timeout_s` bounds each
        call from the caller's side, on top of the client's own timeouts."""
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kube-client", daemon=True
        )
        self._thread.start()
        self.api: KubeApi = self._run(self._connect(connect))

    @staticmethod
    async def _connect(connect: Callable[[], KubeApi]) -> KubeApi:
        return connect()

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self._loop).result(self.timeout_s)

    def get(self, path: str, params: dict[str, str] | None = None) -> bytes:
        return self._run(self.api.get(path, params))

    def create(self, path: str, body: Any) -> bytes:
        return self._run(self.api.create(path, body))

    def update(self, path: str, body: Any) -> bytes:
        return self._run(self.api.update(path, body))

    def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH) -> bytes:
        return self._run(self.api.patch(path, body, content_type))

    def delete(self, path: str, body: Any = None) -> bytes:
        return self._run(self.api.delete(path, body))

    @property
    def requests(self) -> int:
        return self.api.requests

    def close(self) -> None:
        if not self._loop.is_running():
            return
        self._run(self.api.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
