"""repair.approval: an attempt of an approval-required repair waits for a person's
answer (status.repairApproval) before anything is asked of the node; approved goes
on, rejected and expired go to a person. And the answer's side: when a record takes
an answer for its repair, and what the answer writes."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from gpuheal.clock import iso
from gpuheal.config import ConfigError, RepairConfig, parse_config
from gpuheal.controller.effects.context import PassOutcome
from gpuheal.controller.notices import notice_for
from gpuheal.model import (
    APPROVED,
    REJECTED,
    REPAIR_REQUEST,
    ActionEntry,
    FaultRecord,
    Phase,
    RepairApproval,
)
from gpuheal.policy.actions import UpdateRecord
from gpuheal.policy.approval import answer_patch, refusal
from gpuheal.policy.plan import plan
from gpuheal.policy.repair import awaiting_approval, repair_metric
from gpuheal.policy.repairwire import RepairRequest, decode_request
from gpuheal.vocabulary import Entry, Reason
from gpuheal.xid import Action
from tests.unit.test_policy_repair import (
    CONFIG,
    DIGEST,
    GPU,
    NOW,
    _after_failures,
    drained,
    entries,
    entry,
    events,
    node,
    requests,
    state,
)

APPROVING = replace(CONFIG, repair=replace(CONFIG.repair, approval=("reset-gpu",)))
EXPIRY = APPROVING.approval.expiry_seconds
BY = "system:serviceaccount:gpu-ops:night-oncall"


def question(
    attempt: int = 1, action: str = "reset-gpu", since: dt.datetime = NOW
) -> RepairApproval:
    return RepairApproval(attempt, action, iso(since, "seconds"))


def asked_record(
    *more: ActionEntry, asked: RepairApproval | None = None, decision: str = ""
) -> FaultRecord:
    """The record after the question of attempt 1 was written (and answered)."""
    asked = asked or question()
    if decision:
        asked = replace(asked, decision=decision, by=BY, at=iso(NOW))
    said = entry(Entry.REPAIR_AWAITING_APPROVAL, f"reset-gpu attempt 1: reset {GPU}", "waiting")
    record = drained(said, *more)
    return replace(record, repair_approval=asked)


def test_an_approval_required_repair_asks_a_person_and_nothing_of_the_node() -> None:
    p = plan(state(node(), drained()), APPROVING, NOW)
    assert not requests(p) and not p.new_repair
    (said,) = entries(p, Entry.REPAIR_AWAITING_APPROVAL)
    assert said.detail == f"reset-gpu attempt 1: reset {GPU}"
    (update,) = [a for a in p.repair if isinstance(a, UpdateRecord)]
    assert update.repair_approval == question()
    (event,) = events(p, Reason.REPAIR_AWAITING_APPROVAL)
    assert f"gpuheal approve|reject {drained().name}" in event.note
    assert p.suppressed == "repair-awaiting-approval" and p.requeue_after == EXPIRY
    # Asked once: the next look waits, and says nothing more.
    later = NOW + dt.timedelta(seconds=60)
    p = plan(state(node(), asked_record()), APPROVING, later)
    assert not p.actions and not requests(p)
    assert p.requeue_after == pytest.approx(EXPIRY - 60)


def test_a_repair_not_in_the_approval_list_is_asked_at_once() -> None:
    reboots_only = replace(CONFIG, repair=replace(CONFIG.repair, approval=("reboot",)))
    assert requests(plan(state(node(), drained()), reboots_only, NOW))


def test_approved_writes_the_request_once_with_the_answer_recorded() -> None:
    p = plan(state(node(), asked_record(decision=APPROVED)), APPROVING, NOW)
    (request,) = requests(p)
    assert decode_request(request.value) == RepairRequest(
        Action.RESET_GPU, DIGEST, 1, iso(NOW, "seconds")
    )
    (ok,) = entries(p, Entry.REPAIR_APPROVED)
    assert ok.detail == f"reset-gpu attempt 1: approved by {BY} at {iso(NOW)}"
    assert (
        len(events(p, Reason.REPAIR_APPROVED)) == 1 and len(events(p, Reason.REPAIR_REQUESTED)) == 1
    )
    assert len(entries(p, Entry.REPAIR_REQUESTED)) == 1
    # The request is on the node: it is not made again, nor the approval said again.
    done = asked_record(ok, entries(p, Entry.REPAIR_REQUESTED)[0], decision=APPROVED)
    on_node = node(**{REPAIR_REQUEST: request.value})
    p = plan(state(on_node, done), APPROVING, NOW + dt.timedelta(seconds=5))
    assert not p.actions and p.suppressed == "repairing"


def test_approved_within_a_full_budget_waits_for_it() -> None:
    full = state(node(), asked_record(decision=APPROVED), repairing=frozenset({"a", "b", "c"}))
    p = plan(full, APPROVING, NOW)
    assert not requests(p)
    assert len(entries(p, Entry.REPAIR_APPROVED)) == 1 and len(entries(p, Entry.REPAIR_HELD)) == 1


def test_rejected_is_recorded_and_a_person_is_asked_instead_once() -> None:
    p = plan(state(node(), asked_record(decision=REJECTED)), APPROVING, NOW)
    assert not requests(p)
    (no,) = entries(p, Entry.REPAIR_REJECTED)
    assert no.detail == f"reset-gpu attempt 1: rejected by {BY} at {iso(NOW)}"
    assert (
        len(events(p, Reason.REPAIR_REJECTED)) == 1 and len(events(p, Reason.CONTACT_SUPPORT)) == 1
    )
    (held,) = entries(p, Entry.REPAIR_EXHAUSTED)
    assert all(a.contact_support for a in p.repair if isinstance(a, UpdateRecord))
    told = asked_record(no, held, decision=REJECTED)
    p = plan(state(node(), told), APPROVING, NOW + dt.timedelta(seconds=5))
    assert not p.actions and p.suppressed == "contact-support"


def test_unanswered_it_expires_into_a_recorded_outcome_and_a_late_approval_changes_nothing() -> (
    None
):
    late = NOW + dt.timedelta(seconds=EXPIRY + 1)
    p = plan(state(node(), asked_record()), APPROVING, late)
    assert not requests(p)
    (expired,) = entries(p, Entry.REPAIR_APPROVAL_EXPIRED)
    assert expired.result == "expired"
    assert (
        len(events(p, Reason.REPAIR_APPROVAL_EXPIRED)) == 1
        and len(entries(p, Entry.REPAIR_EXHAUSTED)) == 1
    )
    recorded = asked_record(expired, entries(p, Entry.REPAIR_EXHAUSTED)[0])
    assert awaiting_approval(recorded) is None
    assert "expired" in (refusal(recorded) or "")
    approved_late = replace(recorded, repair_approval=replace(question(), decision=APPROVED))
    p = plan(state(node(), approved_late), APPROVING, late + dt.timedelta(seconds=5))
    assert not requests(p) and not p.actions


def test_each_attempt_is_approved_on_its_own() -> None:
    """Attempt 1 was approved and failed: attempt 2 asks again, replacing the question."""
    on_node, recorded = _after_failures(Action.RESET_GPU)
    first = replace(question(), decision=APPROVED, by=BY, at=iso(NOW))
    p = plan(state(on_node, replace(recorded, repair_approval=first)), APPROVING, NOW)
    assert not requests(p)
    (update, *_) = [a for a in p.repair if isinstance(a, UpdateRecord)]
    assert update.repair_approval == question(attempt=2)


def test_an_answer_goes_to_the_repair_in_the_callers_name_once() -> None:
    record = replace(asked_record(), resource_version="41")
    assert refusal(record) is None and awaiting_approval(record) == question()
    patch = answer_patch(record, APPROVED, BY, iso(NOW))
    assert patch == {
        "metadata": {"resourceVersion": "41"},
        "status": {
            "repairApproval": {"attempt": 1, "decision": APPROVED, "by": BY, "at": iso(NOW)}
        },
    }
    answered = asked_record(decision=REJECTED)
    assert "already rejected by" in (refusal(answered) or "")
    closed = replace(asked_record(), phase=Phase.RESOLVED)
    assert refusal(closed) is not None and awaiting_approval(closed) is None


def test_the_config_key_and_the_metric_steps() -> None:
    assert parse_config({"repair": {"approval": ["reboot"]}}).repair.approval == ("reboot",)
    with pytest.raises(ConfigError, match="approval"):
        parse_config({"repair": {"approval": ["replace-node"]}})
    assert RepairConfig().approval == ()
    said = entry(Entry.REPAIR_AWAITING_APPROVAL, "reboot attempt 3: reboot x", "waiting")
    assert repair_metric(said) == ("reboot", "awaiting-approval")


def test_the_question_is_told_to_the_notification_sinks() -> None:
    p = plan(state(node(), drained()), APPROVING, NOW)
    record = drained()
    notice = notice_for(record.node, p.repair, PassOutcome(), {record.name: record}.get)
    assert notice is not None
    assert notice.summary == f"{record.node}: EccUncontained95 — repair awaits approval"
