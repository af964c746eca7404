"""Approval: a person approves a fault's first taint or eviction (`approval`),
once. The plan is put to them in the record and an Event; their answer (or its
expiry) is carried out exactly once."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.model import APPROVED, REJECTED, TAINTED_PHASES, FaultRecord, Mode, Phase
from gpuheal.policy.actions import Action, AwaitApproval, Emit, Plan, UpdateRecord
from gpuheal.policy.plan.fault import Fault, entry, plan_with, planned
from gpuheal.vocabulary import Entry, Reason


def needs_approval(fault: Fault, config: Config) -> bool:
    """A person approves a fault's first taint or eviction (`approval`), once."""
    record = fault.record
    return (
        fault.mode is not Mode.OBSERVE
        and config.approval.required_for(fault.signal.reason)
        and record.phase not in TAINTED_PHASES
        and not any(a.action == Entry.APPROVED for a in record.actions)
    )


def request_approval(fault: Fault, config: Config, now: dt.datetime) -> list[Action]:
    record, signal = fault.record, fault.signal
    plan = planned(fault, config)
    what = plan.text()
    expires = iso(now + dt.timedelta(seconds=config.approval.expiry_seconds))
    return [
        AwaitApproval(
            record.name,
            Phase.AWAITING_APPROVAL,
            entry(now, Entry.AWAITING_APPROVAL, "waiting", f"{what}; expires {expires}"),
            plan=plan,
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


def approval(
    fault: Fault, config: Config, now: dt.datetime, actions: list[Action], base: Plan
) -> Plan | Fault:
    """The approval stage of a recorded fault: a Plan while it is asked, waiting,
    rejected or expired; the fault (its record Detected again) once approved, or
    when no approval is needed."""
    record = fault.record
    if record.phase is not Phase.AWAITING_APPROVAL and not needs_approval(fault, config):
        return fault
    if record.phase is not Phase.AWAITING_APPROVAL:
        actions += request_approval(fault, config, now)
        return plan_with(base, actions, requeue_after=config.approval.expiry_seconds)
    answered = _answer(fault, config, now, actions, base)
    if answered is not None:
        return answered
    # Approved: from here on the fault goes the way of any other, breaker included.
    return replace(fault, record=replace(record, phase=Phase.DETECTED))


def _asked_at(record: FaultRecord) -> dt.datetime | None:
    """When the plan was put to a person: its latest awaiting-approval entry."""
    asked = [parse_time(a.time) for a in record.actions if a.action == Entry.AWAITING_APPROVAL]
    return next((t for t in reversed(asked) if t is not None), None)


def _answer(
    fault: Fault, config: Config, now: dt.datetime, actions: list[Action], base: Plan
) -> Plan | None:
    """A plan awaiting approval: rejected, expired or still waiting (a Plan), or
    approved (None: go on, exactly once: the record leaves AwaitingApproval)."""
    record, signal = fault.record, fault.signal
    node, by = signal.node, f"by {record.decided_by} at {record.decided_at}"
    if record.decision == REJECTED:
        actions += [
            UpdateRecord(record.name, Phase.RESOLVED, entry(now, Entry.REJECTED, REJECTED, by)),
            Emit(
                Reason.REJECTED,
                f"fault {signal.fault_id}: plan rejected {by}; nothing done",
                node,
                record.name,
            ),
        ]
        return plan_with(base, actions)
    if record.decision == APPROVED:
        actions += [
            UpdateRecord(record.name, Phase.DETECTED, entry(now, Entry.APPROVED, "ok", by)),
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
        return plan_with(base, actions, suppressed="awaiting-approval", requeue_after=remaining)
    actions += _expired(fault, expiry, now)
    return plan_with(base, actions)


def _expired(fault: Fault, expiry: float, now: dt.datetime) -> list[Action]:
    record, signal = fault.record, fault.signal
    return [
        UpdateRecord(
            record.name,
            Phase.FAILED,
            entry(
                now,
                Entry.APPROVAL_EXPIRED,
                "expired",
                f"no answer within {expiry:g}s; nothing done",
            ),
        ),
        Emit(
            Reason.APPROVAL_EXPIRED,
            f"fault {signal.fault_id}: no approval within {expiry:g}s; plan expired, nothing done",
            signal.node,
            record.name,
            warning=True,
        ),
    ]
