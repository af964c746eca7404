"""The repair stage (`repair.enabled`): once the node is drained, its agent is
asked for a GPU reset or a reboot (gpuheal/policy/repair.py decides which and
when); the request goes first, then its record entries, then its Events."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from gpuheal.config import Config
from gpuheal.model import TAINTED_PHASES, FaultRecord, FaultSignal, Phase
from gpuheal.policy.actions import Action, Emit, NodeState, ReplaceIntent, UpdateRecord
from gpuheal.policy.plan.fault import Fault
from gpuheal.policy.repair import RepairStep, Subject
from gpuheal.policy.repair import step as repair_step


def after_drain(
    fault: Fault, config: Config, now: dt.datetime, *, drained_now: bool
) -> tuple[RepairStep, float | None]:
    """The repair of a drained node, and when to look again: on the node's next
    turn when it was drained (or fenced) by this very pass."""
    if not config.repair.enabled:
        return RepairStep(), None
    if drained_now:
        return RepairStep(), 0.1
    repair = repair_step(subject(fault.state, fault.record, fault.signal), config, now)
    return repair, repair.requeue_after


def subject(state: NodeState, record: FaultRecord, signal: FaultSignal | None) -> Subject:
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


def repair_actions(repair: RepairStep, node: str, record: FaultRecord) -> tuple[Action, ...]:
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
