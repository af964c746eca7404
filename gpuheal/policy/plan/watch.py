"""Faults recorded but not acted on: a P1 fault inside its observation window
(`p1EscalationSeconds`), and every fault in observe mode. A watched P1 that
lasts, or worsens to P0, escalates once and is handled as P0 from then on."""

from __future__ import annotations

import datetime as dt

from gpuheal.config import Config
from gpuheal.model import FaultRecord, FaultSignal, Mode, Phase, Severity
from gpuheal.policy.actions import Action, Emit, Plan, UpdateRecord, WouldQuarantine
from gpuheal.policy.history import opened_at
from gpuheal.policy.plan.fault import Fault, entry, plan_with, planned
from gpuheal.policy.plan.fence import p1_fence, quarantines
from gpuheal.vocabulary import Entry, Reason


def escalated(record: FaultRecord | None, config: Config, now: dt.datetime) -> bool:
    """A P1 fault is handled as P0 once it has lasted the observation window, or
    once its record says it escalated (it worsened to P0 meanwhile)."""
    if record is None:
        return False
    if any(a.action == Entry.ESCALATE for a in record.actions):
        return True
    since = opened_at(record)
    return since is not None and (now - since).total_seconds() >= config.p1_escalation_seconds


def watching(
    record: FaultRecord | None, signal: FaultSignal, config: Config, now: dt.datetime
) -> bool:
    """A P1 fault inside its observation window: recorded and told, not acted on.

    Only a fault first recorded as P1 is watched: one recorded as P0 that is now
    reported as P1 has been acted on already and is not un-escalated."""
    if signal.severity is not Severity.P1:
        return False
    return record is None or (record.severity is Severity.P1 and not escalated(record, config, now))


def escalation(fault: Fault, config: Config, now: dt.datetime) -> list[Action]:
    """Said once, in the record and an Event, when a watched P1 fault is acted on."""
    record, signal = fault.record, fault.signal
    if (
        record.severity is not Severity.P1
        or fault.mode is Mode.OBSERVE
        or any(a.action == Entry.ESCALATE for a in record.actions)
    ):
        return []
    why = (
        f"now reported {signal.severity}"
        if signal.severity is Severity.P0
        else f"still present after {config.p1_escalation_seconds:g}s"
    )
    return [
        UpdateRecord(record.name, record.phase, entry(now, Entry.ESCALATE, detail=why)),
        Emit(
            Reason.ESCALATED,
            f"P1 fault {signal.fault_id} ({signal.reason}) {why}: handled as P0",
            signal.node,
            record.name,
            warning=True,
        ),
    ]


def watched(
    fault: Fault, config: Config, now: dt.datetime, actions: list[Action], base: Plan
) -> Plan:
    """A recorded P1 fault inside its window: looked at again when the window ends;
    fenced NoSchedule meanwhile with `p1Taint`."""
    created = opened_at(fault.record) or now
    remaining = config.p1_escalation_seconds - (now - created).total_seconds()
    fence = p1_fence(fault, config, now)
    return plan_with(
        base,
        actions,
        fence=fence,
        suppressed=None if fence else "watching",
        requeue_after=max(remaining, 0.1),
        new_quarantine=quarantines(fault, fence),
    )


def would_quarantine(fault: Fault, config: Config, now: dt.datetime) -> WouldQuarantine:
    """Observe mode: what quarantine/full mode would have done, in the record."""
    plan = planned(fault, config)
    return WouldQuarantine(
        fault.record.name,
        Phase.DETECTED,
        entry(now, Entry.WOULD_QUARANTINE, "observe", plan.text()),
        plan=plan,
    )


def p1_pending(fault: Fault, config: Config, now: dt.datetime) -> float | None:
    """Observe mode, a P1 fault: seconds until it would escalate (and count as a
    would-quarantine); None when that is not to come."""
    record, signal = fault.record, fault.signal
    if signal.severity is not Severity.P1 or any(
        a.action == Entry.WOULD_QUARANTINE for a in record.actions
    ):
        return None
    since = opened_at(record) or now
    return max(config.p1_escalation_seconds - (now - since).total_seconds(), 0.1)


def observed(
    fault: Fault, config: Config, now: dt.datetime, actions: list[Action], base: Plan
) -> Plan:
    """An open fault in observe mode: recorded; a P1 that outlasts its window (or
    worsens) is noted as a would-quarantine once. Nothing on the node."""
    record, signal = fault.record, fault.signal
    noted = any(a.action == Entry.WOULD_QUARANTINE for a in record.actions)
    if not noted and signal.severity is not Severity.P2:
        if signal.severity is Severity.P0 or escalated(record, config, now):
            actions.append(would_quarantine(fault, config, now))
            return plan_with(base, actions)
        wait = p1_pending(fault, config, now)
        return plan_with(base, actions, suppressed="observed", requeue_after=wait)
    return plan_with(base, actions, suppressed="observed")
