"""`gpuheal selftest`: does this installation work? What `helm test` runs.

Three checks, each a sentence: the controller's API answers and is ready (its
/readyz, through the Service: any replica), one replica leads (the Lease in
leaderElection's namespace has a holder that renewed it within its duration),
and every GPU node's agent reports and reaches NVML and its GPUs (the node's
GPUHealthy condition and its gpuheal.io/agent-access, as `gpuheal status` reads
them). Deciding is pure (each `*_check`); reading is `run_selftest`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpuheal.clock import parse_time
from gpuheal.kube.api import ApiError
from gpuheal.kube.projections import NodeJson
from gpuheal.ops import exitcodes
from gpuheal.ops.context import Context
from gpuheal.ops.fleet import gpu_nodes
from gpuheal.ops.output import Notes, render
from gpuheal.ops.status import NO_AGENT, agent_access

LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
SHOWN = 10  # nodes named per failing check (all of them in -o json)


@dataclass(frozen=True)
class Check:
    name: str  # api | leader | agents
    ok: bool
    detail: str


@dataclass(frozen=True)
class Readiness:
    """What /readyz said, or why it could not be read (error)."""

    body: dict[str, Any] | None = None
    error: str = ""


def api_check(ready: Readiness, url: str) -> Check:
    if ready.body is None:
        return Check("api", False, f"{url}/readyz does not answer: {ready.error}")
    if not ready.body.get("ready"):
        reasons = "; ".join(map(str, ready.body.get("reasons") or [])) or "no reason given"
        return Check("api", False, f"the controller answers but is not ready: {reasons}")
    return Check("api", True, f"the controller answers at {url} and is ready")


def leader_check(lease: dict[str, Any] | None, where: str, now: dt.datetime) -> Check:
    if lease is None:
        return Check("leader", False, f"no Lease {where}: no replica has led yet")
    spec = lease.get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    renewed = parse_time(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if not holder or renewed is None:
        return Check("leader", False, f"the Lease {where} has no holder: no replica leads")
    age = (now - renewed).total_seconds()
    if age > duration:
        return Check(
            "leader", False,
            f"{holder} last renewed the Lease {where} {age:.0f}s ago (its term is "
            f"{duration:g}s): no replica leads now",
        )  # fmt: skip
    return Check("leader", True, f"{holder} leads (renewed {max(age, 0):.0f}s ago)")


def agents_check(nodes: Sequence[NodeJson]) -> Check:
    if not nodes:
        return Check("agents", False, "no GPU node matches the controller's nodeSelector")
    problems = {a.node: a.problems for n in nodes if (a := agent_access(n)) is not None}
    silent = sorted(n for n, p in problems.items() if NO_AGENT in p)
    blind = sorted(n for n, p in problems.items() if NO_AGENT not in p)
    seeing = len(nodes) - len(problems)
    said = f"{seeing} of {len(nodes)} GPU nodes' agents report and see NVML and their GPUs"
    if not problems:
        return Check("agents", True, said)
    parts = [said]
    if silent:
        parts.append(f"no agent report from {_some(silent)}")
    if blind:
        parts.append("cannot see: " + _some([f"{n} ({', '.join(problems[n])})" for n in blind]))
    return Check("agents", False, "; ".join(parts))


def _some(names: Sequence[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


@dataclass(frozen=True)
class SelftestReport:
    found: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.found)

    def data(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.found],
        }

    def views(self) -> Sequence[Notes]:
        lines = [("ok" if c.ok else "bad", f"{c.name}: {c.detail}") for c in self.found]
        return [Notes("gpuheal selftest", tuple(lines))]


async def _readiness(url: str) -> Readiness:
    timeout = aiohttp.ClientTimeout(total=10)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(f"{url}/readyz") as response,
        ):
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError) as err:
        return Readiness(error=str(err) or type(err).__name__)
    try:
        body = json.loads(text)
    except ValueError:
        return Readiness(error=f"not the controller's answer: {text[:120]!r}")
    return Readiness(body=body if isinstance(body, dict) else {"ready": False})


async def _lease(ctx: Context) -> tuple[dict[str, Any] | None, str]:
    election = ctx.config.leader_election
    where = f"{election.namespace}/{election.name}"
    path = LEASE_PATH.format(namespace=election.namespace, name=election.name)
    try:
        return json.loads(await ctx.api.get(path)), where
    except ApiError as err:
        if err.code == 404:
            return None, where
        raise


async def run_selftest(ctx: Context, *, api_url: str) -> int:
    """0 when every check passes, 3 (findings) otherwise."""
    url = api_url.rstrip("/")
    lease, where = await _lease(ctx)
    nodes = await gpu_nodes(ctx)
    ready = await _readiness(url)
    report = SelftestReport(
        (api_check(ready, url), leader_check(lease, where, ctx.now()), agents_check(nodes))
    )
    render(report, ctx.output, ctx.out)
    return exitcodes.OK if report.ok else exitcodes.FINDINGS
