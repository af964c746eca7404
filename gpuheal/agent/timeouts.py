"""Run a probe with a deadline, so a hung driver call cannot hang the agent."""

from __future__ import annotations

import threading
from collections.abc import Callable

from gpuheal.agent.findings import ProbeResult


class GuardedProbe:
    """Runs `call` in its own thread and waits at most `timeout_s`.

    A call that overruns keeps its thread (a hung ioctl cannot be interrupted);
    until it returns, later rounds report the probe as not run instead of
    piling up more stuck threads.
    """

    def __init__(
        self, name: str, call: Callable[[], ProbeResult], timeout_s: float, *, level: bool
    ) -> None:
        self.name = name
        self.level = level
        self.call = call
        self.timeout_s = timeout_s
        self._running: threading.Thread | None = None
        self._result: ProbeResult | None = None

    def run(self) -> ProbeResult:
        if self._running is not None and self._running.is_alive():
            return ProbeResult(
                self.name, level=self.level, ran=False, error="previous call still hung"
            )
        self._result = None

        def target() -> None:
            try:
                self._result = self.call()
            except Exception as err:
                self._result = ProbeResult(
                    self.name, level=self.level, ran=False, error=f"{type(err).__name__}: {err}"
                )

        thread = threading.Thread(target=target, name=f"probe-{self.name}", daemon=True)
        self._running = thread
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            return ProbeResult(
                self.name, level=self.level, ran=False, error=f"timed out after {self.timeout_s:g}s"
            )
        return self._result or ProbeResult(
            self.name, level=self.level, ran=False, error="no result"
        )
