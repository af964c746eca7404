"""`gpuheal approve FAULT` / `gpuheal reject FAULT`: a person's answer to a plan
awaiting approval (docs/controller.md#approval).

FAULT is the GPUFault's name, or its fault id when that names one record. The
answer goes into the record's status with the caller's identity as the API
server knows it (a SelfSubjectReview: no name the caller could type), under the
resourceVersion that was checked: of two answers at once, one lands and the
other is told. The controller acts on it; this command changes nothing else.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightkube import ApiError
from lightkube.resources.authentication_v1 import SelfSubjectReview
from lightkube.types import PatchType

from gpuheal.kube.resources import GPUFault
from gpuheal.model import APPROVED, FaultRecord
from gpuheal.ops import exitcodes
from gpuheal.ops.cluster import LIST_PAGE, fault_records
from gpuheal.ops.context import Context
from gpuheal.ops.output import Notes, Table, render
from gpuheal.policy.approval import answer_patch, matching, refusal
from gpuheal.policy.clock import iso


@dataclass(frozen=True)
class Answered:
    record: FaultRecord
    decision: str
    by: str
    at: str
    plan: dict[str, Any]

    def data(self) -> dict[str, Any]:
        return {
            "name": self.record.name,
            "node": self.record.node,
            "faultId": self.record.fault_id,
            "decision": self.decision,
            "by": self.by,
            "at": self.at,
            "plan": self.plan,
        }

    def views(self) -> Sequence[Table | Notes]:
        pods = self.plan.get("evict") or []
        what = f"taint {self.plan.get('taint', '?')}" + (
            f", evict {len(pods)} GPU pods" if pods else ""
        )
        verb = "approved" if self.decision == APPROVED else "rejected"
        return [
            Notes(
                f"GPUFault {self.record.name} ({self.record.node}, fault {self.record.fault_id})",
                [
                    ("ok", f"{verb} by {self.by} at {self.at}"),
                    ("", f"the plan: {what}" if self.plan else "the plan: (not recorded)"),
                    ("", "the controller acts on it now: kubectl get gf " + self.record.name),
                ],
            )
        ]


def whoami(ctx: Context) -> str:
    """The caller's user name, as the API server authenticated it."""
    review = ctx.client.create(SelfSubjectReview())
    user = review.status.userInfo if review.status else None
    return (user.username if user else None) or ctx.actor


def answer(ctx: Context, wanted: str, decision: str) -> int:
    prog = "gpuheal approve" if decision == APPROVED else "gpuheal reject"
    raw = list(ctx.client.list(GPUFault, chunk_size=LIST_PAGE))
    found = matching(fault_records(raw), wanted)
    if not found:
        ctx.err.print(f"{prog}: no GPUFault named {wanted!r} or with that fault id")
        return exitcodes.NOT_FOUND
    if len(found) > 1:
        names = ", ".join(sorted(r.name for r in found))
        ctx.err.print(f"{prog}: fault id {wanted!r} names {len(found)} records ({names}): give one")
        return exitcodes.USAGE
    (record,) = found
    why_not = refusal(record)
    if why_not is not None:
        ctx.err.print(f"{prog}: {why_not}")
        return exitcodes.USAGE
    by, at = whoami(ctx), iso(ctx.now().astimezone(dt.UTC))
    try:
        body = answer_patch(record, decision, by, at)
        ctx.client.patch(GPUFault.Status, record.name, body, patch_type=PatchType.MERGE)
    except ApiError as err:
        if err.status.code != 409:
            raise
        ctx.err.print(
            f"{prog}: GPUFault {record.name} changed meanwhile (answered, expired or cleared): "
            f"see kubectl get gf {record.name} -o yaml"
        )
        return exitcodes.ERROR
    plan = next((dict(r.get("status", {}).get("plan") or {}) for r in raw if _named(r, record)), {})
    render(Answered(record, decision, by, at, plan), ctx.output, ctx.out)
    return exitcodes.OK


def _named(obj: Any, record: FaultRecord) -> bool:
    return bool(obj.metadata and obj.metadata.name == record.name)
