"""Device escalation as a fault source: device faults that the device plan escalated
(policy/devices.py, an `escalate` entry on a device record) stand for one
node-level fault, while one of them is open. Only with device health on."""

from __future__ import annotations

from collections.abc import Iterable

from gpuheal.model import ActionEntry, FaultRecord, FaultSignal, Severity
from gpuheal.sources.base import Seen
from gpuheal.vocabulary import Entry

SOURCE = "device-health"
OWN = False

REASON = "DeviceEscalation"


def signals(seen: Seen) -> tuple[FaultSignal, ...]:
    if not seen.config.device_health.enabled:
        return ()
    found = escalation_signal(seen.records)
    return (found,) if found is not None else ()


def escalation_signal(records: Iterable[FaultRecord]) -> FaultSignal | None:
    """The node-level fault that escalated device faults stand for, while one is open.

    Its id comes from the first escalated record (stable while it stays open) and is a
    valid taint value (the record name's digest: no '#', under 63 characters).
    """
    escalated = sorted(
        (r for r in records if r.device_scope and r.open and _escalation(r) is not None),
        key=lambda r: (r.created_at, r.name),
    )
    if not escalated:
        return None
    first = escalated[0]
    entry = _escalation(first)
    return FaultSignal(
        node=first.node,
        fault_id=f"devices-{first.name[-12:]}",
        reason=REASON,
        source=SOURCE,
        severity=Severity.P0,
        detected_at=entry.time if entry else first.created_at,
    )


def _escalation(record: FaultRecord) -> ActionEntry | None:
    return next((a for a in reversed(record.actions) if a.action == Entry.ESCALATE), None)
