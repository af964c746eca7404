"""The admit stage: what a reported fault must pass before its node is fenced.

A stale fault id changes nothing; a new fault supersedes the node's older ones
and gets its record (the lock) unless the handled mark or the cooldown stops it;
then the watch (P1, observe mode), approval and the breaker each may stop it.
What passes goes on to the fence (dispatch.advance)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from gpuheal import values
from gpuheal.clock import parse_time
from gpuheal.config import Config
from gpuheal.model import (
    ANNOTATION_PREFIX,
    FAULT_SEVERITY,
    LAST_PROCESS_TIME,
    FaultRecord,
    FaultSignal,
    Mode,
    Phase,
    Severity,
    fault_record_name,
)
from gpuheal.policy.actions import Action, Emit, NodeState, Plan, UpdateRecord
from gpuheal.policy.offenders import offence
from gpuheal.policy.plan.approve import approval, needs_approval, request_approval
from gpuheal.policy.plan.fault import (
    Fault,
    created,
    entry,
    fenced,
    held_note,
    may_quarantine,
    plan_with,
    said_released,
)
from gpuheal.policy.plan.fence import p1_fence, quarantines
from gpuheal.policy.plan.watch import observed, p1_pending, watched, would_quarantine
from gpuheal.policy.release import released
from gpuheal.vocabulary import Entry, Reason

# A record closed by one of these entries ended with its fault's report (recovered,
# restored) or was replaced by a newer fault: its id reported again was written again.
_ENDED = frozenset({Entry.SUPERSEDED, Entry.RECOVERED, Entry.UNTAINT})


def admit(
    fault: Fault,
    record: FaultRecord | None,
    watching: bool,
    config: Config,
    *,
    now: dt.datetime,
    actions: list[Action],
    base: Plan,
) -> Plan | Fault:
    """A Plan where the fault stops before the fence; the fault, to fence, where it
    passes (approved, released: its record as the fence will find it)."""
    if record is None:
        return _first_sight(fault, watching, config, now=now, actions=actions, base=base) or fault
    if fault.mode is Mode.OBSERVE:
        return observed(fault, config, now, actions, base)
    if watching:
        return watched(fault, config, now, actions, base)
    approved = approval(fault, config, now, actions, base)
    if isinstance(approved, Plan):
        return approved
    return _breaker(approved, config, now, actions, base) or approved


def others_open(state: NodeState, name: str) -> tuple[FaultRecord, ...]:
    """The node's open records of other faults: a new fault supersedes them."""
    return tuple(r for r in state.records if r.open and r.name != name)


def superseded_ids(state: NodeState, signal: FaultSignal) -> tuple[str, ...]:
    """What a new fault supersedes, by fault id: the node's open records of other
    faults, and the fault our taint names when it is another's (a pass that died
    between the taint and its record leaves that fault on the node with no record:
    its id coming back must not take the taint back either)."""
    name = fault_record_name(state.node.name, signal.fault_id)
    ids = [r.fault_id for r in others_open(state, name)]
    taint = state.node.taint()
    named = {values.taint_value(i) for i in (signal.fault_id, *ids)}
    if taint is not None and taint.value not in named:
        ids.append(taint.value)  # the fault id as far as a taint value carries it
    return tuple(ids)


def stale(state: NodeState, signal: FaultSignal, now: dt.datetime) -> Plan | None:
    """A fault id names one occurrence. Reported again once its record closed
    (superseded, recovered, rejected), or once a newer open record superseded it
    (`CreateRecord.supersedes`: the pass that superseded it died before closing
    it, or before its record was made), the report is stale: it changes nothing of
    the newer fault (no supersede, no taint), and an open superseded record is
    closed now. A new fault needs a new id."""
    name = fault_record_name(state.node.name, signal.fault_id)
    record = next((r for r in state.records if r.name == name), None)
    base = Plan(fault_id=signal.fault_id, reason=signal.reason)
    if record is not None and not record.open:
        reported_again = any(a.action in _ENDED for a in record.actions)
        return replace(base, suppressed="reused" if reported_again else "resolved")
    wanted = {signal.fault_id, values.taint_value(signal.fault_id)}
    newer = next(
        (r for r in state.records if r.open and r.name != name and wanted & set(r.supersedes)),
        None,
    )
    if newer is None:
        return None
    if record is None:
        return replace(base, suppressed="reused")
    closed = UpdateRecord(
        record.name, Phase.RESOLVED, entry(now, Entry.SUPERSEDED, detail=f"by {newer.fault_id}")
    )
    return replace(base, record=(closed,), suppressed="reused")


def _first_sight(
    fault: Fault,
    watching: bool,
    config: Config,
    *,
    now: dt.datetime,
    actions: list[Action],
    base: Plan,
) -> Plan | None:
    """A fault without a record yet: the plan, or None to go on and quarantine it
    (its CreateRecord + Emit already added to `actions`). A node that already
    carries our taint for it (the taint goes first: Plan.steps; the next turn, or
    a controller that stopped, makes the record) is past the cooldown and approval:
    only its record is missing. A fault marked handled stays so: its record was
    deleted by a person (or the controller stopped right after a taint that
    carried the mark), and the record comes back restored once the fault clears
    (recover.restore)."""
    node = fault.state.node
    if fault.handled:
        return plan_with(base, actions, suppressed="handled")
    last = (
        None
        if fenced(node, fault.record)
        else parse_time(node.annotations.get(LAST_PROCESS_TIME, ""))
    )
    if last is not None:
        remaining = (last - now).total_seconds() + config.cooldown_seconds
        if remaining > 0:
            return plan_with(base, actions, suppressed="cooldown", requeue_after=remaining)
    return _recorded(fault, watching, config, now=now, actions=actions, base=base)


