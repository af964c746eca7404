"""Approval mode and observe mode's "would have" notes, rule by rule (the pure policy)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from gpuheal.clock import iso
from gpuheal.config import ApprovalConfig
from gpuheal.model import APPROVED, REJECTED, ActionEntry, FaultRecord, Mode, Phase, Severity
from gpuheal.policy.actions import (
    AwaitApproval,
    Emit,
    NodeState,
    Plan,
    UpdateRecord,
    WouldQuarantine,
)
from gpuheal.policy.plan import plan
from gpuheal.values import taint_value
from gpuheal.vocabulary import Entry
from tests.unit.test_policy_plan import (
    CONFIG,
    F1,
    N1,
    NOW,
    faulty,
    gpu_pod,
    healthy,
    kinds,
    record,
)

APPROVING = replace(CONFIG, approval=ApprovalConfig(by_reason={"XidCritical79": True}))
PODS = (gpu_pod("trainer-1"), gpu_pod("trainer-0"))


def asked(decision: str = "", decided_by: str = "", decided_at: str = "") -> FaultRecord:
    """The fault's record, its plan put to a person at NOW (and answered, if given)."""
    entry = ActionEntry(iso(NOW), Entry.AWAITING_APPROVAL, "waiting")
    waiting = record(Phase.AWAITING_APPROVAL, actions=(entry,), reason="XidCritical79")
    return replace(waiting, decision=decision, decided_by=decided_by, decided_at=decided_at)


def updates(p: Plan) -> list[UpdateRecord]:
    return [a for a in p.actions if isinstance(a, UpdateRecord)]


def reasons(p: Plan) -> list[str]:
    return [a.reason for a in p.actions if isinstance(a, Emit)]


def test_a_fault_that_needs_approval_records_its_plan_and_touches_nothing() -> None:
    p = plan(NodeState(faulty(), pods=PODS, gpu_nodes=4), APPROVING, NOW)
    assert kinds(p) == ["CreateRecord", "UpdateRecord", "Emit", "AwaitApproval", "Emit"]
    awaiting = next(a for a in p.actions if isinstance(a, AwaitApproval))
    assert awaiting.phase is Phase.AWAITING_APPROVAL
    assert awaiting.plan is not None
    assert awaiting.plan.evict == ("ml/trainer-0", "ml/trainer-1")
    assert awaiting.plan.taint == f"gpuheal.io/gpu-fault={taint_value(F1)}:NoSchedule"
    assert reasons(p) == ["GPUFaultDetected", "GPUFaultAwaitingApproval"]
    assert p.requeue_after == APPROVING.approval.expiry_seconds
    assert not p.new_quarantine


def test_approval_is_per_reason_and_quarantine_mode_plans_no_eviction() -> None:
    other = replace(APPROVING, approval=ApprovalConfig(required=True, by_reason={"Other": False}))
    node = faulty(**{"gpuheal.io/fault-reason": "Other"})
    assert "AddTaint" in kinds(plan(NodeState(node, pods=PODS, gpu_nodes=4), other, NOW))
    quarantine = replace(APPROVING, mode=Mode.QUARANTINE)
    p = plan(NodeState(faulty(), pods=PODS, gpu_nodes=4), quarantine, NOW)
    awaiting = next(a for a in p.actions if isinstance(a, AwaitApproval))
    assert awaiting.plan is not None and awaiting.plan.evict == ()


def test_a_waiting_plan_does_nothing_until_it_expires() -> None:
    state = NodeState(faulty(), pods=PODS, gpu_nodes=4, records=(asked(),))
    later = NOW + dt.timedelta(seconds=600)
    p = plan(state, APPROVING, later)
    assert p.actions == () and p.suppressed == "awaiting-approval"
    assert p.requeue_after is not None and abs(p.requeue_after - 3000) < 1e-6
    expired = plan(state, APPROVING, NOW + dt.timedelta(seconds=3600))
    assert [(u.phase, u.entry.action) for u in updates(expired)] == [
        (Phase.FAILED, "approval-expired")
    ]
    assert reasons(expired) == ["GPUFaultApprovalExpired"]
    assert "AddTaint" not in kinds(expired)


def test_an_approved_plan_is_carried_out_once_and_audited() -> None:
    rec = asked(decision=APPROVED, decided_by="alice@example.com", decided_at=iso(NOW))
    state = NodeState(faulty(), pods=PODS, gpu_nodes=4, records=(rec,))
    p = plan(state, APPROVING, NOW)
    first = updates(p)[0]
    assert (first.phase, first.entry.action) == (Phase.DETECTED, "approved")
    assert "by alice@example.com" in first.entry.detail
    assert reasons(p)[0] == "GPUFaultApproved"
    assert "AddTaint" in kinds(p) and p.new_quarantine
    # Once approved (the record left AwaitingApproval), the fault goes on as any other.
    done = replace(rec, phase=Phase.QUARANTINED, actions=(*rec.actions, first.entry))
    again = plan(replace(state, records=(done,)), APPROVING, NOW)
    assert "AwaitApproval" not in kinds(again) and "GPUFaultApproved" not in reasons(again)


