"""Node conditions as a fault source: any detector's condition on the Node that a
configured rule (`conditions:` in the config) says is a fault.

A rule with `message: kernelLog` reads the condition's message as NVIDIA driver
lines, one a line: node-problem-detector's system log monitor puts the kernel log
lines its rule matched there (the monitor config the chart ships, deploy/npd/, makes
such conditions). Each line is parsed by the agent's parser (`gpuheal.xid.lines`)
and classified as the agent classifies it (`gpuheal.xid.classify` with the config's
`xid` rows first, the SXid table): the condition is a fault only if a line is a
node fault, with that line's reason and severity; a message of application Xids
only is no fault. A message with no driver line in it is the rule's own fault, as
without `kernelLog`.

Pure: no I/O, no clock reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from gpuheal import values
from gpuheal.config import MESSAGE_KERNEL_LOG, ConditionRule
from gpuheal.model import Condition, FaultSignal, NodeView, Severity
from gpuheal.sources.base import Seen
from gpuheal.xid import XidRow, classify
from gpuheal.xid.lines import (
    OFF_THE_BUS_REASON,
    OFF_THE_BUS_SEVERITY,
    OffTheBus,
    SxidEvent,
    XidEvent,
    off_bus_opener,
    parse_message,
)
from gpuheal.xid.nic import NicEvent
from gpuheal.xid.sxid import classify_sxid

SOURCE = "node-condition"
OWN = True


@dataclass(frozen=True)
class DriverLine:
    """One NVIDIA driver line of a condition's message, as the agent classifies it."""

    reason: str
    severity: Severity
    devices: tuple[str, ...]  # the GPU's PCI address, the NVSwitch; () when it names none
    text: str

    @property
    def node_fault(self) -> bool:
        return self.severity is not Severity.P2


def _of_row(row: XidRow, devices: tuple[str, ...], text: str) -> DriverLine:
    return DriverLine(row.reason, row.severity, devices, text)


def driver_lines(message: str, overrides: Mapping[int, XidRow]) -> tuple[DriverLine, ...]:
    """The driver lines of a message (node-problem-detector joins the log lines its
    rule matched with newlines), each classified: an Xid by the catalogue (the line's
    detail decodes Xids 74, 144-150 and 154, as on the agent), an SXid by the Fabric
    Manager guide's table, "fallen off the bus" as `GpuFellOffBus`, a NIC's health line
    as the agent reads it (gpuheal/xid/nic.py). Lines that are no
    driver line are skipped; "NVRM: The NVIDIA GPU <pci>" lends its address to a
    "fallen off the bus" line after it that names none."""
    found: list[DriverLine] = []
    opener = ""
    for raw in message.split("\n"):
        event = parse_message(raw)
        if isinstance(event, XidEvent):
            row = classify(event.xid, overrides, event.recovery_action, detail=event.detail)
            found.append(_of_row(row, (event.pci,), event.text))
        elif isinstance(event, SxidEvent):
            found.append(
                _of_row(classify_sxid(event.sxid, event.fatal), (event.switch,), event.text)
            )
        elif isinstance(event, NicEvent):
            devices = (event.device,) if event.device else ()
            found.append(DriverLine(event.reason, event.severity, devices, event.text))
        elif isinstance(event, OffTheBus):
            pci = event.pci or opener
            devices = (pci,) if pci else ()
            found.append(DriverLine(OFF_THE_BUS_REASON, OFF_THE_BUS_SEVERITY, devices, event.text))
        elif event is None:
            opener = off_bus_opener(raw) or opener
    return tuple(found)


def worst_fault(lines: tuple[DriverLine, ...]) -> DriverLine | None:
    """The most severe node-fault line (the first of equals), or None when none is one."""
    faults = [line for line in lines if line.node_fault]
    return min(faults, key=lambda line: line.severity.rank) if faults else None


def _signal(
    node: NodeView,
    cond: Condition,
    reason: str,
    severity: Severity,
    devices: tuple[str, ...] = (),
) -> FaultSignal:
    # The fault id is the condition's type and lastTransitionTime: the same transition
    # seen again (a heartbeat, a restarted controller) is the same fault.
    digest = hashlib.sha256(f"{cond.type}\x00{cond.last_transition_time}".encode()).hexdigest()
    return FaultSignal(
        node=node.name,
        fault_id=f"cond-{cond.type.lower()}-{digest[:10]}",
        reason=values.text(reason),
        source=values.text(f"{SOURCE}/{cond.type}"),
        severity=severity,
        detected_at=cond.last_transition_time,
        devices=devices,
    )


def rule_signal(
    rule: ConditionRule, node: NodeView, cond: Condition, overrides: Mapping[int, XidRow]
) -> FaultSignal | None:
    """The fault a matching condition is under its rule; None when a kernelLog rule's
    message names only lines that are no node fault (application Xids, say)."""
    if rule.message == MESSAGE_KERNEL_LOG:
        lines = driver_lines(cond.message, overrides)
        if lines:
            worst = worst_fault(lines)
            if worst is None:
                return None
            reason = rule.fault_reason or worst.reason
            return _signal(node, cond, reason, worst.severity, worst.devices)
    return _signal(node, cond, rule.fault_reason or cond.reason or cond.type, rule.severity)


def signals(seen: Seen) -> tuple[FaultSignal, ...]:
    """The first configured rule's fault that the node's conditions match."""
    node = seen.node
    for rule in seen.config.conditions:
        cond = node.condition(rule.type)
        if cond is None or not rule.matches(cond.type, cond.status, cond.reason):
            continue
        signal = rule_signal(rule, node, cond, seen.config.xid_overrides)
        if signal is not None:
            return (signal,)
    return ()
