"""The agent's event intake: Xids from the kernel log and from NVML's events,
the kernel's other lines (a GPU off the bus, an NVSwitch SXid, a NIC), each
classified with its context and held as a finding until the boot ends
(sticky.py). The rounds (app.py) read what is held with `findings`."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

from gpuheal.agent.config import AgentConfig
from gpuheal.agent.facts import Counters
from gpuheal.agent.findings import ProbeFinding, ProbeResult
from gpuheal.agent.kmsg import GpuAt, KernelEvent, OffTheBus, SxidEvent, XidEvent
from gpuheal.agent.nvml import xid_finding
from gpuheal.agent.sticky import StickyEvents
from gpuheal.agent.xids import RateRule, XidHistory
from gpuheal.metrics.agent import AgentMetrics
from gpuheal.xid import VERSION as XID_CATALOGUE_VERSION
from gpuheal.xid import classify, needs_line
from gpuheal.xid.lines import OFF_THE_BUS_REASON, OFF_THE_BUS_SEVERITY
from gpuheal.xid.nic import NicEvent
from gpuheal.xid.sxid import classify_sxid

log = logging.getLogger(__name__)

# The two sources of Xid events.
KERNEL_LOG, NVML_EVENTS = "kmsg", "nvml"


class EventIntake:
    """Takes the events of both threads (the kernel log's and NVML's) and holds
    the findings they make."""

    def __init__(
        self,
        config: AgentConfig,
        node: str,
        sticky: StickyEvents,
        *,
        metrics: AgentMetrics,
        counters: Counters,
        driver: Callable[[], str],
        by_pci: Callable[[str], str | None],
    ) -> None:
        self.config = config
        self.node = node
        self.sticky = sticky
        self.metrics = metrics
        self.counters = counters  # the health gate's GPU error counters
        self.driver = driver  # the driver's version, for NVLink5 Xids' layout
        self.by_pci = by_pci  # NVML's PCI address -> GPU UUID, when it is loaded
        self.history = XidHistory(
            config.xid_context_seconds,
            RateRule(config.application_xids_per_gpu, config.application_xids_window_seconds),
        )
        self.pci_to_uuid: dict[str, str] = {}  # from the kernel's own lines
        self.kernel_log = False  # set when the kernel log is followed

    def findings(self) -> tuple[ProbeResult, ...]:
        """What the events hold now: the sticky faults, and applications' Xids past
        their rate."""
        rate = self.history.rate_findings(time.monotonic())
        return (
            ProbeResult("events", ran=True, findings=self.sticky.current()),
            ProbeResult("application-xids", ran=True, findings=rate),
        )

    def on_nvml_xid(self, xid: int, device: str) -> None:
        if xid == 154:
            return  # the NVML probe reads the recovery action itself, every round
        if self.kernel_log and needs_line(xid):
            # NVIDIA decodes it from the kernel line's fields, which NVML's event lacks:
            # the kernel log's copy of the same Xid decides.
            self.metrics.xids.labels(str(xid)).inc()
            return
        self.xid(xid, device, source=NVML_EVENTS)

    def on_kernel(self, event: KernelEvent) -> None:
        match event:
            case GpuAt(pci=pci, uuid=gpu):
                self.pci_to_uuid[pci] = gpu
            case XidEvent(xid=xid, pci=pci, recovery_action=action):
                self.xid(xid, self.uuid_for(pci), action, detail=event.detail)
            case OffTheBus(pci=pci):
                gpu = self.uuid_for(pci) if pci else ""
                self.sticky.add(
                    ProbeFinding(
                        OFF_THE_BUS_REASON,
                        OFF_THE_BUS_SEVERITY,
                        f"{gpu or 'a GPU'} has fallen off the bus",
                        (gpu,) if gpu else (),
                        immediate=True,
                    )
                )
            case NicEvent():
                self._nic(event)
            case SxidEvent(sxid=sxid, switch=switch, fatal=fatal):
                # The guide's table over the line's word (gpuheal/xid/sxid.py).
                row = classify_sxid(sxid, fatal)
                self.metrics.sxids.labels(str(sxid), row.kind.value).inc()
                if row.node_fault:
                    said = f"{switch}: {row.description}"  # names the SXid
                    self.sticky.add(ProbeFinding(row.reason, row.severity, said, (switch,)))

    def xid(
        self,
        xid: int,
        device: str,
        recovery_action: int | None = None,
        *,
        detail: str = "",
        source: str = KERNEL_LOG,
    ) -> None:
        """One Xid from either event source, classified with its context: the line's
        fields, the GPU's other Xids just before, the driver version."""
        now = time.monotonic()
        recent = self.history.recent(device, now)
        row = classify(
            xid,
            self.config.xid_overrides,
            recovery_action,
            detail=detail,
            recent=recent,
            driver=self.driver(),
        )
        if not self.history.add(device, xid, row.kind, now, source):
            return  # the other event source's copy of an Xid just seen
        self.metrics.xids.labels(str(xid)).inc()
        if row.application:
            self.metrics.application_xids.labels(device or "unknown", str(xid)).inc()
        if not row.catalogued:
            self.metrics.uncatalogued_xids.labels(str(xid)).inc()
        if row.node_fault:
            # A GPU error for the health gate's counters; an application's is not one.
            self.counters.xid(dt.datetime.now(dt.UTC))
            self.sticky.add(xid_finding(xid, device, row))
        log.warning(
            "xid",
            extra={
                "node": self.node,
                "xid": xid,
                "gpu": device,
                "reason": row.reason,
                "severity": row.severity.value,
                "kind": row.kind.value,
                "nvidia": row.nvidia,
                "catalogue": XID_CATALOGUE_VERSION,
            },
        )

    def _nic(self, event: NicEvent) -> None:
        """A NIC's fault holds the node like an Xid (until reboot or xidHoldSeconds);
        a transmit timeout the driver recovers from is counted and said, no more."""
        self.metrics.nic_errors.labels(event.reason).inc()
        if event.node_fault:
            devices = (event.device,) if event.device else ()
            self.sticky.add(ProbeFinding(event.reason, event.severity, event.text, devices))
        else:
            log.warning(
                "NIC warning",
                extra={"node": self.node, "reason": event.reason, "detail": event.text},
            )

    def uuid_for(self, pci: str) -> str:
        if pci in self.pci_to_uuid:
            return self.pci_to_uuid[pci]
        return self.by_pci(pci) or pci
