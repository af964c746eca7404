"""Turn what a node says (agent annotations, any detector's conditions) into a fault signal."""

from __future__ import annotations

import hashlib

from gpuheal.config import Config
from gpuheal.model import (
    FAULT_DEVICES,
    FAULT_ID,
    FAULT_REASON,
    FAULT_TIME,
    STATUS,
    STATUS_FAULTY,
    FaultSignal,
    NodeView,
    Severity,
)

SOURCE_ANNOTATION = "node-annotation"
SOURCE_CONDITION = "node-condition"


def fault_signal(node: NodeView, config: Config) -> FaultSignal | None:
    """The fault a node reports now, or None when it reports none.

    The agent's annotations win; otherwise the first configured condition rule
    that matches. A condition's fault id is derived from its type and
    lastTransitionTime, so the same transition seen again is the same fault.
    """
    ann = node.annotations
    if ann.get(STATUS) == STATUS_FAULTY and ann.get(FAULT_ID):
        devices = tuple(d.strip() for d in ann.get(FAULT_DEVICES, "").split(",") if d.strip())
        return FaultSignal(
            node=node.name,
            fault_id=ann[FAULT_ID],
            reason=ann.get(FAULT_REASON) or "Unspecified",
            source=SOURCE_ANNOTATION,
            severity=Severity.P0,
            detected_at=ann.get(FAULT_TIME, ""),
            devices=devices,
        )
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
            reason=rule.fault_reason or cond.reason or cond.type,
            source=f"{SOURCE_CONDITION}/{cond.type}",
            severity=rule.severity,
            detected_at=cond.last_transition_time,
        )
    return None