def _recorded(
    fault: Fault,
    watching: bool,
    config: Config,
    *,
    now: dt.datetime,
    actions: list[Action],
    base: Plan,
) -> Plan | None:
    """The new fault's record, in the phase its gates leave it (Detected, or Held
    past the breaker), and what they say; None when it goes on to the fence."""
    state, mode = fault.state, fault.mode
    if watching and mode is not Mode.OBSERVE:
        # P1: notify now, act only if it is still there after the observation window.
        fence = p1_fence(fault, config, now)
        actions += _made(fault, Phase.DETECTED, config, now)
        return plan_with(
            base,
            actions,
            fence=fence,
            requeue_after=config.p1_escalation_seconds,
            new_quarantine=quarantines(fault, fence),
        )
    if mode is Mode.OBSERVE:
        # Nothing is written to the node: the record is the fault's only trace (and lock).
        actions += _made(fault, Phase.DETECTED, config, now)
        if fault.signal.severity is Severity.P0:
            actions.append(would_quarantine(fault, config, now))
        return plan_with(base, actions, requeue_after=p1_pending(fault, config, now))
    if needs_approval(fault, config) and not fenced(state.node, fault.record):
        actions += [
            *_made(fault, Phase.DETECTED, config, now),
            *request_approval(fault, config, now),
        ]
        return plan_with(base, actions, requeue_after=config.approval.expiry_seconds)
    if not may_quarantine(state, config):
        note = held_note(state, config)
        held = Emit(Reason.HELD, note, state.node.name, fault.record.name, warning=True)
        actions += [*_made(fault, Phase.HELD, config, now), held]
        return plan_with(base, actions, requeue_after=config.hold_retry_seconds)
    actions += _made(fault, Phase.DETECTED, config, now)
    return None


def _made(fault: Fault, phase: Phase, config: Config, now: dt.datetime) -> list[Action]:
    """The new record in `phase`, its Events (after the record they point to), and
    the repeat offence it makes, if any."""
    signal, name = fault.signal, fault.record.name
    detected = Emit(
        Reason.DETECTED,
        f"{signal.reason} ({signal.source}, {signal.severity}), fault {signal.fault_id}",
        fault.state.node.name,
        name,
    )
    announced = (detected, _altered(signal, name)) if signal.altered else (detected,)
    older = superseded_ids(fault.state, signal)
    made = created(name, signal, phase, fault.mode, now, supersedes=older)
    return [*made, *announced, *_offended(fault, phase, config, now)]


def _offended(fault: Fault, phase: Phase, config: Config, now: dt.datetime) -> list[Action]:
    """A new fault that makes its node a repeat offender (policy/offenders.py): said
    in its record and asked of a person, right after its creation."""
    records = (*fault.state.records, *fault.state.device_records)
    why = offence(records, fault.record.name, config, now)
    if why is None:
        return []
    said = entry(now, Entry.REPEAT_OFFENDER, "contact-support", why)
    return [
        UpdateRecord(fault.record.name, phase, said, contact_support=True),
        Emit(Reason.CONTACT_SUPPORT, why, fault.state.node.name, fault.record.name, warning=True),
    ]


def _altered(signal: FaultSignal, record: str) -> Emit:
    """Said once, with the record: what the source reported could not be carried as is."""
    severity = FAULT_SEVERITY.removeprefix(ANNOTATION_PREFIX)
    fields = ", ".join(f for f in signal.altered if f != severity)
    said = []
    if fields:
        said.append(
            f"{fields} that cannot be written as is (too long, control characters or not a time)"
        )
    if severity in signal.altered:
        said.append(f"a {severity} that is not P0, P1 or P2 (taken as P0)")
    return Emit(
        Reason.INPUT_NORMALIZED,
        f"{signal.source} reported {' and '.join(said)}; acting on fault {signal.fault_id} "
        "with normalized values",
        signal.node,
        record,
        warning=True,
    )


def _breaker(
    fault: Fault, config: Config, now: dt.datetime, actions: list[Action], base: Plan
) -> Plan | None:
    """The blast-radius breaker: a recorded fault it stops is held (said once) until
    capacity frees; a held fault a person released goes on, once (its record leaves
    Held); every other held fault stays held."""
    record, state = fault.record, fault.state
    if released(record):
        what = "released from the breaker {by}; quarantining it (within the rate limit)"
        actions += said_released(record, Phase.HELD, fault.signal.node, what, now)
        return None
    if record.phase not in (Phase.HELD, Phase.DETECTED) or may_quarantine(state, config):
        return None
    if record.phase is Phase.HELD:
        return plan_with(base, actions, suppressed="held", requeue_after=config.hold_retry_seconds)
    # An escalated P1 meets the breaker.
    held = Emit(Reason.HELD, held_note(state, config), state.node.name, record.name, warning=True)
    actions += [UpdateRecord(record.name, Phase.HELD, entry(now, Entry.HOLD, "breaker")), held]
    return plan_with(base, actions, requeue_after=config.hold_retry_seconds)
