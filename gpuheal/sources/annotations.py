"""The node-annotation contract (docs/agent.md, "Reporting"): the agent writes the
fault it reports on its own Node as annotations, the controller reads them back.
This is the contract's one codec: its keys, the agent's encoding of a report, the
agent's reading of its own earlier report after a restart, and the policy's
decoding of whatever the annotations say (a person's `kubectl annotate` too) into
a FaultSignal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuheal import values
from gpuheal.clock import parse_time
from gpuheal.model import (
    ANNOTATION_PREFIX,
    FAULT_DEVICES,
    FAULT_ID,
    FAULT_REASON,
    FAULT_SEVERITY,
    FAULT_TIME,
    STATUS,
    STATUS_FAULTY,
    FaultSignal,
    Severity,
)
from gpuheal.sources.base import Seen

SOURCE = "node-annotation"
OWN = True

# Every annotation of the contract, in the order the agent writes them.
KEYS = (STATUS, FAULT_ID, FAULT_TIME, FAULT_REASON, FAULT_DEVICES, FAULT_SEVERITY)


@dataclass(frozen=True)
class Annotated:
    """A fault as the annotations carry it."""

    fault_id: str
    fault_time: str
    reason: str
    devices: tuple[str, ...]
    severity: Severity = Severity.P0


def encode(fault: Annotated | None) -> dict[str, str | None]:
    """The annotations that say `fault`, every key of the contract (None: absent,
    as every key is when no fault is reported)."""
    if fault is None:
        return dict.fromkeys(KEYS)
    return {
        STATUS: STATUS_FAULTY,
        FAULT_ID: fault.fault_id,
        FAULT_TIME: fault.fault_time,
        FAULT_REASON: fault.reason,
        FAULT_DEVICES: ",".join(fault.devices),
        FAULT_SEVERITY: fault.severity.value,
    }


def written(annotations: Mapping[str, str]) -> Annotated | None:
    """The fault the agent itself wrote, as it wrote it (the agent continues it
    after a restart, with the same id); None when none is reported."""
    if annotations.get(STATUS) != STATUS_FAULTY or not annotations.get(FAULT_ID):
        return None
    return Annotated(
        annotations[FAULT_ID],
        annotations.get(FAULT_TIME, ""),
        annotations.get(FAULT_REASON, ""),
        tuple(d for d in annotations.get(FAULT_DEVICES, "").split(",") if d),
        Severity.written(annotations.get(FAULT_SEVERITY, "")),
    )


def signals(seen: Seen) -> tuple[FaultSignal, ...]:
    found = decode(seen.node.name, seen.node.annotations)
    return (found,) if found is not None else ()


def decode(node: str, ann: Mapping[str, str]) -> FaultSignal | None:
    """The contract's fault, each value as gpuheal can write it; None when the node
    reports none. Anyone with `kubectl annotate` can write these: what does not fit
    is normalized (the fault is never dropped for it) and named in `altered`, the
    original stays on the node. A severity that is not P0, P1 or P2 is taken as P0:
    acting on a fault someone meant to be mild is the error that can be undone,
    ignoring a severe one is not."""
    if ann.get(STATUS) != STATUS_FAULTY or not ann.get(FAULT_ID, "").strip():
        return None
    raw = {
        FAULT_ID: ann[FAULT_ID],
        FAULT_REASON: ann.get(FAULT_REASON) or "Unspecified",
        FAULT_TIME: ann.get(FAULT_TIME, ""),
    }
    listed = [d.strip() for d in ann.get(FAULT_DEVICES, "").split(",") if d.strip()]
    devices = tuple(values.text(d) for d in listed[: values.DEVICES_MAX])
    kept = {
        FAULT_ID: values.fault_id(raw[FAULT_ID]),
        FAULT_REASON: values.text(raw[FAULT_REASON]),
        FAULT_TIME: raw[FAULT_TIME] if _is_time(raw[FAULT_TIME]) else "",
    }
    altered = [k.removeprefix(ANNOTATION_PREFIX) for k in raw if kept[k] != raw[k].strip()]
    if devices != tuple(listed):
        altered.append(FAULT_DEVICES.removeprefix(ANNOTATION_PREFIX))
    severity = _severity(ann.get(FAULT_SEVERITY))
    if severity is None:
        altered.append(FAULT_SEVERITY.removeprefix(ANNOTATION_PREFIX))
    return FaultSignal(
        node=node,
        fault_id=kept[FAULT_ID],
        reason=kept[FAULT_REASON],
        source=SOURCE,
        severity=severity or Severity.P0,
        detected_at=kept[FAULT_TIME],
        devices=devices,
        altered=tuple(altered),
    )


def _severity(value: str | None) -> Severity | None:
    """The annotated severity (any case, P0 when absent or empty), None when it is none."""
    if value is None or not value.strip():
        return Severity.P0
    try:
        return Severity(value.strip().upper())
    except ValueError:
        return None


def _is_time(value: str) -> bool:
    return not value or (len(value) <= values.TIME_MAX and parse_time(value) is not None)
