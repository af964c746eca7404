"""Fleet hygiene's findings as fault signals: the pushed source `hygiene`.

A hygiene finding that leaves a node's GPUs unusable to new pods (zero
allocatable, GPUs withdrawn by the device plugin, no device plugin: the kinds of
model.HYGIENE_SIGNAL_KINDS) is a fault when `hygiene.signals` names its kind, once
it has lasted `hygiene.signalAfterSeconds`. The controller's hygiene loop
(controller/hygiene.py) times the findings and submits what `signal_for` makes of
them; this module decides names and severities only.

A fault is named by its kind and the moment it began, so a present finding keeps
its fault through a controller restart: the new leader adopts the open record's
fault id (`adopted`) rather than timing the finding anew.

Pure: no I/O, no clock reads.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from gpuheal.clock import iso
from gpuheal.model import (
    ALLOCATABLE_DROP,
    DEVICE_PLUGIN_MISSING,
    ZERO_ALLOCATABLE,
    FaultRecord,
    FaultSignal,
    Severity,
)
from gpuheal.sources.base import Seen, claimed
from gpuheal.values import label_value

SOURCE = "hygiene"
OWN = False

# The record's reason for each kind.
REASONS = {
    ZERO_ALLOCATABLE: "GPUsNotAllocatable",
    ALLOCATABLE_DROP: "GPUsWithdrawn",
    DEVICE_PLUGIN_MISSING: "DevicePluginMissing",
}


def signals(seen: Seen) -> tuple[FaultSignal, ...]:
    return claimed(SOURCE, seen)


def source_of(kind: str) -> str:
    """What the record says in `source`: `hygiene/<kind>`."""
    return f"{SOURCE}/{kind}"


def fault_id(kind: str, since: dt.datetime) -> str:
    """`hygiene-<kind>-<UTC start>`: 44 characters at most, a valid label value."""
    return label_value(f"{SOURCE}-{kind}-{since.astimezone(dt.UTC).strftime('%Y%m%d%H%M%S')}")


def signal_for(
    node: str, kind: str, severity: Severity, fault: str, since: dt.datetime
) -> FaultSignal:
    return FaultSignal(
        node=node,
        fault_id=fault,
        reason=REASONS[kind],
        source=source_of(kind),
        severity=severity,
        detected_at=iso(since, "seconds"),
    )


def adopted(records: Iterable[FaultRecord], node: str, kind: str) -> FaultRecord | None:
    """The node's open record of this kind's signal: a restarted controller's finding
    is that fault still, not a new one."""
    source = source_of(kind)
    return next(
        (r for r in records if r.node == node and r.source == source and r.open),
        None,
    )
