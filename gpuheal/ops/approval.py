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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gpuheal.clock import iso
from gpuheal.kube.api import ApiError, gpufault_path
from gpuheal.kube.projections import FaultJson, fault_record
from gpuheal.kube.snapshot import list_all
from gpuheal.model import APPROVED, FaultRecord
from gpuheal.ops import exitcodes
from gpuheal.ops.output import Notes, Table, render
from gpuheal.policy.approval import answer_patch, answers_repair, matching, refusal

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


class _UserInfo(msgspec.Struct):
    username: str | None = None


class _ReviewStatus(msgspec.Struct):
    userInfo: _UserInfo | None = None  # noqa: N815 -- API field name


class _Review(msgspec.Struct):
    """A SelfSubjectReview's answer: who the API server says the caller is."""

    status: _ReviewStatus | None = None


class _PlanStatus(msgspec.Struct):
    plan: dict[str, Any] | None = None


class _Planned(msgspec.Struct):
    """A GPUFault's plan as written, whole: the answer shows it as the controller wrote it."""

    status: _PlanStatus | None = None


@dataclass(frozen=True)
class Answered:
    record: FaultRecord
    decision: str
    by: str
    at: str
    plan: dict[str, Any]

    def data(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "name": self.record.name,
            "node": self.record.node,
            "faultId": self.record.fault_id,
            "decision": self.decision,
            "by": self.by,
            "at": self.at,
            "plan": self.plan,
        }
        asked = self.record.repair_approval
        if answers_repair(self.record) and asked is not None:
            found["repair"] = {"action": asked.action, "attempt": asked.attempt}
        return found

    def views(self) -> Sequence[Table | Notes]:
        pods = self.plan.get("evict") or []
        what = f"taint {self.plan.get('taint', '?')}" + (
            f", evict {len(pods)} GPU pods" if pods else ""
        )
        said = f"the plan: {what}" if self.plan else "the plan: (not recorded)"
        asked = self.record.repair_approval
        if answers_repair(self.record) and asked is not None:
            said = f"the repair: {asked.action} attempt {asked.attempt}"
        verb = "approved" if self.decision == APPROVED else "rejected"
        return [
            Notes(
                f"GPUFault {self.record.name} ({self.record.node}, fault {self.record.fault_id})",
                [
                    ("ok", f"{verb} by {self.by} at {self.at}"),
                    ("", said),
                    ("", "the controller acts on it now: kubectl get gf " + self.record.name),
                ],
            )
        ]


async def whoami(ctx: Context) -> str:
    """The caller's user name, as the API server authenticated it."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    status = msgspec.json.decode(await ctx.api.create(SELF_SUBJECT_REVIEWS, review), type=_Review)
    user = status.status.userInfo if status.status else None
    return (user.username if user else None) or ctx.actor


async def answerable(
    ctx: Context, prog: str, wanted: str, refused: Callable[[FaultRecord], str | None]
) -> FaultRecord | int:
    """The one record `wanted` names (its name, or a fault id naming one record) that
    a person may answer now, or the exit code after saying why not (`refused`: why
    this command may not answer that record, None when it may)."""
    listed = await list_all(ctx.api, gpufault_path(), FaultJson, "GPUFault")
    found = matching([fault_record(r) for r in listed], wanted)
    if not found:
        ctx.err.print(f"{prog}: no GPUFault named {wanted!r} or with that fault id")
        return exitcodes.NOT_FOUND
    if len(found) > 1:
        names = ", ".join(sorted(r.name for r in found))
        ctx.err.print(f"{prog}: fault id {wanted!r} names {len(found)} records ({names}): give one")
        return exitcodes.USAGE
    (record,) = found
    why_not = refused(record)
    if why_not is not None:
        ctx.err.print(f"{prog}: {why_not}")
        return exitcodes.USAGE
    return record


async def write_checked(
    ctx: Context, prog: str, record: FaultRecord, patch: dict[str, Any], meanwhile: str
) -> bytes | int:
    """The record's status as written with `patch` (which carries the resourceVersion
    that was checked), or the exit code after saying that the record changed meanwhile
    (`meanwhile`: how it may have)."""
    try:
        return await ctx.api.patch(gpufault_path(record.name, status=True), patch)
    except ApiError as err:
        if err.code != 409:
            raise
        ctx.err.print(
            f"{prog}: GPUFault {record.name} changed meanwhile ({meanwhile}): "
            f"see kubectl get gf {record.name} -o yaml"
        )
        return exitcodes.ERROR


async def answer(ctx: Context, wanted: str, decision: str) -> int:
    prog = "gpuheal approve" if decision == APPROVED else "gpuheal reject"
    record = await answerable(ctx, prog, wanted, refusal)
    if isinstance(record, int):
        return record
    by, at = await whoami(ctx), iso(ctx.now().astimezone(dt.UTC))
    body = answer_patch(record, decision, by, at)
    written = await write_checked(ctx, prog, record, body, "answered, expired or cleared")
    if isinstance(written, int):
        return written
    # The plan as the record holds it: the resourceVersion guard means the one checked.
    planned = msgspec.json.decode(written, type=_Planned).status
    plan = (planned.plan if planned else None) or {}
    render(Answered(record, decision, by, at, plan), ctx.output, ctx.out)
    return exitcodes.OK
