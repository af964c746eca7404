"""`gpuheal crds check` and `gpuheal crds apply`: the CRDs the cluster serves
against the ones this version ships (kube/crds.py).

Helm installs a chart's `crds/` at `helm install` and never again: after `helm
upgrade` to a version whose CRD changed, run `gpuheal crds apply` (server-side
apply of the shipped CRDs, waiting until the API server serves them).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuheal.kube import crds
from gpuheal.ops import exitcodes
from gpuheal.ops.output import Notes, Table, render

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

ESTABLISHED_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CrdReport:
    served: tuple[crds.Served, ...]
    applied: tuple[str, ...] = ()  # the CRDs `apply` wrote

    def data(self) -> dict[str, Any]:
        return {
            "crds": [
                {"name": s.name, "state": s.state, "served": s.served, "wanted": s.wanted}
                for s in self.served
            ],
            "applied": list(self.applied),
        }

    def views(self) -> Sequence[Table | Notes]:
        rows = [(s.name, s.state, s.served or "-", s.wanted) for s in self.served]
        stale = [s for s in self.served if s.state != crds.CURRENT]
        notes = [("warn", s.sentence()) for s in stale] or [
            ("ok", "every CRD served is this version's")
        ]
        if self.applied:
            notes.insert(0, ("ok", f"applied: {', '.join(self.applied)}"))
        return (Table("gpuheal's CRDs", ("CRD", "STATE", "SERVED", "THIS VERSION"), rows),
                Notes("CRDs", notes))  # fmt: skip


async def _survey(ctx: Context) -> tuple[crds.Served, ...]:
    return tuple(
        [await crds.served(ctx.api, name, manifest) for name, manifest in crds.shipped().items()]
    )


async def run_check(ctx: Context) -> int:
    """0 when every CRD served is this version's, 3 when one is not (or missing)."""
    report = CrdReport(await _survey(ctx))
    render(report, ctx.output, ctx.out)
    current = all(s.state == crds.CURRENT for s in report.served)
    return exitcodes.OK if current else exitcodes.FINDINGS


async def run_apply(ctx: Context) -> int:
    """Apply every shipped CRD, then wait until each is Established with this
    version's schema; 4 when one is not within a minute."""
    applied = []
    for name, manifest in crds.shipped().items():
        await crds.apply(ctx.api, manifest)
        applied.append(name)
    deadline = time.monotonic() + ESTABLISHED_TIMEOUT_S
    while True:
        served = await _survey(ctx)
        established = [await _established(ctx, s.name) for s in served]
        if all(s.state == crds.CURRENT for s in served) and all(established):
            render(CrdReport(served, tuple(applied)), ctx.output, ctx.out)
            return exitcodes.OK
        if time.monotonic() >= deadline:
            render(CrdReport(served, tuple(applied)), ctx.output, ctx.out)
            ctx.err.print("gpuheal crds apply: not all served as applied within a minute")
            return exitcodes.TIMED_OUT
        await asyncio.sleep(0.5)


async def _established(ctx: Context, name: str) -> bool:
    raw = await ctx.api.get(f"{crds.CRD_PATH}/{name}")
    conditions = (json.loads(raw).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
