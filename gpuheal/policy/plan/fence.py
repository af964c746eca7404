"""The fence stage: our taint on the fault's node, said in its record.

A person's untaint of a node we fenced wins (it is noted once and the fault goes
no further); a node fenced for an earlier fault is carried over to this one; a
watched P1 fault's NoSchedule taint (`p1Taint`) becomes the configured effect once
it is handled as P0; a fault that returns while its node recovers is quarantined
again."""

from __future__ import annotations

import datetime as dt

from gpuheal import values
from gpuheal.config import Config
from gpuheal.model import TAINTED_PHASES, Mode, Phase, Severity
from gpuheal.policy.actions import Action, AddTaint, UpdateRecord
from gpuheal.policy.plan.approve import needs_approval
from gpuheal.policy.plan.fault import Fault, entry, may_quarantine, quarantined, taint_noted
from gpuheal.vocabulary import Entry

# The taint a watched P1 fault gets with `p1Taint`: new pods stay off, none leaves.
P1_TAINT_EFFECT = "NoSchedule"


def p1_fence(fault: Fault, config: Config, now: dt.datetime) -> list[Action]:
    """With `p1Taint`: a watched P1 fault's node gets a NoSchedule taint (new pods
    stay off, running ones stay), within the breaker; nothing when it is full."""
    if not config.p1_taint or fault.mode is Mode.OBSERVE or needs_approval(fault, config):
        return []
    fenced = fault.state.node.taint() is not None or fault.record.phase in TAINTED_PHASES
    if not fenced and not may_quarantine(fault.state, config):
        return []
    actions, _ = fence_step(
        fault, config, now, effect=P1_TAINT_EFFECT, detail="P1 watched: NoSchedule"
    )
    return actions


def quarantines(fault: Fault, fence: list[Action]) -> bool:
    """The fence taints a node that has none of ours: a new quarantine, which the
    rate limit and the breaker lock apply to."""
    return fault.state.node.taint() is None and any(isinstance(a, AddTaint) for a in fence)


def fence_step(
    fault: Fault,
    config: Config,
    now: dt.datetime,
    *,
    effect: str | None = None,
    detail: str = "",
) -> tuple[list[Action], bool]:
    """Actions that make sure our taint is on the node (`effect`: taintEffect unless
    given); True if a person's untaint wins."""
    node, record = fault.state.node, fault.record
    if node.taint() is None and record.phase in TAINTED_PHASES:
        return _untaint_respected(fault, now), True
    actions = _taint(fault, effect or config.taint_effect, detail, now)
    if record.phase is Phase.RECOVERING:
        actions.append(
            UpdateRecord(
                record.name,
                Phase.QUARANTINED,
                entry(now, Entry.FAULT_RETURNED),
                recovering_since="",
            )
        )
    return actions, False


def _untaint_respected(fault: Fault, now: dt.datetime) -> list[Action]:
    """We tainted this node for this fault and a person removed the taint: respected,
    said once."""
    record = fault.record
    if any(a.action == Entry.MANUAL_UNTAINT for a in record.actions):
        return []
    return [
        UpdateRecord(
            record.name,
            record.phase,
            entry(now, Entry.MANUAL_UNTAINT, "respected", "taint removed by hand"),
        )
    ]


def _taint(fault: Fault, effect: str, detail: str, now: dt.datetime) -> list[Action]:
    node, signal, record = fault.state.node, fault.signal, fault.record
    taint = node.taint()
    if taint is None:
        return [
            AddTaint(node.name, signal.fault_id, effect),
            UpdateRecord(record.name, Phase.QUARANTINED, entry(now, Entry.TAINT, detail=detail)),
            quarantined(effect, signal, record.name),
        ]
    if taint.value != values.taint_value(signal.fault_id):
        # Our taint from an earlier fault of this node: carry it over to this one.
        actions: list[Action] = [AddTaint(node.name, signal.fault_id, taint.effect)]
        if record.phase not in TAINTED_PHASES:
            actions.append(UpdateRecord(record.name, Phase.QUARANTINED, entry(now, Entry.TAINT)))
        return actions
    if record.phase not in TAINTED_PHASES:
        # The taint is there but its record does not say so: the fence's pass was
        # the taint alone (Plan.steps), or we stopped between the two.
        return taint_noted(record.name, taint, signal, now)
    if record.severity is Severity.P1 and taint.effect == P1_TAINT_EFFECT != effect:
        # The watched P1's NoSchedule taint (p1Taint), now that it is handled as P0.
        return [
            AddTaint(node.name, signal.fault_id, effect),
            UpdateRecord(
                record.name,
                record.phase,
                entry(now, Entry.TAINT, detail=f"{taint.effect} -> {effect}"),
            ),
        ]
    return []
