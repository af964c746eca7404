"""A person's answer to a plan awaiting approval (`gpuheal approve|reject`, or the
API): when it may be given, and what it writes on the record. The same answer
serves a repair attempt awaiting approval (`repair.approval`): it goes into
status.repairApproval instead, beside the controller's question.

The answer is written to the record's status (status.approval: decision, who,
when) under the resourceVersion it was checked against, so of two answers given
at once only one lands. The controller acts on it, exactly once: its record then
leaves AwaitingApproval, and no later answer is taken.
"""

from __future__ import annotations

from typing import Any

from gpuheal import values
from gpuheal.model import DECISIONS, FaultRecord, Phase
from gpuheal.policy.repair import awaiting_approval


def answers_repair(record: FaultRecord) -> bool:
    """Does an answer on `record` go to its repair (not to a plan awaiting approval)?"""
    return record.phase is not Phase.AWAITING_APPROVAL and record.repair_approval is not None


def refusal(record: FaultRecord) -> str | None:
    """Why `record` takes no answer now; None when it does."""
    asked = record.repair_approval
    if answers_repair(record) and asked is not None and record.open:
        what = f"GPUFault {record.name}: repair {asked.action} attempt {asked.attempt}"
        if asked.decision:
            return f"{what} was already {asked.decision} by {asked.by} at {asked.at}"
        if awaiting_approval(record) is None:
            return f"{what}: its approval expired (approval.expirySeconds); nothing to answer"
        return None
    if record.phase is not Phase.AWAITING_APPROVAL:
        last = record.actions[-1] if record.actions else None
        said = f" (last: {last.action} {last.result}: {last.detail})" if last else ""
        return (
            f"GPUFault {record.name} is {record.phase.value}, not awaiting approval: "
            f"nothing to answer{said}"
        )
    if record.decision:
        return (
            f"GPUFault {record.name} was already {record.decision} by {record.decided_by} "
            f"at {record.decided_at}"
        )
    return None


def answer_patch(record: FaultRecord, decision: str, by: str, at: str) -> dict[str, Any]:
    """The status patch of an answer: only valid on the version that was checked."""
    if decision not in DECISIONS:
        raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
    approval: dict[str, Any] = {"decision": decision, "by": values.text(by), "at": at}
    field = "approval"
    if answers_repair(record) and record.repair_approval is not None:
        # The attempt answered, as asked: the admission policy checks it is the same.
        field, approval = "repairApproval", {"attempt": record.repair_approval.attempt} | approval
    return {
        "metadata": {"resourceVersion": record.resource_version},
        "status": {field: approval},
    }


def matching(records: list[FaultRecord], wanted: str) -> list[FaultRecord]:
    """The records a person means by `wanted`: the GPUFault name, else the fault id
    (one per node it occurred on)."""
    by_name = [r for r in records if r.name == wanted]
    return by_name or [r for r in records if r.fault_id == wanted]
