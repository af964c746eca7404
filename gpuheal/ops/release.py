"""`gpuheal release FAULT`: let one fault the breaker holds past it
(docs/controller.md#the-breaker).

FAULT is the GPUFault's name, or its fault id when that names one record. The
release goes into the record's status with the caller's identity as the API
server knows it (a SelfSubjectReview: no name the caller could type), under the
resourceVersion that was checked: of two releases at once, one lands and the
other is told. The controller quarantines that fault once, past the full
breaker; every other held fault stays held. This command changes nothing else.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuheal.clock import iso
from gpuheal.model import FaultRecord
from gpuheal.ops import exitcodes
from gpuheal.ops.approval import answerable, whoami, write_checked
from gpuheal.ops.output import Notes, Table, render
from gpuheal.policy.release import refusal, release_patch

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

PROG = "gpuheal release"


@dataclass(frozen=True)
class Released:
    record: FaultRecord
    by: str
    at: str

    def data(self) -> dict[str, Any]:
        return {
            "name": self.record.name,
            "node": self.record.node,
            "faultId": self.record.fault_id,
            "released": True,
            "by": self.by,
            "at": self.at,
        }

    def views(self) -> Sequence[Table | Notes]:
        return [
            Notes(
                f"GPUFault {self.record.name} ({self.record.node}, fault {self.record.fault_id})",
                [
                    ("ok", f"released from the breaker by {self.by} at {self.at}"),
                    ("", "the controller quarantines it now, past the breaker, once"),
                    ("", "kubectl get gf " + self.record.name),
                ],
            )
        ]


async def release(ctx: Context, wanted: str) -> int:
    record = await answerable(ctx, PROG, wanted, refusal)
    if isinstance(record, int):
        return record
    by, at = await whoami(ctx), iso(ctx.now().astimezone(dt.UTC))
    body = release_patch(record, by, at)
    written = await write_checked(ctx, PROG, record, body, "released, quarantined or cleared")
    if isinstance(written, int):
        return written
    render(Released(record, by, at), ctx.output, ctx.out)
    return exitcodes.OK
