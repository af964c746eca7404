"""Decide what to do about one node: state + config + now -> plan.

Level-triggered and re-runnable: the plan is computed from what is observed
(the node, its pods, its GPUFault records), so running it again after a crash
or a duplicate event continues where the world is, never repeating a finished
step. The order of actions inside a plan is the order of the safety rules:
the record (the lock) before anything that is not idempotent (the taint is:
Plan.steps runs it first), the durable record of an action after the action.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuheal import values
from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.model import (
    ANNOTATION_PREFIX,
    APPROVED,
    FAULT_SEVERITY,
    HANDLED_FAULT_ID,
    LAST_PROCESS_TIME,
    MAINTENANCE_ROLLOUT,
    REJECTED,
    STATE_LABEL,
    TAINT_KEY,
    TAINTED_PHASES,
    ActionEntry,
    FaultRecord,
    FaultSignal,
    Mode,
    NodeView,
    Phase,
    PodView,
    Severity,
    Taint,
    fault_record_name,
)
from gpuheal.policy import agentdevice, disruption, validation
from gpuheal.policy.actions import (
    STATE_QUARANTINED,
    Action,
    AddTaint,
    AwaitApproval,
    CreateRecord,
    DeletePod,
    Emit,
    Evict,
    MarkHandled,
    NodeState,
    Plan,
    Planned,
    RemoveTaint,
    ReplaceIntent,
    RequestCheckpoint,
    UpdateRecord,
    WouldQuarantine,
)
from gpuheal.policy.backoff import Blocked
from gpuheal.policy.breaker import breaker_allows
from gpuheal.policy.checkpoint import CheckpointStep, PodCheckpoint, next_look, where
from gpuheal.policy.gate import GateResult, evaluate, facts_from_views
from gpuheal.policy.history import opened_at
from gpuheal.policy.nodes import in_maintenance, opted_out
from gpuheal.policy.offenders import held_for_a_person, offence, repeat_offender
from gpuheal.policy.recent import handled_lately
from gpuheal.policy.release import released
from gpuheal.policy.repair import RepairStep, RequestRepair, Subject, outcome_only
from gpuheal.policy.repair import step as repair_step
from gpuheal.sources import SOURCES, Seen, Source
from gpuheal.vocabulary import Entry, Reason

# The record made again for gpuheal's taint on a node whose open record was deleted.
RESTORED_REASON = "RecordRestored"
RESTORED_SOURCE = "gpuheal"

# The taint a watched P1 fault gets with `p1Taint`: new pods stay off, none leaves.
P1_TAINT_EFFECT = "NoSchedule"


def _entry(now: dt.datetime, action: str, result: str = "ok", detail: str = "") -> ActionEntry:
    return ActionEntry(
        time=iso(now), action=action, result=result, detail=values.text(detail, values.DETAIL_MAX)
    )


def _created(
    name: str,
    signal: FaultSignal,
    phase: Phase,
    mode: Mode,
    now: dt.datetime,
    *,
    supersedes: tuple[str, ...] = (),
) -> list[Action]:
    """A new record (the fault's lock) and its first entry, `detect`: the record's
    status comes with the rest of the pass (a create cannot carry a subresource).
    It names the faults it supersedes (_superseded_ids), so their closing, written
    when the pass ends, is not lost with the pass (_stale)."""
    return [
        CreateRecord(name, signal, phase, mode, supersedes),
        UpdateRecord(name, phase, _entry(now, Entry.DETECT, detail=signal.source)),
    ]


def _detected_later(record: FaultRecord | None, now: dt.datetime) -> list[Action]:
    """The `detect` entry of a record whose status was never written (no entry,
    the phase a status-less record reads as): a new quarantine's fence pass leaves
    it to the drain pass (Plan.steps), and a controller may stop between the record
    and its status. Dated when the record was made (whole seconds)."""
    if record is None or record.actions or record.phase is not Phase.DETECTED:
        return []
    at = parse_time(record.created_at) or now
    return [UpdateRecord(record.name, record.phase, _entry(at, Entry.DETECT, detail=record.source))]


def plan(
    state: NodeState, config: Config, now: dt.datetime, sources: Sequence[Source] = SOURCES
) -> Plan:
    """The node's plan; its current signal is decided here, once, from `sources`."""
    return _guard_follows_work(state, config, _decided(state, config, now, sources))


def _decided(state: NodeState, config: Config, now: dt.datetime, sources: Sequence[Source]) -> Plan:
    node = state.node
    seen = Seen(
        node, config, state.external, (*state.records, *state.device_records), state.device_fence
    )
    signal = current_signal(seen, sources)
    # With repair on, a handled fault's node still has steps to take (the repair
    # request, its result): the memory rule would hide them.
    if (
        signal is not None
        and not config.repair.enabled
        and handled_lately(node, signal, state.handled_lately, config)
    ):
        return Plan(suppressed="memory", fault_id=signal.fault_id)
    if opted_out(node.labels):
        return Plan(suppressed="opt-out")
    if in_maintenance(node.labels):
        # A person took the node out (`gpuheal maintenance`): what it reports meanwhile
        # is the work being done, not a fault. `maintenance finish` gates its return.
        return Plan(suppressed="maintenance")
    if signal is None:
        decided = _recover(state, config, now)
    else:
        decided = _stale(state, signal, now) or _remediate(state, signal, config, now)
    return _label_follows_taint(node, decided)


# Suppressed plans that leave the guard as it is (the plan's rules did not look at
# the node's work): a maintenance drain's, the memory rule's. An opted-out node's
# guard is taken back: it is no longer gpuheal's to hold.
_GUARD_STANDS = frozenset({"maintenance", "memory"})


def _guard_follows_work(state: NodeState, config: Config, decided: Plan) -> Plan:
    """The disruption guard follows the work on the node as it stands once the plan
    is carried out (policy/disruption.py): set before the step that starts the work
    (at the head of the repair stage: before the repair request), taken back after
    the one that ends it (at the tail of the release stage: after the untaint)."""
    if decided.suppressed in _GUARD_STANDS and not state.node.annotations.get(MAINTENANCE_ROLLOUT):
        return decided  # the work is paused, not ended: the guard stays as it is
    updates: dict[str, list[UpdateRecord]] = {}
    for a in decided.actions:
        if isinstance(a, UpdateRecord):
            updates.setdefault(a.name, []).append(a)
    standing = [_standing(r, updates.get(r.name, [])) for r in state.records if not r.device_scope]
    untaints = any(isinstance(a, RemoveTaint) for a in decided.actions)
    taints = any(isinstance(a, AddTaint) for a in decided.actions)
    work = disruption.work_on(
        state.node,
        standing,
        fenced=taints or (state.node.taint() is not None and not untaints),
        requesting_repair=any(isinstance(a, RequestRepair) for a in decided.actions),
        rollouts=config.mode is not Mode.OBSERVE,
    )
    guard = disruption.change(state.node, config.autoscalers.do_not_disrupt, work)
    if guard is None:
        return decided
    if guard.add:
        return replace(decided, repair=(guard, *decided.repair))
    return replace(decided, release=(*decided.release, guard))


def _standing(record: FaultRecord, news: Sequence[UpdateRecord]) -> disruption.Standing:
    """The record as it stands once the plan's updates of it are written."""
    return disruption.Standing(
        phase=news[-1].phase if news else record.phase,
        entries=(*(e.action for e in record.actions), *(u.entry.action for u in news)),
        contact_support=record.contact_support or any(u.contact_support for u in news),
    )


def _label_follows_taint(node: NodeView, decided: Plan) -> Plan:
    """Our state label goes with our taint: when the taint is gone (a person removed
    it) and the plan does not put it back, the label goes too, or label selectors
    and dashboards go on counting the node as quarantined."""
    if node.taint() is not None or node.labels.get(STATE_LABEL) != STATE_QUARANTINED:
        return decided
    if any(isinstance(a, AddTaint | RemoveTaint) for a in decided.actions):
        return decided
    # Without our taint on the node, the executor's RemoveTaint removes the label alone.
    return replace(decided, release=(*decided.release, RemoveTaint(node.name)))


def reported(seen: Seen, sources: Sequence[Source] = SOURCES) -> tuple[FaultSignal, ...]:
    """What the sources report about the node, the current signal first: the node's
    own report (the first signal of an OWN source, in the sources' order; the own
    sources after it are not asked), then every other source's signal, the most
    severe first (ties: the oldest fault id, for stability). The agent's report of
    one DRA card's fault is that card's (the device plan's), not the node's."""
    own: FaultSignal | None = None
    for source in sources:
        if source.OWN:
            own = next(iter(source.signals(seen)), None)
            if own is not None:
                break
    if own is not None and agentdevice.diverted(seen, own):
        own = None
    others = sorted(
        (signal for source in sources if not source.OWN for signal in source.signals(seen)),
        key=lambda s: (s.severity.rank, s.fault_id),
    )
    return (own, *others) if own is not None else tuple(others)


def current_signal(seen: Seen, sources: Sequence[Source] = SOURCES) -> FaultSignal | None:
    """The signal the node's plan acts on (reported's first), or None."""
    return next(iter(reported(seen, sources)), None)


def _escalated(record: FaultRecord | None, config: Config, now: dt.datetime) -> bool:
    """A P1 fault is handled as P0 once it has lasted the observation window, or
    once its record says it escalated (it worsened to P0 meanwhile)."""
    if record is None:
        return False
    if any(a.action == Entry.ESCALATE for a in record.actions):
        return True
    since = opened_at(record)
    return since is not None and (now - since).total_seconds() >= config.p1_escalation_seconds


def _watching(
    record: FaultRecord | None, signal: FaultSignal, config: Config, now: dt.datetime
) -> bool:
    """A P1 fault inside its observation window: recorded and told, not acted on.

    Only a fault first recorded as P1 is watched: one recorded as P0 that is now
    reported as P1 has been acted on already and is not un-escalated."""
    if signal.severity is not Severity.P1:
        return False
    return record is None or (
        record.severity is Severity.P1 and not _escalated(record, config, now)
    )


def _escalation(fault: _Fault, config: Config, now: dt.datetime) -> list[Action]:
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
        UpdateRecord(record.name, record.phase, _entry(now, Entry.ESCALATE, detail=why)),
        Emit(
            Reason.ESCALATED,
            f"P1 fault {signal.fault_id} ({signal.reason}) {why}: handled as P0",
            signal.node,
            record.name,
            warning=True,
        ),
    ]


