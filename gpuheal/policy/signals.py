"""Turn what a node says (agent annotations, any detector's conditions) into a fault signal."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from gpuheal import values
from gpuheal.config import Config
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
    NodeView,
    Severity,
)
from gpuheal.policy.clock import parse_time

SOURCE_ANNOTATION = "node-annotation"
SOURCE_CONDITION = "node-condition"


def fault_signal(node: NodeView, config: Config) -> FaultSignal | None:
    """The fault a node reports now, or None when it reports none.

    The agent's annotations win; otherwise the first configured condition rule
    that matches. A condition's fault id is derived from its type and
    lastTransitionTime, so the same transition seen again is the same fault.
    """
    ann = node.annotations
    if ann.get(STATUS) == STATUS_FAULTY and ann.get(FAULT_ID, "").strip():
        return _annotated(node.name, ann)
    for rule in config.conditions:
        cond = node.condition(rule.type)
        if cond is None or not rule.matches(cond.type, cond.status, cond.reason):
            continue
        digest = hashlib.sha256(f"{cond.type}\x00{cond.last_transition_time}".encode()).hexdigest()[
            :10
        ]
        return FaultSignal(
            node=node.name,
            fault_id=f"cond-{cond.type.lower()}-{digest}",
            reason=values.text(rule.fault_reason or cond.reason or cond.type),
            source=values.text(f"{SOURCE_CONDITION}/{cond.type}"),
            severity=rule.severity,
            detected_at=cond.last_transition_time,
        )
    return None


def _annotated(node: str, ann: Mapping[str, str]) -> FaultSignal:
    """The agent contract's fault, each value as gpuheal can write it. Anyone with
    `kubectl annotate` can write these: what does not fit is normalized (the fault
    is never dropped for it) and named in `altered`, the original stays on the node.
    A severity that is not P0, P1 or P2 is taken as P0: acting on a fault someone
    meant to be mild is the error that can be undone, ignoring a severe one is not."""
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
        source=SOURCE_ANNOTATION,
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
