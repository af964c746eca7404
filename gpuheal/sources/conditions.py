"""Node conditions as a fault source: any detector's condition on the Node that a
configured rule (`conditions:` in the config) says is a fault."""

from __future__ import annotations

import hashlib

from gpuheal import values
from gpuheal.model import FaultSignal
from gpuheal.sources.base import Seen

SOURCE = "node-condition"
OWN = True


def signals(seen: Seen) -> tuple[FaultSignal, ...]:
    """The first configured rule's fault that the node's conditions match. Its fault
    id is derived from the condition's type and lastTransitionTime, so the same
    transition seen again is the same fault."""
    node = seen.node
    for rule in seen.config.conditions:
        cond = node.condition(rule.type)
        if cond is None or not rule.matches(cond.type, cond.status, cond.reason):
            continue
        digest = hashlib.sha256(f"{cond.type}\x00{cond.last_transition_time}".encode()).hexdigest()[
            :10
        ]
        signal = FaultSignal(
            node=node.name,
            fault_id=f"cond-{cond.type.lower()}-{digest}",
            reason=values.text(rule.fault_reason or cond.reason or cond.type),
            source=values.text(f"{SOURCE}/{cond.type}"),
            severity=rule.severity,
            detected_at=cond.last_transition_time,
        )
        return (signal,)
    return ()
