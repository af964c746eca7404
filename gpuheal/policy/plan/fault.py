"""What every stage of a fault's plan shares: the fault being advanced, the
record's entries and creation, and the plan's assembly from its stages."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuheal import values
from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.model import (
    TAINT_KEY,
    ActionEntry,
    FaultRecord,
    FaultSignal,
    Mode,
    NodeView,
    Phase,
    PodView,
    Taint,
)
from gpuheal.policy.actions import (
    Action,
    AddTaint,
    CreateRecord,
    Emit,
    MarkHandled,
    NodeState,
    Plan,
    Planned,
    UpdateRecord,
)
from gpuheal.policy.breaker import breaker_allows
from gpuheal.vocabulary import Entry, Reason


@dataclass(frozen=True)
class Fault:
    """The fault being advanced, and what is already known about it. Its record
    is the one on file, or the one about to be made (phase Detected)."""

    state: NodeState
    signal: FaultSignal
    record: FaultRecord
    mode: Mode
    handled: bool


def entry(now: dt.datetime, action: str, result: str = "ok", detail: str = "") -> ActionEntry:
    return ActionEntry(
        time=iso(now), action=action, result=result, detail=values.text(detail, values.DETAIL_MAX)
    )


def created(
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
    It names the faults it supersedes (admit.superseded_ids), so their closing,
    written when the pass ends, is not lost with the pass (admit.stale)."""
    return [
        CreateRecord(name, signal, phase, mode, supersedes),
        UpdateRecord(name, phase, entry(now, Entry.DETECT, detail=signal.source)),
    ]


def detected_later(record: FaultRecord | None, now: dt.datetime) -> list[Action]:
    """The `detect` entry of a record whose status was never written (no entry,
    the phase a status-less record reads as): a new quarantine's fence pass leaves
    it to the drain pass (Plan.steps), and a controller may stop between the record
    and its status. Dated when the record was made (whole seconds)."""
    if record is None or record.actions or record.phase is not Phase.DETECTED:
        return []
    at = parse_time(record.created_at) or now
    return [UpdateRecord(record.name, record.phase, entry(at, Entry.DETECT, detail=record.source))]


def gpu_pods(state: NodeState) -> list[PodView]:
    """The pods a drain moves. Our canary pods tolerate the taint on purpose: they
    test a device before release."""
    return [p for p in state.pods if p.gpu and not p.daemonset and not p.terminal and not p.canary]


def planned(fault: Fault, config: Config) -> Planned:
    """What quarantining the fault's node would do: in `full` (and observed) the
    drain's pods too."""
    taint = f"{TAINT_KEY}={values.taint_value(fault.signal.fault_id)}:{config.taint_effect}"
    moves = fault.mode is not Mode.QUARANTINE
    pods = tuple(sorted(p.key for p in gpu_pods(fault.state))) if moves else ()
    return Planned(fault.state.node.name, taint, pods)


def may_quarantine(state: NodeState, config: Config) -> bool:
    """The breaker lets this node be quarantined (a node with our taint is counted)."""
    if state.node.taint() is not None:
        return True  # already counted among the quarantined
    others = len(state.quarantined - {state.node.name})
    return breaker_allows(others, state.gpu_nodes, config)


def held_note(state: NodeState, config: Config) -> str:
    others = len(state.quarantined - {state.node.name})
    return (
        f"blast-radius breaker: {others} of {state.gpu_nodes} GPU nodes quarantined "
        f"(limit {config.breaker_max_nodes} nodes / {config.breaker_max_percent:g}%); "
        "held until capacity frees"
    )


def fenced(node: NodeView, record: FaultRecord) -> bool:
    """Our taint for the record's fault is on the node, whatever the record says yet
    (a fence's pass leaves the status to the drain's: Plan.steps): it returns the
    way every quarantined node does."""
    taint = node.taint()
    return taint is not None and taint.value == values.taint_value(record.fault_id)


def taint_noted(name: str, taint: Taint, signal: FaultSignal, now: dt.datetime) -> list[Action]:
    """The `taint` entry and its Event after the fact, with the pass that writes the
    record's status: dated when the taint was added (whole seconds), where the
    taint says (ours does: writes.taint_patch)."""
    at = parse_time(taint.time_added) or now
    return [
        UpdateRecord(name, Phase.QUARANTINED, entry(at, Entry.TAINT)),
        quarantined(taint.effect, signal, name),
    ]


def quarantined(effect: str, signal: FaultSignal, record: str) -> Emit:
    return Emit(
        Reason.QUARANTINED,
        f"tainted {effect} for {signal.reason} ({signal.severity}), fault {signal.fault_id}",
        signal.node,
        record,
    )


def said_released(
    record: FaultRecord, phase: Phase, node: str, what: str, now: dt.datetime
) -> list[Action]:
    """A person's release in the record (`released`, by whom) and its Event, once;
    `what` says what it lets happen, `{by}` the person and when."""
    if any(a.action == Entry.RELEASED for a in record.actions):
        return []  # said on an earlier pass that did not get further
    by = f"by {record.released_by} at {record.released_at}"
    return [
        UpdateRecord(record.name, phase, entry(now, Entry.RELEASED, "ok", by)),
        Emit(
            Reason.RELEASED,
            f"fault {record.fault_id}: " + what.format(by=by),
            node,
            record.name,
        ),
    ]


def soonest(current: float | None, candidate: float) -> float:
    return candidate if current is None else min(current, candidate)


def plan_with(
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
    """The fault's plan from its stages' actions (`base`: its fault id and reason)."""
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
