"""The dispatcher: one node's state, config and time to its plan, stage by stage.

A node that reports no fault recovers (recover); a reported fault is admitted
(admit: its record, then the watch, approval and the breaker), fenced (fence),
drained in `full` mode (drain) and, with repair on, repaired (repair). Each stage
either ends the plan or hands the fault to the next; what every plan carries
afterwards (the disruption guard, the state label) is follow's."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from gpuheal.config import Config
from gpuheal.model import (
    HANDLED_FAULT_ID,
    FaultRecord,
    FaultSignal,
    Mode,
    Phase,
    Severity,
    fault_record_name,
)
from gpuheal.policy.actions import Action, MarkHandled, NodeState, Plan, UpdateRecord
from gpuheal.policy.nodes import in_maintenance, opted_out
from gpuheal.policy.plan.admit import admit, others_open, stale
from gpuheal.policy.plan.drain import drain_step
from gpuheal.policy.plan.fault import Fault, detected_later, entry, plan_with
from gpuheal.policy.plan.fence import fence_step, quarantines
from gpuheal.policy.plan.follow import guard_follows_work, label_follows_taint
from gpuheal.policy.plan.recover import recover
from gpuheal.policy.plan.repair import after_drain, repair_actions
from gpuheal.policy.plan.signals import current_signal
from gpuheal.policy.plan.watch import escalation, watching
from gpuheal.policy.recent import handled_lately
from gpuheal.policy.repair import RepairStep
from gpuheal.sources import SOURCES, Seen, Source
from gpuheal.vocabulary import Entry


def plan(
    state: NodeState, config: Config, now: dt.datetime, sources: Sequence[Source] = SOURCES
) -> Plan:
    """The node's plan; its current signal is decided here, once, from `sources`."""
    return guard_follows_work(state, config, _decided(state, config, now, sources))


def plan_node_gone(records: tuple[FaultRecord, ...], now: dt.datetime) -> Plan:
    """The Node object was deleted: close its open records (nothing left to act on)."""
    return Plan(
        record=tuple(
            UpdateRecord(r.name, Phase.RESOLVED, entry(now, Entry.NODE_DELETED))
            for r in records
            if r.open
        )
    )


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
        decided = recover(state, config, now)
    else:
        decided = stale(state, signal, now) or _remediate(state, signal, config, now)
    return label_follows_taint(node, decided)


def _remediate(state: NodeState, signal: FaultSignal, config: Config, now: dt.datetime) -> Plan:
    """A reported fault's plan: admitted, then fenced, drained and repaired as far
    as its mode and the world allow."""
    node = state.node
    name = fault_record_name(node.name, signal.fault_id)
    record = next((r for r in state.records if r.name == name), None)
    fault = Fault(
        state=state,
        signal=signal,
        record=record or FaultRecord(name, node.name, signal.fault_id, Phase.DETECTED),
        mode=Mode.OBSERVE if signal.severity is Severity.P2 else config.mode_for(signal.reason),
        handled=node.annotations.get(HANDLED_FAULT_ID) == signal.fault_id,
    )
    base = Plan(fault_id=signal.fault_id, reason=signal.reason)
    # An older fault of this node still open: the new fault supersedes it.
    actions: list[Action] = [
        UpdateRecord(
            r.name, Phase.RESOLVED, entry(now, Entry.SUPERSEDED, detail=f"by {signal.fault_id}")
        )
        for r in others_open(state, name)
    ]
    actions += detected_later(record, now)
    watched = watching(record, signal, config, now)
    if record is not None and record.open and not watched:
        actions += escalation(fault, config, now)
    admitted = admit(fault, record, watched, config, now=now, actions=actions, base=base)
    if isinstance(admitted, Plan):
        return admitted
    return _advance(admitted, config, now, actions, base)


def _advance(
    fault: Fault, config: Config, now: dt.datetime, actions: list[Action], base: Plan
) -> Plan:
    """An admitted fault: fenced; in `full` mode drained, then repaired."""
    fence, respected = fence_step(fault, config, now)
    new_quarantine = quarantines(fault, fence)
    node, signal = fault.state.node, fault.signal
    handled = [] if fault.handled else [MarkHandled(node.name, signal.fault_id)]
    if respected:
        return plan_with(base, actions, fence=fence, mark=handled, suppressed="manual-untaint")
    if fault.mode is Mode.QUARANTINE:
        return plan_with(base, actions, fence=fence, mark=handled, new_quarantine=new_quarantine)
    drain, mark, requeue = drain_step(fault, config, now)
    repair = RepairStep()
    if not drain and requeue is None:
        repair, requeue = after_drain(fault, config, now, drained_now=bool(mark) or new_quarantine)
    return plan_with(
        base,
        actions,
        fence=fence,
        drain=drain,
        mark=mark,
        repair=repair_actions(repair, node.name, fault.record),
        new_quarantine=new_quarantine,
        new_repair=repair.request is not None,
        suppressed=repair.suppressed,
        requeue_after=requeue,
    )
