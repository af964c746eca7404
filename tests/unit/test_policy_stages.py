"""A plan names its stages: the controller runs a new quarantine's fence under the
breaker lock and its drain on the node's next turn by name, not by the position of
an action of some kind in one list."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from gpuheal.clock import iso
from gpuheal.model import HANDLED_FAULT_ID, LAST_PROCESS_TIME, STATE_LABEL, Mode, Phase
from gpuheal.policy.actions import (
    AddTaint,
    CreateRecord,
    Emit,
    Evict,
    Guard,
    MarkHandled,
    NodeState,
    Plan,
    PlanStep,
    RemoveTaint,
    Then,
    UpdateRecord,
)
from gpuheal.policy.plan import plan
from tests.unit.test_policy_plan import CONFIG, F1, NOW, faulty, gpu_pod, healthy, record, tainted


def names(actions: tuple[object, ...]) -> list[str]:
    return [type(a).__name__ for a in actions]


def every_stage(p: Plan) -> tuple[object, ...]:
    return p.record + p.fence + p.drain + p.mark + p.release


def test_a_new_fault_in_full_mode_records_fences_then_drains() -> None:
    pods = (gpu_pod("a"), gpu_pod("b"))
    p = plan(NodeState(faulty(), pods=pods, gpu_nodes=10), CONFIG, NOW)
    assert names(p.record) == ["CreateRecord", "UpdateRecord", "Emit"]
    assert names(p.fence) == ["AddTaint", "UpdateRecord", "Emit"]
    assert names(p.drain) == ["Evict", "Evict", "UpdateRecord"]
    assert p.mark == () and p.release == ()
    assert p.new_quarantine and p.moves_pods
    assert p.actions == every_stage(p)
    assert isinstance(p.record[0], CreateRecord)  # the lock first
    assert isinstance(p.fence[0], AddTaint)
    assert all(isinstance(a, Evict) for a in p.drain[:-1])


def test_a_node_without_gpu_pods_is_fenced_then_marked_in_one_pass() -> None:
    p = plan(NodeState(faulty(), gpu_nodes=10), CONFIG, NOW)
    assert names(p.fence) == ["AddTaint", "UpdateRecord", "Emit"]
    assert p.drain == () and not p.moves_pods
    assert names(p.mark) == ["MarkHandled", "UpdateRecord"]
    drained = p.mark[1]
    assert isinstance(drained, UpdateRecord) and drained.phase is Phase.DRAINED


def test_quarantine_mode_fences_and_marks_without_a_drain() -> None:
    config = replace(CONFIG, mode=Mode.QUARANTINE)
    p = plan(NodeState(faulty(), pods=(gpu_pod("a"),), gpu_nodes=10), config, NOW)
    assert names(p.fence)[0] == "AddTaint" and p.drain == ()
    assert p.mark == (MarkHandled(faulty().name, p.fault_id),)


def test_pods_only_terminating_make_a_drain_that_moves_none() -> None:
    leaving = (replace(gpu_pod("a"), deleting=True),)
    p = plan(NodeState(faulty(), pods=leaving, gpu_nodes=10), CONFIG, NOW)
    assert names(p.drain) == ["UpdateRecord"] and not p.moves_pods


def test_a_full_breaker_holds_the_fault_in_its_record_stage_alone() -> None:
    config = replace(CONFIG, breaker_max_nodes=0)
    p = plan(NodeState(faulty(), gpu_nodes=10), config, NOW)
    assert names(p.record) == ["CreateRecord", "UpdateRecord", "Emit", "Emit"]
    assert p.fence == p.drain == p.mark == () and not p.new_quarantine


def test_recovery_and_our_label_are_the_release() -> None:
    since = iso(NOW - dt.timedelta(hours=1))  # past the recovery window
    recovering = record(Phase.RECOVERING, recovering_since=since)
    healed = replace(tainted(faulty()), annotations={})
    p = plan(NodeState(healed, records=(recovering,)), CONFIG, NOW)
    assert names(p.release) == ["RemoveTaint", "UpdateRecord", "Emit"]
    assert p.record == p.fence == p.drain == p.mark == ()
    # A person's untaint: noted (fence), marked, and our label follows (release).
    labelled = replace(faulty(), labels={**faulty().labels, STATE_LABEL: "quarantined"})
    respected = plan(NodeState(labelled, records=(record(Phase.DRAINED),)), CONFIG, NOW)
    assert [names(respected.fence), names(respected.mark), names(respected.release)] == [
        ["UpdateRecord"],
        ["MarkHandled"],
        ["RemoveTaint"],
    ]
    assert isinstance(respected.fence[0], UpdateRecord)
    assert isinstance(respected.release[0], RemoveTaint)
    assert not any(isinstance(a, Emit) for a in respected.actions)


# -- the plan as steps (what controller/runner.py carries out) ----------------------


def test_a_new_quarantine_that_moves_pods_is_its_taint_alone_then_the_next_turn() -> None:
    pods = (gpu_pod("a"), gpu_pod("b"))
    p = plan(NodeState(faulty(), pods=pods, gpu_nodes=10), CONFIG, NOW)
    # Nothing before the taint, nothing beside it: the record, its entries, the
    # Events and the drain are the next turn's (the plan made there from the taint).
    (fence,) = p.steps
    assert (names(fence.actions), fence.guard, fence.then) == (
        ["AddTaint"],
        Guard.BREAKER,
        Then.NEXT_TURN,
    )


def test_our_taint_without_its_record_is_past_the_cooldown_and_approval() -> None:
    """The taint went first and its record is the next turn's (or the controller
    stopped between the two): a cooldown or approval does not stop the record that
    is missing, and no second taint is asked for."""
    fenced = tainted(faulty())
    fenced = replace(
        fenced,
        annotations=fenced.annotations | {LAST_PROCESS_TIME: iso(NOW - dt.timedelta(seconds=5))},
    )
    approving = replace(
        CONFIG, cooldown_seconds=600, approval=replace(CONFIG.approval, required=True)
    )
    for config in (CONFIG, approving):
        p = plan(NodeState(fenced, gpu_nodes=10), config, NOW)
        assert names(p.record)[:2] == ["CreateRecord", "UpdateRecord"], (config, p)
        assert "AddTaint" not in names(p.actions) and "AwaitApproval" not in names(p.actions)
        assert not p.new_quarantine and p.suppressed is None


def test_a_handled_fault_whose_record_a_person_deleted_stays_handled() -> None:
    """Our taint, the fault marked handled, no record: a person deleted it. Nothing
    is made again while the fault is reported; once it clears the record is
    restored (test_policy_plan's restore test)."""
    marked = tainted(faulty())
    marked = replace(marked, annotations=marked.annotations | {HANDLED_FAULT_ID: F1})
    p = plan(NodeState(marked, gpu_nodes=10), CONFIG, NOW)
    assert p.actions == () and p.suppressed == "handled"


def test_the_drain_pass_writes_the_status_the_fence_pass_left_in_one_write() -> None:
    """What the fence's pass left (our taint, dated; no record) is what the drain's
    plan sees: the record, its detect, taint and evict entries in order, both
    Events, the evictions, in one step."""
    pods = (gpu_pod("a"), gpu_pod("b"))
    node = tainted(faulty())
    (ours,) = node.taints
    node = replace(node, taints=(replace(ours, time_added="2026-11-29T12:00:01Z"),))
    p = plan(NodeState(node, pods=pods, gpu_nodes=10), CONFIG, NOW)
    assert not p.new_quarantine and len(p.steps) == 1
    assert names(p.actions) == [
        *("CreateRecord", "UpdateRecord", "Emit", "UpdateRecord", "Emit"),
        *("Evict", "Evict", "UpdateRecord"),
    ]
    entries = [a for a in p.actions if isinstance(a, UpdateRecord)]
    assert [(u.entry.action, u.entry.time, u.phase) for u in entries] == [
        ("detect", iso(NOW), Phase.DETECTED),
        ("taint", "2026-11-29T12:00:01.000Z", Phase.QUARANTINED),
        ("evict", iso(NOW), Phase.DRAINING),
    ]
    said = [a.reason for a in p.actions if isinstance(a, Emit)]
    assert said == ["GPUFaultDetected", "GPUFaultQuarantined"]


def test_a_record_whose_status_was_never_written_gets_its_first_entries() -> None:
    """A controller stopped between a record and its status: the next pass writes
    `detect` (dated when the record was made) and `taint` (from the taint)."""
    pods = (gpu_pod("a"),)
    created = record(Phase.DETECTED, created_at="2026-11-29T12:00:00Z", actions=())
    node = tainted(faulty())
    p = plan(NodeState(node, pods=pods, records=(created,), gpu_nodes=10), CONFIG, NOW)
    entries = [a for a in p.actions if isinstance(a, UpdateRecord)]
    assert [(u.entry.action, u.entry.time) for u in entries][:2] == [
        ("detect", "2026-11-29T12:00:00.000Z"),
        ("taint", iso(NOW)),  # a taint without timeAdded: dated now
    ]
    assert entries[0].entry.detail == created.source
    assert "AddTaint" not in names(p.actions) and "CreateRecord" not in names(p.actions)


def test_a_fault_that_clears_before_the_drain_pass_returns_through_recovery_not_resolved() -> None:
    """The fence's pass left the status; the fault cleared at once: the node is ours
    and tainted, so it returns the way every quarantined node does (never a record
    resolved under a taint nobody would lift)."""
    created = record(Phase.DETECTED, created_at="2026-11-29T12:00:00Z", actions=())
    node = tainted(healthy())
    p = plan(NodeState(node, records=(created,), gpu_nodes=10), CONFIG, NOW)
    entries = [a for a in p.actions if isinstance(a, UpdateRecord)]
    assert [u.entry.action for u in entries] == ["detect", "taint", "recovering"]
    assert entries[-1].phase is Phase.RECOVERING
    assert "RemoveTaint" not in names(p.actions)


def test_a_new_quarantine_with_nothing_to_move_ends_in_the_same_pass() -> None:
    p = plan(NodeState(faulty(), gpu_nodes=10), CONFIG, NOW)
    fence, record_step, rest = p.steps
    assert fence.guard is Guard.BREAKER and fence.then is Then.CONTINUE
    assert record_step == PlanStep(p.record + p.fence, Guard.NONE, Then.CONTINUE)
    assert rest == PlanStep(p.drain + p.mark + p.release, Guard.NONE, Then.LATER)
    # The taint's PATCH carries the handled mark: the policy merged them.
    (taint,) = [a for a in fence.actions if isinstance(a, AddTaint)]
    assert taint.with_mark and MarkHandled(taint.node, taint.fault_id) in rest.actions


def test_a_plan_that_is_no_new_quarantine_is_one_unguarded_step() -> None:
    quarantined = record(Phase.QUARANTINED, created_at=iso(NOW))
    p = plan(
        NodeState(tainted(faulty()), pods=(gpu_pod("a"),), records=(quarantined,), gpu_nodes=10),
        CONFIG,
        NOW,
    )
    assert not p.new_quarantine and p.actions
    assert p.steps == (PlanStep(p.actions, Guard.NONE, Then.LATER),)
    assert replace(p, new_repair=True).steps == (
        PlanStep(p.actions, Guard.REPAIR_BUDGET, Then.LATER),
    )
