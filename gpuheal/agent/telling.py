"""What each round of the agent says besides its verdict: its warnings (P2
findings: never a fault, never silently dropped) as a gauge and a log line when
one starts or ends; each GPU's use as gauges; what the agent reaches (NVML, the
GPUs, the kernel log), logged at start and whenever it changes."""

from __future__ import annotations

import logging

from gpuheal.agent.findings import ProbeResult
from gpuheal.agent.nvml import NvmlProbe
from gpuheal.metrics.agent import AgentMetrics
from gpuheal.model import Severity
from gpuheal.policy import access

log = logging.getLogger(__name__)


class Telling:
    def __init__(self, metrics: AgentMetrics, node: str) -> None:
        self.metrics = metrics
        self.node = node
        self._warned: set[tuple[str, str]] = set()  # (reason, device) warned of last round
        self._access = ""  # the last agent-access value logged

    def warnings(self, results: list[ProbeResult]) -> None:
        """The round's warnings (P2 findings) as a gauge, and a log line when one
        starts or ends: they never fault the node, and are never silently dropped."""
        now = {
            (f.reason, device): f.message
            for r in results
            for f in r.findings
            if f.severity is Severity.P2
            for device in (f.devices or ("",))
        }
        for reason, device in now.keys() - self._warned:
            detail = now[reason, device]
            extra = {"node": self.node, "reason": reason, "device": device, "detail": detail}
            log.warning("warning", extra=extra)
        for reason, device in self._warned - now.keys():
            extra = {"node": self.node, "reason": reason, "device": device}
            log.info("warning cleared", extra=extra)
        self.metrics.warnings.clear()
        for reason, device in now:
            self.metrics.warnings.labels(reason, device).set(1)
        self._warned = set(now)

    def usage(self, nvml: NvmlProbe | None) -> None:
        """Each GPU's utilisation, memory in use and processes, as gauges."""
        if nvml is None:
            return
        gauges = (self.metrics.gpu_utilization, self.metrics.gpu_memory_used)
        for gauge in (*gauges, self.metrics.gpu_processes):
            gauge.clear()
        for gpu, seen in nvml.last_readings.items():
            if seen.utilization_percent is not None:
                self.metrics.gpu_utilization.labels(gpu).set(seen.utilization_percent / 100)
            if seen.memory_used_bytes is not None and seen.memory_total_bytes:
                used = seen.memory_used_bytes / seen.memory_total_bytes
                self.metrics.gpu_memory_used.labels(gpu).set(used)
        for gpu, count in nvml.processes_by_gpu.items():
            self.metrics.gpu_processes.labels(gpu).set(count)

    def access(self, now: access.Access, problems: tuple[access.Problem, ...]) -> None:
        """Log what the agent reaches at start and whenever it changes."""
        value = access.encode(now)
        if value == self._access:
            return
        self._access = value
        (log.warning if problems else log.info)(
            "agent access",
            extra={
                "node": self.node,
                "access": value,
                "problems": [p.reason for p in problems],
                "detail": "; ".join(p.message for p in problems),
            },
        )
