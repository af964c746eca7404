"""A person's answer to a plan awaiting approval (`gpuheal approve|reject`, or the
API): when it may be given, and what it writes on the record.

The answer is written to the record's status (status.approval: decision, who,
when) under the resourceVersion it was checked against, so of two answers given
at once only one lands. The controller acts on it, exactly once: its record then
leaves AwaitingApproval, and no later answer is taken.
"""

from __future__ import annotations

from typing import Any

from gpuheal import values
from gpuheal.model import DECISIONS, FaultRecord, Phase


def refusal(record: FaultRecord) -> str | None:
    """Why `record` takes no answer now; None when it does."""
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
    approval = {"decision": decision, "by": values.text(by), "at": at}
    return {
        "metadata": {"resourceVersion": record.resource_version},
        "status": {"approval": approval},
    }


def matching(records: list[FaultRecord], wanted: str) -> list[FaultRecord]:
    """The records a person means by `wanted`: the GPUFault name, else the fault id
    (one per node it occurred on)."""
    by_name = [r for r in records if r.name == wanted]
    return by_name or [r for r in records if r.fault_id == wanted]