def plan_node_gone(records: tuple[FaultRecord, ...], now: dt.datetime) -> Plan:
    """The Node object was deleted: close its open records (nothing left to act on)."""
    return Plan(
        record=tuple(
            UpdateRecord(r.name, Phase.RESOLVED, _entry(now, Entry.NODE_DELETED))
            for r in records
            if r.open
        )
    )


def _remediate(  # noqa: PLR0911 -- one return per rule reads best here
    state: NodeState, signal: FaultSignal, config: Config, now: dt.datetime
) -> Plan:
    node = state.node
    name = fault_record_name(node.name, signal.fault_id)
    record = next((r for r in state.records if r.name == name), None)
    # An older fault of this node still open: the new fault supersedes it.
    actions: list[Action] = [
        UpdateRecord(
            r.name, Phase.RESOLVED, _entry(now, Entry.SUPERSEDED, detail=f"by {signal.fault_id}")
        )
        for r in _others_open(state, name)
    ]
    fault = _Fault(
        state=state,
        signal=signal,
        record=record or FaultRecord(name, node.name, signal.fault_id, Phase.DETECTED),
        mode=Mode.OBSERVE if signal.severity is Severity.P2 else config.mode_for(signal.reason),
        handled=node.annotations.get(HANDLED_FAULT_ID) == signal.fault_id,
    )
    base = Plan(fault_id=signal.fault_id, reason=signal.reason)
    actions += _detected_later(record, now)
    watching = _watching(record, signal, config, now)
    if record is not None and record.open and not watching:
        actions += _escalation(fault, config, now)
    if record is None:
        first = _first_sight(fault, watching, config, now=now, actions=actions, base=base)
        if first is not None:
            return first
    elif fault.mode is Mode.OBSERVE:
        return _observed(fault, config, now, actions, base)
    elif watching:
        created = opened_at(record) or now
        remaining = config.p1_escalation_seconds - (now - created).total_seconds()
        fence = _p1_fence(fault, config, now)
        return _with(
            base,
            actions,
            fence=fence,
            suppressed=None if fence else "watching",
            requeue_after=max(remaining, 0.1),
            new_quarantine=_quarantines(fault, fence),
        )
    if record is not None and (
        record.phase is Phase.AWAITING_APPROVAL or _needs_approval(fault, config)
    ):
        if record.phase is not Phase.AWAITING_APPROVAL:
            actions += _request_approval(fault, config, now)
            return _with(base, actions, requeue_after=config.approval.expiry_seconds)
        answered = _answer(fault, config, now, actions, base)
        if answered is not None:
            return answered
        # Approved: from here on the fault goes the way of any other, breaker included.
        record = replace(record, phase=Phase.DETECTED)
        fault = replace(fault, record=record)
    if record is not None and released(record):
        # A person let this one held fault past the breaker: it goes on now, once
        # (quarantined, its record leaves Held); every other held fault stays held.
        actions += _release(fault, now)
    elif (
        record is not None
        and record.phase in (Phase.HELD, Phase.DETECTED)
        and not _may_quarantine(state, config)
    ):
        if record.phase is Phase.DETECTED:  # an escalated P1 meets the breaker
            actions += [
                UpdateRecord(record.name, Phase.HELD, _entry(now, Entry.HOLD, "breaker")),
                Emit(Reason.HELD, _held_note(state, config), node.name, record.name, warning=True),
            ]
            return _with(base, actions, requeue_after=config.hold_retry_seconds)
        return _with(base, actions, suppressed="held", requeue_after=config.hold_retry_seconds)
    return _advance(fault, config, now, actions, base)


