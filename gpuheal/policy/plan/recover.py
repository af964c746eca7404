"""The recover stage: the way back once a node's fault clears.

A fault that cleared before its node was fenced is simply closed. A fenced one
waits out the recovery window (`recoveryWindowSeconds`), then a repeat offender's
node waits for a person, then the health gate (with its validation Job) judges
the node; only a node that passes is untainted and its record resolved. A taint
of ours whose record a person deleted gets its record back (restore), so no
taint is orphaned and none is lifted unchecked."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.model import (
    HANDLED_FAULT_ID,
    TAINTED_PHASES,
    ActionEntry,
    FaultRecord,
    FaultSignal,
    NodeView,
    Phase,
    Severity,
    fault_record_name,
)
from gpuheal.policy import validation
from gpuheal.policy.actions import Action, Emit, NodeState, Plan, RemoveTaint, UpdateRecord
from gpuheal.policy.gate import GateResult, evaluate, facts_from_views
from gpuheal.policy.offenders import held_for_a_person, repeat_offender
from gpuheal.policy.plan.fault import (
    created,
    detected_later,
    entry,
    fenced,
    said_released,
    soonest,
    taint_noted,
)
from gpuheal.policy.plan.repair import repair_actions, subject
from gpuheal.policy.repair import outcome_only
from gpuheal.vocabulary import Entry, Reason

# The record made again for gpuheal's taint on a node whose open record was deleted.
RESTORED_REASON = "RecordRestored"
RESTORED_SOURCE = "gpuheal"


@dataclass(frozen=True)
class _Judged:
    """One open record's turn on the way back: what to write, when to look again,
    and whether its node returns now."""

    actions: list[Action]
    requeue_after: float | None = None
    returns: bool = False


def recover(state: NodeState, config: Config, now: dt.datetime) -> Plan:
    """The node reports no fault: each open record closes or goes its way back; the
    taint is lifted once, with the first record that returns."""
    restored = restore(state, config, now)
    if restored is not None:
        return restored
    node = state.node
    actions: list[Action] = []
    requeue: float | None = None
    untainted = False
    for record in (r for r in state.records if r.open):
        judged = _judge(state, record, config, now)
        actions += judged.actions
        if judged.requeue_after is not None:
            requeue = soonest(requeue, judged.requeue_after)
        if not judged.returns:
            continue
        if node.taint() is not None and not untainted:
            actions.append(RemoveTaint(node.name))
            untainted = True
        actions += [
            UpdateRecord(record.name, Phase.RESOLVED, entry(now, Entry.UNTAINT)),
            Emit(
                Reason.RECOVERED,
                f"healthy for {config.recovery_window_seconds:g}s; fault {record.fault_id} "
                "resolved, node returned",
                node.name,
                record.name,
            ),
        ]
    return Plan(release=tuple(actions), requeue_after=requeue)


def _judge(state: NodeState, record: FaultRecord, config: Config, now: dt.datetime) -> _Judged:
    node = state.node
    if record.source.split("/", 1)[0] in state.unsettled:
        # Its source has not looked again since this controller started.
        return _Judged([], config.hold_retry_seconds)
    if record.phase not in TAINTED_PHASES and not fenced(node, record):
        cleared = Emit(Reason.RECOVERED, f"fault {record.fault_id} cleared", node.name, record.name)
        return _Judged([UpdateRecord(record.name, Phase.RESOLVED, _cleared(record, now)), cleared])
    actions = _fence_unwritten(node, record, now)
    # A repair's result that came as the fault cleared is recorded all the same.
    told = outcome_only(subject(state, record, None), now)
    actions += repair_actions(told, node.name, record)
    waiting = _not_yet(record, node.name, config, now)
    if waiting is not None:
        return _Judged([*actions, *waiting[0]], waiting[1])
    actions += _offender_released(record, node.name, now)
    if node.taint() is not None and config.health_gate.on_recovery:
        # The same gate as `gpuheal maintenance finish`: the taint stays until it passes.
        gated, wait = _gate(state, record, config, now)
        actions += gated
        if wait is not None:
            return _Judged(actions, wait)
    return _Judged(actions, returns=True)


def _gate(
    state: NodeState, record: FaultRecord, config: Config, now: dt.datetime
) -> tuple[list[Action], float | None]:
    """The health gate's judgement of a recovered node: what to say, and when to
    look again (None: it passed)."""
    node = state.node
    since = parse_time(record.recovering_since) or now
    facts = facts_from_views(node, state.pods, state.pool_drivers, state.rollout)
    gate = evaluate(facts, config, now, since)
    actions: list[Action] = []
    if gate.passed and config.health_gate.validation.enabled:
        checked = validation.step(record, node, state.validations, config, now)
        actions += _validation_actions(record, checked)
        if checked.verdict is not None:
            gate = evaluate(replace(facts, validation=checked.verdict), config, now, since)
        if not gate.passed or checked.verdict is None:  # said by the step
            return actions, checked.requeue_after or config.hold_retry_seconds
    if not gate.passed:
        return [*actions, *_gate_failed(record, gate, now)], config.hold_retry_seconds
    return actions, None


def restore(state: NodeState, config: Config, now: dt.datetime) -> Plan | None:
    """gpuheal's taint on a node without an open record: a person deleted the record
    (the fault's lock and its history) while the node was quarantined. Nothing would
    ever lift the taint, so the record is made again, Quarantined, and the node
    returns the way every quarantined node does (the recovery window, the health
    gate); never an orphaned taint, never one lifted unchecked."""
    node = state.node
    taint = node.taint()
    if taint is None or any(r.open for r in state.records):
        return None
    fault_id = node.annotations.get(HANDLED_FAULT_ID) or taint.value
    names = {r.name for r in state.records}
    # Under its own name, or beside a closed record of that name (whose Resolved came
    # without the taint's removal); a restored one closed too: the taint is a person's.
    candidates = (fault_id, f"{fault_id}-restored") if fault_id else ()
    chosen = next(
        ((f, n) for f in candidates if (n := fault_record_name(node.name, f)) not in names),
        None,
    )
    if chosen is None:
        return None
    fault_id, name = chosen
    signal = FaultSignal(node.name, fault_id, RESTORED_REASON, RESTORED_SOURCE, Severity.P0)
    note = (
        f"gpuheal's taint is on the node but no open GPUFault record: fault {fault_id}'s "
        "record was deleted; restored, the node returns through the recovery window and "
        "the health gate"
    )
    create = created(name, signal, Phase.QUARANTINED, config.mode_for(RESTORED_REASON), now)
    # Looked at again soon: the restored record's recovery must not wait on its watch
    # event alone (one coalesced with this reconcile leaves the node tainted).
    return Plan(
        record=(*create, Emit(Reason.RESTORED, note, node.name, name, warning=True)),
        requeue_after=config.hold_retry_seconds,
    )


def _fence_unwritten(node: NodeView, record: FaultRecord, now: dt.datetime) -> list[Action]:
    """A fenced record's first entries when the fault cleared before the drain's
    pass wrote them (its status is then written by the recovery)."""
    taint = node.taint()
    if record.phase in TAINTED_PHASES or taint is None:
        return []
    signal = FaultSignal(node.name, record.fault_id, record.reason, record.source, record.severity)
    return [*detected_later(record, now), *taint_noted(record.name, taint, signal, now)]


def _not_yet(
    record: FaultRecord, node: str, config: Config, now: dt.datetime
) -> tuple[list[Action], float] | None:
    """A cleared fault's node that may not be judged for return yet: its recovery
    begins now, its window runs, or a person must release it first. The actions
    and when to look again; None when the gate may judge it."""
    since = parse_time(record.recovering_since)
    if since is None:
        began = UpdateRecord(
            record.name, Phase.RECOVERING, entry(now, Entry.RECOVERING), recovering_since=iso(now)
        )
        return [began], config.recovery_window_seconds
    remaining = (since - now).total_seconds() + config.recovery_window_seconds
    if remaining > 0:
        return [], remaining
    if held_for_a_person(record, config):
        return _held_for_a_person(record, node, now), config.hold_retry_seconds
    return None


def _offender_released(record: FaultRecord, node: str, now: dt.datetime) -> list[Action]:
    """A person released a repeat offender's node: said once, naming them, before the
    gate judges it."""
    if not record.released_by or not repeat_offender(record):
        return []
    what = "repeat offender's node released {by}; the health gate judges it now"
    return said_released(record, record.phase, node, what, now)


def _held_for_a_person(record: FaultRecord, node: str, now: dt.datetime) -> list[Action]:
    """A repeat offender's fault cleared: the node stays out, said once, until a
    person releases the record (policy/offenders.py)."""
    if any(a.action == Entry.HELD_FOR_A_PERSON for a in record.actions):
        return []
    why = (
        f"fault {record.fault_id} cleared, but its node is a repeat offender: it stays "
        f"out until a person releases it (gpuheal release {record.name})"
    )
    return [
        UpdateRecord(record.name, record.phase, entry(now, Entry.HELD_FOR_A_PERSON, "held", why)),
        Emit(Reason.HELD, why, node, record.name, warning=True),
    ]


def _cleared(record: FaultRecord, now: dt.datetime) -> ActionEntry:
    """The entry of a fault that cleared before anything was done on its node; an
    answer to its plan that came meanwhile is noted, and does nothing."""
    if record.phase is not Phase.AWAITING_APPROVAL:
        return entry(now, Entry.RECOVERED, detail="fault cleared before quarantine")
    if record.decision:
        by = f"by {record.decided_by} at {record.decided_at}"
        return entry(now, record.decision, "ignored", f"{by}: the fault had cleared; nothing done")
    return entry(now, Entry.RECOVERED, detail="fault cleared before approval; nothing done")


def _validation_actions(record: FaultRecord, checked: validation.ValidationStep) -> list[Action]:
    return [
        *checked.jobs,
        *(UpdateRecord(record.name, record.phase, e) for e in checked.entries),
        *(Emit(r, note, record.node, record.name, warning=w) for r, note, w in checked.events),
    ]


def gate_failed_checks(detail: str) -> frozenset[str]:
    """The failing checks a "gate-failed" entry names: its detail starts with them."""
    names, _, _ = detail.partition(": ")
    return frozenset(n.strip() for n in names.split(",") if n.strip())


def _gate_failed(record: FaultRecord, gate: GateResult, now: dt.datetime) -> list[Action]:
    """Record and announce a failed gate, once per set of failing checks: the record
    is looked at again every holdRetrySeconds and must not fill with the same news."""
    failing = tuple(c.name for c in gate.failing)
    # The news since recovery last began: a new recovery reports its gate afresh.
    last = next(
        (a for a in reversed(record.actions) if a.action in (Entry.GATE_FAILED, Entry.RECOVERING)),
        None,
    )
    if (
        last is not None
        and last.action == Entry.GATE_FAILED
        and gate_failed_checks(last.detail) == frozenset(failing)
    ):
        return []
    detail = f"{', '.join(failing)}: {gate.summary()}"
    return [
        UpdateRecord(record.name, record.phase, entry(now, Entry.GATE_FAILED, "failed", detail)),
        Emit(
            Reason.GATE_FAILED,
            f"fault {record.fault_id}: health gate failed, node stays tainted; {gate.summary()}",
            record.node,
            record.name,
            warning=True,
        ),
    ]
