"""Run a probe with a deadline, so a hung driver call cannot hang the agent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpuheal.agent.findings import ProbeFinding, ProbeResult
from gpuheal.model import Severity

UNRESPONSIVE = "DriverUnresponsive"


class GuardedProbe:
    """Runs `call` in its own thread and waits at most `timeout_s`.

    A call that overruns keeps its thread (a hung ioctl cannot be interrupted);
    until it returns, later rounds report the probe as not run instead of
    piling up more stuck threads. The result says it is hung; once one call has
    been hung for `fault_after_s` (0: never), the driver is unresponsive: a P1
    finding, for a driver that answers nothing runs no CUDA work either.
    """

    def __init__(
        self,
        name: str,
        call: Callable[[], ProbeResult],
        timeout_s: float,
        *,
        level: bool,
        fault_after_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.level = level
        self.call = call
        self.timeout_s = timeout_s
        self.fault_after_s = fault_after_s
        self.clock = clock
        self._running: threading.Thread | None = None
        self._started = 0.0
        self._result: ProbeResult | None = None

    def _hung(self, error: str) -> ProbeResult:
        hung_s = self.clock() - self._started
        found: tuple[ProbeFinding, ...] = ()
        if self.fault_after_s and hung_s >= self.fault_after_s:
            what = f"{self.name}: a driver call has not returned for {hung_s:.0f}s"
            found = (ProbeFinding(UNRESPONSIVE, Severity.P1, what),)
        return ProbeResult(
            self.name, level=self.level, ran=False, error=error, hung=True, findings=found
        )

    def run(self) -> ProbeResult:
        if self._running is not None and self._running.is_alive():
            return self._hung("previous call still hung")
        self._result = None
        self._started = self.clock()

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
            return self._hung(f"timed out after {self.timeout_s:g}s")
        return self._result or ProbeResult(
            self.name, level=self.level, ran=False, error="no result"
        )