def _others_open(state: NodeState, name: str) -> tuple[FaultRecord, ...]:
    """The node's open records of other faults: a new fault supersedes them."""
    return tuple(r for r in state.records if r.open and r.name != name)


def _superseded_ids(state: NodeState, signal: FaultSignal) -> tuple[str, ...]:
    """What a new fault supersedes, by fault id: the node's open records of other
    faults, and the fault our taint names when it is another's (a pass that died
    between the taint and its record leaves that fault on the node with no record:
    its id coming back must not take the taint back either)."""
    name = fault_record_name(state.node.name, signal.fault_id)
    ids = [r.fault_id for r in _others_open(state, name)]
    taint = state.node.taint()
    named = {values.taint_value(i) for i in (signal.fault_id, *ids)}
    if taint is not None and taint.value not in named:
        ids.append(taint.value)  # the fault id as far as a taint value carries it
    return tuple(ids)


def _stale(state: NodeState, signal: FaultSignal, now: dt.datetime) -> Plan | None:
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
        record.name, Phase.RESOLVED, _entry(now, Entry.SUPERSEDED, detail=f"by {newer.fault_id}")
    )
    return replace(base, record=(closed,), suppressed="reused")


# A record closed by one of these entries ended with its fault's report (recovered,
# restored) or was replaced by a newer fault: its id reported again was written again.
_ENDED = frozenset({Entry.SUPERSEDED, Entry.RECOVERED, Entry.UNTAINT})