def test_the_breaker_still_applies_after_approval() -> None:
    rec = asked(decision=APPROVED, decided_by="alice", decided_at=iso(NOW))
    full = frozenset(f"q{i}" for i in range(10))
    state = NodeState(faulty(), pods=PODS, gpu_nodes=20, quarantined=full, records=(rec,))
    p = plan(state, replace(APPROVING, breaker_max_nodes=2), NOW)
    assert [u.phase for u in updates(p)] == [Phase.DETECTED, Phase.HELD]
    assert "AddTaint" not in kinds(p)


def test_a_rejected_plan_is_resolved_with_who_rejected_it() -> None:
    rec = asked(decision=REJECTED, decided_by="bob", decided_at=iso(NOW))
    p = plan(NodeState(faulty(), pods=PODS, records=(rec,)), APPROVING, NOW)
    assert [(u.phase, u.entry.action, u.entry.result) for u in updates(p)] == [
        (Phase.RESOLVED, "rejected", "rejected")
    ]
    assert "by bob" in updates(p)[0].entry.detail
    assert reasons(p) == ["GPUFaultRejected"] and "AddTaint" not in kinds(p)


def test_an_approval_for_a_fault_that_cleared_does_nothing_and_says_so() -> None:
    rec = asked(decision=APPROVED, decided_by="alice", decided_at=iso(NOW))
    p = plan(NodeState(healthy(), pods=PODS, records=(rec,)), APPROVING, NOW)
    assert kinds(p) == ["UpdateRecord", "Emit"]
    (update,) = updates(p)
    assert (update.phase, update.entry.action, update.entry.result) == (
        Phase.RESOLVED,
        "approved",
        "ignored",
    )
    assert "had cleared" in update.entry.detail
    unanswered = plan(NodeState(healthy(), records=(asked(),)), APPROVING, NOW)
    assert "before approval" in updates(unanswered)[0].entry.detail


def test_an_escalating_p1_asks_for_approval_before_acting() -> None:
    config = replace(APPROVING, p1_taint=True)
    node = faulty(**{"gpuheal.io/fault-severity": "P1"})
    first = plan(NodeState(node, pods=PODS, gpu_nodes=4), config, NOW)
    assert "AddTaint" not in kinds(first)  # p1Taint is a taint too: it waits for approval
    since = NOW - dt.timedelta(seconds=config.p1_escalation_seconds + 1)
    watched = record(
        Phase.DETECTED,
        severity=Severity.P1,
        reason="XidCritical79",
        actions=(ActionEntry(iso(since), "detect", "ok"),),
    )
    p = plan(NodeState(node, pods=PODS, gpu_nodes=4, records=(watched,)), config, NOW)
    assert "AwaitApproval" in kinds(p) and "AddTaint" not in kinds(p)


def test_observe_mode_notes_what_it_would_have_done_once() -> None:
    config = replace(CONFIG, mode=Mode.OBSERVE)
    p = plan(NodeState(faulty(), pods=PODS, gpu_nodes=4), config, NOW)
    would = next(a for a in p.actions if isinstance(a, WouldQuarantine))
    assert would.entry.action == "would-quarantine"
    assert would.plan is not None and would.plan.evict == ("ml/trainer-0", "ml/trainer-1")
    assert not {"AddTaint", "Evict", "MarkHandled"} & set(kinds(p))
    rec = record(Phase.DETECTED, actions=(would.entry,))
    again = plan(NodeState(faulty(), pods=PODS, records=(rec,)), config, NOW)
    assert again.actions == ()
    # P2 is record-only in every mode: nothing it "would" have done.
    p2 = faulty(**{"gpuheal.io/fault-severity": "P2"})
    assert "WouldQuarantine" not in kinds(plan(NodeState(p2, pods=PODS), config, NOW))


def test_observe_mode_notes_a_p1_only_once_it_outlasts_its_window() -> None:
    config = replace(CONFIG, mode=Mode.OBSERVE)
    node = faulty(**{"gpuheal.io/fault-severity": "P1"})
    first = plan(NodeState(node, pods=PODS), config, NOW)
    assert "WouldQuarantine" not in kinds(first)
    assert first.requeue_after == config.p1_escalation_seconds
    since = NOW - dt.timedelta(seconds=config.p1_escalation_seconds)
    rec = record(
        Phase.DETECTED, severity=Severity.P1, actions=(ActionEntry(iso(since), "detect", "ok"),)
    )
    later = plan(NodeState(node, pods=PODS, records=(rec,)), config, NOW)
    assert kinds(later) == ["WouldQuarantine"]
    assert N1 in later.actions[0].entry.detail  # type: ignore[union-attr]