def _first_sight(  # noqa: PLR0911 -- one return per rule, as in _remediate
    fault: _Fault,
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
    (_restore)."""
    node, signal, name, mode = fault.state.node, fault.signal, fault.record.name, fault.mode
    older = _superseded_ids(fault.state, signal)
    fenced = _fenced(node, fault.record)
    if fault.handled:
        return _with(base, actions, suppressed="handled")
    last = None if fenced else parse_time(node.annotations.get(LAST_PROCESS_TIME, ""))
    if last is not None:
        remaining = (last - now).total_seconds() + config.cooldown_seconds
        if remaining > 0:
            return _with(base, actions, suppressed="cooldown", requeue_after=remaining)
    detected = Emit(
        Reason.DETECTED,
        f"{signal.reason} ({signal.source}, {signal.severity}), fault {signal.fault_id}",
        node.name,
        name,
    )
    # The Events follow the record they point to.
    announced = (detected, _altered(signal, name)) if signal.altered else (detected,)

    def made(phase: Phase) -> list[Action]:
        created = _created(name, signal, phase, mode, now, supersedes=older)
        return [*created, *announced, *_offended(fault, phase, config, now)]

    if watching and mode is not Mode.OBSERVE:
        # P1: notify now, act only if it is still there after the observation window.
        fence = _p1_fence(fault, config, now)
        actions += made(Phase.DETECTED)
        return _with(
            base,
            actions,
            fence=fence,
            requeue_after=config.p1_escalation_seconds,
            new_quarantine=_quarantines(fault, fence),
        )
    if mode is Mode.OBSERVE:
        # Nothing is written to the node: the record is the fault's only trace (and lock).
        actions += made(Phase.DETECTED)
        if signal.severity is Severity.P0:
            actions.append(_would_quarantine(fault, config, now))
        return _with(base, actions, requeue_after=_p1_pending(fault, config, now))
    if _needs_approval(fault, config) and not fenced:
        actions += [*made(Phase.DETECTED), *_request_approval(fault, config, now)]
        return _with(base, actions, requeue_after=config.approval.expiry_seconds)
    if not _may_quarantine(fault.state, config):
        held = Emit(Reason.HELD, _held_note(fault.state, config), node.name, name, warning=True)
        actions += [*made(Phase.HELD), held]
        return _with(base, actions, requeue_after=config.hold_retry_seconds)
    actions += made(Phase.DETECTED)
    return None


def _offended(fault: _Fault, phase: Phase, config: Config, now: dt.datetime) -> list[Action]:
    """A new fault that makes its node a repeat offender (policy/offenders.py): said
    in its record and asked of a person, right after its creation."""
    records = (*fault.state.records, *fault.state.device_records)
    why = offence(records, fault.record.name, config, now)
    if why is None:
        return []
    entry = _entry(now, Entry.REPEAT_OFFENDER, "contact-support", why)
    return [
        UpdateRecord(fault.record.name, phase, entry, contact_support=True),
        Emit(Reason.CONTACT_SUPPORT, why, fault.state.node.name, fault.record.name, warning=True),
    ]


def _gpu_pods(state: NodeState) -> list[PodView]:
    """The pods a drain moves. Our canary pods tolerate the taint on purpose: they
    test a device before release."""
    return [p for p in state.pods if p.gpu and not p.daemonset and not p.terminal and not p.canary]


def _planned(fault: _Fault, config: Config) -> Planned:
    """What quarantining the fault's node would do: in `full` (and observed) the
    drain's pods too."""
    taint = f"{TAINT_KEY}={values.taint_value(fault.signal.fault_id)}:{config.taint_effect}"
    moves = fault.mode is not Mode.QUARANTINE
    pods = tuple(sorted(p.key for p in _gpu_pods(fault.state))) if moves else ()
    return Planned(fault.state.node.name, taint, pods)


def _would_quarantine(fault: _Fault, config: Config, now: dt.datetime) -> WouldQuarantine:
    """Observe mode: what quarantine/full mode would have done, in the record."""
    planned = _planned(fault, config)
    return WouldQuarantine(
        fault.record.name,
        Phase.DETECTED,
        _entry(now, Entry.WOULD_QUARANTINE, "observe", planned.text()),
        plan=planned,
    )


def _p1_pending(fault: _Fault, config: Config, now: dt.datetime) -> float | None:
    """Observe mode, a P1 fault: seconds until it would escalate (and count as a
    would-quarantine); None when that is not to come."""
    record, signal = fault.record, fault.signal
    if signal.severity is not Severity.P1 or any(
        a.action == Entry.WOULD_QUARANTINE for a in record.actions
    ):
        return None
    since = opened_at(record) or now
    return max(config.p1_escalation_seconds - (now - since).total_seconds(), 0.1)


def _observed(
    fault: _Fault, config: Config, now: dt.datetime, actions: list[Action], base: Plan
) -> Plan:
    """An open fault in observe mode: recorded; a P1 that outlasts its window (or
    worsens) is noted as a would-quarantine once. Nothing on the node."""
    record, signal = fault.record, fault.signal
    noted = any(a.action == Entry.WOULD_QUARANTINE for a in record.actions)
    if not noted and signal.severity is not Severity.P2:
        if signal.severity is Severity.P0 or _escalated(record, config, now):
            actions.append(_would_quarantine(fault, config, now))
            return _with(base, actions)
        wait = _p1_pending(fault, config, now)
        return _with(base, actions, suppressed="observed", requeue_after=wait)
    return _with(base, actions, suppressed="observed")


def _needs_approval(fault: _Fault, config: Config) -> bool:
    """A person approves a fault's first taint or eviction (`approval`), once."""
    record = fault.record
    return (
        fault.mode is not Mode.OBSERVE
        and config.approval.required_for(fault.signal.reason)
        and record.phase not in TAINTED_PHASES
        and not any(a.action == Entry.APPROVED for a in record.actions)
    )


def _request_approval(fault: _Fault, config: Config, now: dt.datetime) -> list[Action]:
    record, signal = fault.record, fault.signal
    planned = _planned(fault, config)
    what = planned.text()
    expires = iso(now + dt.timedelta(seconds=config.approval.expiry_seconds))
    return [
        AwaitApproval(
            record.name,
            Phase.AWAITING_APPROVAL,
            _entry(now, Entry.AWAITING_APPROVAL, "waiting", f"{what}; expires {expires}"),
            plan=planned,
        ),
        Emit(
            Reason.AWAITING_APPROVAL,
            f"fault {signal.fault_id} ({signal.reason}, {signal.severity}) awaits approval: "
            f"{what}. Approve or reject with `gpuheal approve|reject {record.name}` "
            f"before {expires}",
            signal.node,
            record.name,
            warning=True,
        ),
    ]


def _asked_at(record: FaultRecord) -> dt.datetime | None:
    """When the plan was put to a person: its latest awaiting-approval entry."""
    asked = [parse_time(a.time) for a in record.actions if a.action == Entry.AWAITING_APPROVAL]
    return next((t for t in reversed(asked) if t is not None), None)


def _answer(
    fault: _Fault, config: Config, now: dt.datetime, actions: list[Action], base: Plan
) -> Plan | None:
    """A plan awaiting approval: rejected, expired or still waiting (a Plan), or
    approved (None: go on, exactly once: the record leaves AwaitingApproval)."""
    record, signal = fault.record, fault.signal
    node, by = signal.node, f"by {record.decided_by} at {record.decided_at}"
    if record.decision == REJECTED:
        actions += [
            UpdateRecord(record.name, Phase.RESOLVED, _entry(now, Entry.REJECTED, REJECTED, by)),
            Emit(
                Reason.REJECTED,
                f"fault {signal.fault_id}: plan rejected {by}; nothing done",
                node,
                record.name,
            ),
        ]
        return _with(base, actions)
    if record.decision == APPROVED:
        actions += [
            UpdateRecord(record.name, Phase.DETECTED, _entry(now, Entry.APPROVED, "ok", by)),
            Emit(
                Reason.APPROVED,
                f"fault {signal.fault_id}: plan approved {by}; acting (within the breaker "
                "and rate limit)",
                node,
                record.name,
            ),
        ]
        return None
    expiry = config.approval.expiry_seconds
    remaining = expiry - (now - (_asked_at(record) or now)).total_seconds()
    if remaining > 0:
        return _with(base, actions, suppressed="awaiting-approval", requeue_after=remaining)
    actions += [
        UpdateRecord(
            record.name,
            Phase.FAILED,
            _entry(
                now,
                Entry.APPROVAL_EXPIRED,
                "expired",
                f"no answer within {expiry:g}s; nothing done",
            ),
        ),
        Emit(
            Reason.APPROVAL_EXPIRED,
            f"fault {signal.fault_id}: no approval within {expiry:g}s; plan expired, nothing done",
            node,
            record.name,
            warning=True,
        ),
    ]
    return _with(base, actions)


def _release(fault: _Fault, now: dt.datetime) -> list[Action]:
    """The person's release, said once: a `released` entry naming them and its Event."""
    what = "released from the breaker {by}; quarantining it (within the rate limit)"
    return _said_released(fault.record, Phase.HELD, fault.signal.node, what, now)


def _said_released(
    record: FaultRecord, phase: Phase, node: str, what: str, now: dt.datetime
) -> list[Action]:
    """A person's release in the record (`released`, by whom) and its Event, once;
    `what` says what it lets happen, `{by}` the person and when."""
    if any(a.action == Entry.RELEASED for a in record.actions):
        return []  # said on an earlier pass that did not get further
    by = f"by {record.released_by} at {record.released_at}"
    return [
        UpdateRecord(record.name, phase, _entry(now, Entry.RELEASED, "ok", by)),
        Emit(
            Reason.RELEASED,
            f"fault {record.fault_id}: " + what.format(by=by),
            node,
            record.name,
        ),
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


def _may_quarantine(state: NodeState, config: Config) -> bool:
    if state.node.taint() is not None:
        return True  # already counted among the quarantined
    others = len(state.quarantined - {state.node.name})
    return breaker_allows(others, state.gpu_nodes, config)


def _held_note(state: NodeState, config: Config) -> str:
    others = len(state.quarantined - {state.node.name})
    return (
        f"blast-radius breaker: {others} of {state.gpu_nodes} GPU nodes quarantined "
        f"(limit {config.breaker_max_nodes} nodes / {config.breaker_max_percent:g}%); "
        "held until capacity frees"
    )


@dataclass(frozen=True)
class _Fault:
    """The fault being advanced, and what is already known about it."""

    state: NodeState
    signal: FaultSignal
    record: FaultRecord
    mode: Mode
    handled: bool


def _p1_fence(fault: _Fault, config: Config, now: dt.datetime) -> list[Action]:
    """With `p1Taint`: a watched P1 fault's node gets a NoSchedule taint (new pods
    stay off, running ones stay), within the breaker; nothing when it is full."""
    if not config.p1_taint or fault.mode is Mode.OBSERVE or _needs_approval(fault, config):
        return []
    fenced = fault.state.node.taint() is not None or fault.record.phase in TAINTED_PHASES
    if not fenced and not _may_quarantine(fault.state, config):
        return []
    actions, _ = _quarantine_step(
        fault, config, now, effect=P1_TAINT_EFFECT, detail="P1 watched: NoSchedule"
    )
    return actions


def _quarantines(fault: _Fault, fence: list[Action]) -> bool:
    """The fence taints a node that has none of ours: a new quarantine, which the
    rate limit and the breaker lock apply to."""
    return fault.state.node.taint() is None and any(isinstance(a, AddTaint) for a in fence)


def _advance(
    fault: _Fault, config: Config, now: dt.datetime, actions: list[Action], base: Plan
) -> Plan:
    fence, respected = _quarantine_step(fault, config, now)
    new_quarantine = _quarantines(fault, fence)
    node, signal = fault.state.node, fault.signal
    handled = [] if fault.handled else [MarkHandled(node.name, signal.fault_id)]
    if respected:
        return _with(base, actions, fence=fence, mark=handled, suppressed="manual-untaint")
    if fault.mode is Mode.QUARANTINE:
        return _with(base, actions, fence=fence, mark=handled, new_quarantine=new_quarantine)
    drain, mark, requeue = _drain_step(fault, config, now)
    repair: RepairStep = RepairStep()
    if not drain and requeue is None and config.repair.enabled:
        if mark or new_quarantine:
            requeue = 0.1  # drained just now: the repair on the node's next turn
        else:
            repair = repair_step(_subject(fault.state, fault.record, fault.signal), config, now)
            requeue = repair.requeue_after
    return _with(
        base,
        actions,
        fence=fence,
        drain=drain,
        mark=mark,
        repair=_repair_actions(repair, fault.state.node.name, fault.record),
        new_quarantine=new_quarantine,
        new_repair=repair.request is not None,
        suppressed=repair.suppressed,
        requeue_after=requeue,
    )


def _subject(state: NodeState, record: FaultRecord, signal: FaultSignal | None) -> Subject:
    node = state.node
    return Subject(
        node=node.name,
        annotations=node.annotations,
        signal=signal,
        record=record,
        node_records=state.records,
        gpu_nodes=state.gpu_nodes,
        repairing=state.repairing,
        devices=signal.devices if signal is not None else (),
        provider_id=node.provider_id,
    )


def _repair_actions(repair: RepairStep, node: str, record: FaultRecord) -> tuple[Action, ...]:
    """The request first, then its record entries (the durable note after the act),
    then the Events."""
    actions: list[Action] = [repair.request] if repair.request is not None else []
    phase = record.phase if record.phase in TAINTED_PHASES else Phase.DRAINED
    actions += [
        UpdateRecord(
            record.name,
            phase,
            entry,
            contact_support=repair.contact_support,
            repair_approval=repair.ask,
        )
        for entry in repair.entries
    ]
    call = repair.replace
    if call is not None:
        if call.intent is not None:
            actions.append(ReplaceIntent(record.name, phase, call.intent))
        actions.append(replace(call, phase=phase))
    actions += [Emit(s.reason, s.note, node, record.name, warning=s.warning) for s in repair.said]
    return tuple(actions)


def _quarantine_step(
    fault: _Fault,
    config: Config,
    now: dt.datetime,
    *,
    effect: str | None = None,
    detail: str = "",
) -> tuple[list[Action], bool]:
    """Actions that make sure our taint is on the node (`effect`: taintEffect unless
    given); True if a person's untaint wins."""
    node, signal, record = fault.state.node, fault.signal, fault.record
    effect = effect or config.taint_effect
    taint = node.taint()
    actions: list[Action] = []
    if taint is None:
        if record.phase in TAINTED_PHASES:
            # We tainted this node for this fault and a person removed the taint: respect it.
            if not any(a.action == Entry.MANUAL_UNTAINT for a in record.actions):
                actions.append(
                    UpdateRecord(
                        record.name,
                        record.phase,
                        _entry(now, Entry.MANUAL_UNTAINT, "respected", "taint removed by hand"),
                    )
                )
            return actions, True
        actions += [
            AddTaint(node.name, signal.fault_id, effect),
            UpdateRecord(record.name, Phase.QUARANTINED, _entry(now, Entry.TAINT, detail=detail)),
            _quarantined(effect, signal, record.name),
        ]
    elif taint.value != values.taint_value(signal.fault_id):
        # Our taint from an earlier fault of this node: carry it over to this one.
        actions.append(AddTaint(node.name, signal.fault_id, taint.effect))
        if record.phase not in TAINTED_PHASES:
            actions.append(UpdateRecord(record.name, Phase.QUARANTINED, _entry(now, Entry.TAINT)))
    elif record.phase not in TAINTED_PHASES:
        # The taint is there but its record does not say so: the fence's pass was
        # the taint alone (Plan.steps), or we stopped between the two.
        actions += _taint_noted(record.name, taint, signal, now)
    elif record.severity is Severity.P1 and taint.effect == P1_TAINT_EFFECT != effect:
        # The watched P1's NoSchedule taint (p1Taint), now that it is handled as P0.
        actions += [
            AddTaint(node.name, signal.fault_id, effect),
            UpdateRecord(
                record.name,
                record.phase,
                _entry(now, Entry.TAINT, detail=f"{taint.effect} -> {effect}"),
            ),
        ]
    if record.phase is Phase.RECOVERING:
        actions.append(
            UpdateRecord(
                record.name,
                Phase.QUARANTINED,
                _entry(now, Entry.FAULT_RETURNED),
                recovering_since="",
            )
        )
    return actions, False


def _drain_step(
    fault: _Fault, config: Config, now: dt.datetime
) -> tuple[list[Action], list[Action], float | None]:
    """Evict the GPU pods (the drain); once none is left, mark handled (the mark).
    Also when to look again (None: drained)."""
    state, signal, record = fault.state, fault.signal, fault.record
    gpu_pods = _gpu_pods(state)
    to_evict = [p for p in gpu_pods if not p.deleting]
    standing = _checkpoints(to_evict, fault, config, now)
    ready = [p for p in to_evict if p.key not in standing or standing[p.key].evict_now]
    # A refused eviction waits out its backoff, whatever brings the node back here
    # sooner (a pod event, a watch echo): each attempt is a request and a record write.
    waits = {p.key: _next_attempt(p, _refusal(p, fault), config, now) for p in ready}
    due = [p for p in ready if waits[p.key] <= 0]
    actions: list[Action] = []
    if gpu_pods:
        asked = _ask(fault, list(standing.values()), now)
        actions += asked
        actions += [_evict_or_delete(p, fault, config, now) for p in due]
        actions += _checkpoint_outcomes(
            [standing[p.key] for p in due if p.key in standing], fault, now
        )
        # Only news goes into the record: pods terminating for their grace period
        # (seconds to minutes) or waiting for their next attempt must not rewrite it
        # on every reconcile.
        if due or (record.phase is not Phase.DRAINING and not asked):
            detail = f"{len(to_evict)} to evict, {len(gpu_pods) - len(to_evict)} terminating"
            actions.append(
                UpdateRecord(
                    record.name,
                    Phase.DRAINING,
                    _entry(now, Entry.EVICT, detail=detail),
                    record_evictions=True,
                )
            )
        # Terminating pods (and those tried now) are polled; a waiting one is looked
        # at again when its next attempt is due.
        terminating = len(gpu_pods) > len(to_evict)
        requeue = config.eviction_retry_base_seconds if due or terminating else None
        for wait in waits.values():
            if wait > 0:
                requeue = _soonest(requeue, wait)
        deadline = next_look(list(standing.values()), now)
        if deadline is not None:
            requeue = _soonest(requeue, deadline)
        return actions, [], requeue
    # Drained: only now mark the fault handled, then its record.
    if not fault.handled:
        actions.append(MarkHandled(state.node.name, signal.fault_id))
    if record.phase is not Phase.DRAINED:
        actions.append(UpdateRecord(record.name, Phase.DRAINED, _entry(now, Entry.DRAIN)))
    return [], actions, None


def _checkpoints(
    pods: list[PodView], fault: _Fault, config: Config, now: dt.datetime
) -> dict[str, PodCheckpoint]:
    """Where each pod stands with its checkpoint (docs/controller.md, "Checkpoint
    before eviction"); empty when the fault moves its pods at once."""
    wanted = config.checkpoint
    if not wanted.applies(fault.signal.reason, fault.signal.severity):
        return {}
    return {p.key: where(p, wanted, now) for p in pods}


def _ask(fault: _Fault, standing: list[PodCheckpoint], now: dt.datetime) -> list[Action]:
    """The requests to make now, then their record entry and Event. The entry is
    also written when the pods were asked but the record does not say so (the
    controller stopped between the two)."""
    record, signal = fault.record, fault.signal
    new = [c for c in standing if c.step is CheckpointStep.REQUEST]
    said = any(a.action == Entry.CHECKPOINT_REQUESTED for a in record.actions)
    waiting = [c for c in standing if c.step is CheckpointStep.WAITING]
    if not new and (said or not waiting):
        return []
    asked = new or waiting
    deadline = max(c.deadline for c in asked)
    pods = ", ".join(c.pod.key for c in asked)
    detail = f"{len(asked)} GPU pod(s) asked to checkpoint by {deadline}: {pods}"
    return [
        *(RequestCheckpoint(c.pod, signal.fault_id, c.deadline) for c in new),
        UpdateRecord(
            record.name, Phase.DRAINING, _entry(now, Entry.CHECKPOINT_REQUESTED, "waiting", detail)
        ),
        Emit(
            Reason.CHECKPOINT_REQUESTED,
            f"fault {signal.fault_id} ({signal.reason}): {detail}; evicted when each says "
            "done, or at its deadline",
            signal.node,
            record.name,
        ),
    ]


def _checkpoint_outcomes(
    evicted: list[PodCheckpoint], fault: _Fault, now: dt.datetime
) -> list[Action]:
    """Per pod evicted after its checkpoint request, why now: it said done, or its
    deadline passed. Once per pod (a blocked eviction is tried again)."""
    record = fault.record
    told = {
        a.detail.partition(": ")[0]
        for a in record.actions
        if a.action in (Entry.CHECKPOINTED, Entry.CHECKPOINT_TIMEOUT)
    }
    actions: list[Action] = []
    for c in evicted:
        if c.pod.key in told:
            continue
        if c.step is CheckpointStep.DONE:
            entry = _entry(now, Entry.CHECKPOINTED, detail=f"{c.pod.key}: said done")
        else:
            by = f"by {c.deadline}" if c.deadline else "(its deadline is not a time)"
            entry = _entry(
                now, Entry.CHECKPOINT_TIMEOUT, "timed-out", f"{c.pod.key}: not done {by}"
            )
        actions.append(UpdateRecord(record.name, Phase.DRAINING, entry))
    return actions


def _refusal(pod: PodView, fault: _Fault) -> Blocked | None:
    """The pod's refused eviction for this fault (one for an earlier fault is over)."""
    blocked = fault.state.blocked.get(pod.key)
    return blocked if blocked is not None and blocked.fault_id == fault.signal.fault_id else None


def _delete_at(pod: PodView, blocked: Blocked | None, config: Config) -> dt.datetime | None:
    """When a blocked pod may be deleted instead (evictionDeleteAfterSeconds), if ever."""
    limit = config.eviction_delete_after_seconds
    if blocked is None or limit is None or pod.namespace in config.protected_namespaces:
        return None
    return blocked.since + dt.timedelta(seconds=limit)


def _next_attempt(pod: PodView, blocked: Blocked | None, config: Config, now: dt.datetime) -> float:
    """Seconds until the pod's next attempt (0: now): its backoff, or its deletion
    if that comes sooner."""
    if blocked is None:
        return 0.0
    at = blocked.retry_at
    delete_at = _delete_at(pod, blocked, config)
    if delete_at is not None:
        at = min(at, delete_at)
    return max((at - now).total_seconds(), 0.0)


def _evict_or_delete(
    pod: PodView, fault: _Fault, config: Config, now: dt.datetime
) -> Evict | DeletePod:
    delete_at = _delete_at(pod, _refusal(pod, fault), config)
    if delete_at is not None and now >= delete_at:
        return DeletePod(pod, fault.signal.fault_id)
    return Evict(pod, fault.signal.fault_id)


def _restore(state: NodeState, config: Config, now: dt.datetime) -> Plan | None:
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
    create = _created(name, signal, Phase.QUARANTINED, config.mode_for(RESTORED_REASON), now)
    # Looked at again soon: the restored record's recovery must not wait on its watch
    # event alone (one coalesced with this reconcile leaves the node tainted).
    return Plan(
        record=(*create, Emit(Reason.RESTORED, note, node.name, name, warning=True)),
        requeue_after=config.hold_retry_seconds,
    )


def _fenced(node: NodeView, record: FaultRecord) -> bool:
    """Our taint for the record's fault is on the node, whatever the record says yet
    (a fence's pass leaves the status to the drain's: Plan.steps): it returns the
    way every quarantined node does."""
    taint = node.taint()
    return taint is not None and taint.value == values.taint_value(record.fault_id)


def _fence_unwritten(node: NodeView, record: FaultRecord, now: dt.datetime) -> list[Action]:
    """A fenced record's first entries when the fault cleared before the drain's
    pass wrote them (its status is then written by the recovery)."""
    taint = node.taint()
    if record.phase in TAINTED_PHASES or taint is None:
        return []
    signal = FaultSignal(node.name, record.fault_id, record.reason, record.source, record.severity)
    return [*_detected_later(record, now), *_taint_noted(record.name, taint, signal, now)]


def _taint_noted(name: str, taint: Taint, signal: FaultSignal, now: dt.datetime) -> list[Action]:
    """The `taint` entry and its Event after the fact, with the pass that writes the
    record's status: dated when the taint was added (whole seconds), where the
    taint says (ours does: writes.taint_patch)."""
    at = parse_time(taint.time_added) or now
    return [
        UpdateRecord(name, Phase.QUARANTINED, _entry(at, Entry.TAINT)),
        _quarantined(taint.effect, signal, name),
    ]


def _quarantined(effect: str, signal: FaultSignal, record: str) -> Emit:
    return Emit(
        Reason.QUARANTINED,
        f"tainted {effect} for {signal.reason} ({signal.severity}), fault {signal.fault_id}",
        signal.node,
        record,
    )


def _recover(state: NodeState, config: Config, now: dt.datetime) -> Plan:
    restored = _restore(state, config, now)
    if restored is not None:
        return restored
    node = state.node
    actions: list[Action] = []
    requeue: float | None = None
    untainted = False
    gate: GateResult | None = None
    for record in (r for r in state.records if r.open):
        if record.source.split("/", 1)[0] in state.unsettled:
            requeue = _soonest(requeue, config.hold_retry_seconds)
            continue  # its source has not looked again since this controller started
        if record.phase not in TAINTED_PHASES and not _fenced(node, record):
            actions += [
                UpdateRecord(record.name, Phase.RESOLVED, _cleared(record, now)),
                Emit(Reason.RECOVERED, f"fault {record.fault_id} cleared", node.name, record.name),
            ]
            continue
        actions += _fence_unwritten(node, record, now)
        # A repair's result that came as the fault cleared is recorded all the same.
        told = outcome_only(_subject(state, record, None), now)
        actions += _repair_actions(told, node.name, record)
        waiting = _not_yet(record, node.name, config, now)
        if waiting is not None:
            actions += waiting[0]
            requeue = _soonest(requeue, waiting[1])
            continue
        actions += _offender_released(record, node.name, now)
        since = parse_time(record.recovering_since) or now
        taint = node.taint()
        if taint is not None and config.health_gate.on_recovery:
            # The same gate as `gpuheal maintenance finish`: the taint stays until it passes.
            facts = facts_from_views(node, state.pods, state.pool_drivers, state.rollout)
            gate = evaluate(facts, config, now, since)
            if gate.passed and config.health_gate.validation.enabled:
                checked = validation.step(record, node, state.validations, config, now)
                actions += _validation_actions(record, checked)
                if checked.verdict is not None:
                    gate = evaluate(replace(facts, validation=checked.verdict), config, now, since)
                if not gate.passed or checked.verdict is None:  # said by the step
                    requeue = _soonest(requeue, checked.requeue_after or config.hold_retry_seconds)
                    continue
            if not gate.passed:
                actions += _gate_failed(record, gate, now)
                requeue = _soonest(requeue, config.hold_retry_seconds)
                continue
        if taint is not None and not untainted:
            actions.append(RemoveTaint(node.name))
            untainted = True
        actions += [
            UpdateRecord(record.name, Phase.RESOLVED, _entry(now, Entry.UNTAINT)),
            Emit(
                Reason.RECOVERED,
                f"healthy for {config.recovery_window_seconds:g}s; fault {record.fault_id} "
                "resolved, node returned",
                node.name,
                record.name,
            ),
        ]
    return Plan(release=tuple(actions), requeue_after=requeue)


def _not_yet(
    record: FaultRecord, node: str, config: Config, now: dt.datetime
) -> tuple[list[Action], float] | None:
    """A cleared fault's node that may not be judged for return yet: its recovery
    begins now, its window runs, or a person must release it first. The actions
    and when to look again; None when the gate may judge it."""
    since = parse_time(record.recovering_since)
    if since is None:
        began = UpdateRecord(
            record.name, Phase.RECOVERING, _entry(now, Entry.RECOVERING), recovering_since=iso(now)
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
    return _said_released(record, record.phase, node, what, now)


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
        UpdateRecord(record.name, record.phase, _entry(now, Entry.HELD_FOR_A_PERSON, "held", why)),
        Emit(Reason.HELD, why, node, record.name, warning=True),
    ]


def _cleared(record: FaultRecord, now: dt.datetime) -> ActionEntry:
    """The entry of a fault that cleared before anything was done on its node; an
    answer to its plan that came meanwhile is noted, and does nothing."""
    if record.phase is not Phase.AWAITING_APPROVAL:
        return _entry(now, Entry.RECOVERED, detail="fault cleared before quarantine")
    if record.decision:
        by = f"by {record.decided_by} at {record.decided_at}"
        return _entry(now, record.decision, "ignored", f"{by}: the fault had cleared; nothing done")
    return _entry(now, Entry.RECOVERED, detail="fault cleared before approval; nothing done")


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
        UpdateRecord(record.name, record.phase, _entry(now, Entry.GATE_FAILED, "failed", detail)),
        Emit(
            Reason.GATE_FAILED,
            f"fault {record.fault_id}: health gate failed, node stays tainted; {gate.summary()}",
            record.node,
            record.name,
            warning=True,
        ),
    ]


def _soonest(current: float | None, candidate: float) -> float:
    return candidate if current is None else min(current, candidate)


def _with(
    base: Plan,
    record: Sequence[Action],
    *,
    fence: Sequence[Action] = (),
    drain: Sequence[Action] = (),
    mark: Sequence[Action] = (),
    repair: Sequence[Action] = (),
    suppressed: str | None = None,
    requeue_after: float | None = None,
    new_quarantine: bool = False,
    new_repair: bool = False,
) -> Plan:
    return Plan(
        record=tuple(record),
        fence=_with_mark(fence, mark),
        drain=tuple(drain),
        mark=tuple(mark),
        repair=tuple(repair),
        requeue_after=requeue_after,
        suppressed=suppressed,
        new_quarantine=new_quarantine,
        new_repair=new_repair,
        fault_id=base.fault_id,
        reason=base.reason,
    )


def _with_mark(fence: Sequence[Action], mark: Sequence[Action]) -> tuple[Action, ...]:
    """The fence, its taint carrying the handled mark the same pass writes (AddTaint.with_mark)."""
    marked = {(a.node, a.fault_id) for a in mark if isinstance(a, MarkHandled)}
    return tuple(
        replace(a, with_mark=True)
        if isinstance(a, AddTaint) and (a.node, a.fault_id) in marked
        else a
        for a in fence
    )
