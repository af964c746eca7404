"""`gpuheal status`: the GPU fleet at a glance.

GPU nodes by state, GPUs per pool (capacity / allocatable / allocated), the
open faults and the breaker's remaining budget, all from one snapshot
(kube/snapshot.py: paged lists of the GPU nodes, the live bound pods and the
GPUFault records, fetched concurrently and decoded into slim projections; no
per-node request), so it stays fast on a fleet of thousands of nodes.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.text import Text

from gpuheal.clock import duration, parse_time
from gpuheal.config import Config
from gpuheal.kube.projections import NodeJson, node_view
from gpuheal.kube.snapshot import Snapshot, read_snapshot
from gpuheal.model import (
    AGENT_ACCESS,
    GPU_HEALTHY_CONDITION,
    MAINTENANCE_ROLLOUT,
    TAINT_KEY,
    FaultRecord,
)
from gpuheal.ops import exitcodes
from gpuheal.ops.fleet import (
    gpu_node,
    gpu_total,
    held_through_claims,
    node_selector_query,
    pod_gpus,
    pod_live,
    taint_of,
)
from gpuheal.ops.output import Notes, Table, render
from gpuheal.ops.selector import Requirement, SelectorError, parse_selector, selected
from gpuheal.policy import access
from gpuheal.policy.breaker import quarantine_capacity
from gpuheal.policy.dra import gpu_count, usable_count
from gpuheal.policy.nodes import HEALTHY, NODE_STATES, in_maintenance, node_state
from gpuheal.policy.pools import pool_of
from gpuheal.vocabulary import Entry

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

_SHOWN_NAMES = 5  # node names listed per state in the table view
_SHOWN_AGENTS = 20  # nodes listed whose agent cannot see (all of them in -o json)


@dataclass(frozen=True)
class NodeStatus:
    node: str
    state: str
    pool: str


# A GPU node with no GPUHealthy condition: no agent has ever reported on it.
NO_AGENT = "NoAgent"


@dataclass(frozen=True)
class AgentAccess:
    """A node whose agent cannot reach everything (or that has no agent at all)."""

    node: str
    problems: tuple[str, ...]  # the reasons (policy/access.py) or NO_AGENT
    reach: str  # what it reaches, for people ("" without an agent)


def agent_access(node: NodeJson) -> AgentAccess | None:
    """The node's agent's access problems, None when it reaches everything."""
    name = node.metadata.name
    if not any(c.type == GPU_HEALTHY_CONDITION for c in node.status.conditions):
        return AgentAccess(name, (NO_AGENT,), "")
    value = node.metadata.annotations.get(AGENT_ACCESS)
    reach = access.decode(value) if value else None
    if reach is None:
        return None  # an agent older than the fact, or a value it did not write
    problems = tuple(p.reason for p in access.problems(reach))
    return AgentAccess(name, problems, access.describe(reach)) if problems else None


@dataclass(frozen=True)
class PoolStatus:
    pool: str
    nodes: int
    capacity: int
    allocatable: int
    allocated: int


@dataclass(frozen=True)
class Breaker:
    capacity: int
    quarantined: int
    rolling: int = 0  # in a roll-out's maintenance: counted too (controller/fleet.py)

    @property
    def remaining(self) -> int:
        return max(0, self.capacity - self.quarantined - self.rolling)


def age(since: dt.datetime | None, now: dt.datetime) -> str:
    """How long ago, as every command says a duration (45s, 12m, 3h12m, 2d4h); "?"
    without a time."""
    return "?" if since is None else duration((now - since).total_seconds())


# Observe mode's report covers this much of the past.
WOULD_HAVE_WINDOW_S = 86400.0


@dataclass(frozen=True)
class WouldHave:
    """What observe mode would have done (its records' would-quarantine entries)."""

    nodes: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()
    faults: int = 0

    def data(self) -> dict[str, Any]:
        return {
            "windowSeconds": int(WOULD_HAVE_WINDOW_S),
            "quarantinedNodes": len(self.nodes),
            "evictedPods": len(self.pods),
            "faults": self.faults,
            "nodes": list(self.nodes),
            "pods": list(self.pods),
        }

    def sentence(self) -> str:
        return (
            f"would have quarantined {len(self.nodes)} node(s), evicted {len(self.pods)} "
            f"pod(s) in the last 24 h ({self.faults} fault(s) seen in observe mode)"
        )


def would_have(records: Iterable[FaultRecord], now: dt.datetime) -> WouldHave:
    since = now - dt.timedelta(seconds=WOULD_HAVE_WINDOW_S)
    seen = [
        r
        for r in records
        if any(
            a.action == Entry.WOULD_QUARANTINE and (t := parse_time(a.time)) and t >= since
            for a in r.actions
        )
    ]
    nodes = sorted({r.node for r in seen})
    pods = sorted({p for r in seen for p in r.plan_evict})
    return WouldHave(tuple(nodes), tuple(pods), len(seen))


@dataclass(frozen=True)
class StatusReport:
    nodes: tuple[NodeStatus, ...]
    pools: tuple[PoolStatus, ...]
    faults: tuple[FaultRecord, ...]  # open records, oldest first
    breaker: Breaker
    now: dt.datetime
    would: WouldHave = WouldHave()
    agents: tuple[AgentAccess, ...] = ()  # the nodes whose agent cannot see

    def by_state(self) -> dict[str, int]:
        counts = Counter(n.state for n in self.nodes)
        return {state: counts.get(state, 0) for state in NODE_STATES}

    def data(self) -> dict[str, Any]:
        return {
            "nodes": {"total": len(self.nodes), "byState": self.by_state()},
            "nodeStates": [{"node": n.node, "state": n.state, "pool": n.pool} for n in self.nodes],
            "pools": [
                {
                    "pool": p.pool,
                    "nodes": p.nodes,
                    "capacity": p.capacity,
                    "allocatable": p.allocatable,
                    "allocated": p.allocated,
                }
                for p in self.pools
            ],
            "faults": [
                {
                    "node": f.node,
                    "faultId": f.fault_id,
                    "name": f.name,
                    "reason": f.reason,
                    "severity": f.severity.value,
                    "scope": f.scope,
                    "device": f.device,
                    "phase": f.phase.value,
                    "created": f.created_at or None,
                    "ageSeconds": (
                        int((self.now - created).total_seconds())
                        if (created := parse_time(f.created_at))
                        else None
                    ),
                }
                for f in self.faults
            ],
            "breaker": {
                "capacity": self.breaker.capacity,
                "quarantined": self.breaker.quarantined,
                "rolling": self.breaker.rolling,
                "remaining": self.breaker.remaining,
            },
            "wouldHave": self.would.data(),
            "agentAccess": [
                {"node": a.node, "problems": list(a.problems), "reach": a.reach}
                for a in self.agents
            ],
        }

    def views(self) -> Sequence[Table | Notes]:
        names: dict[str, list[str]] = defaultdict(list)
        for n in self.nodes:
            names[n.state].append(n.node)
        state_rows = [
            (state, count, "" if state == HEALTHY else _some(names[state]))
            for state, count in self.by_state().items()
        ]
        pool_rows = [
            (p.pool, p.nodes, p.capacity, p.allocatable, p.allocated, p.allocatable - p.allocated)
            for p in self.pools
        ]
        fault_rows = [
            (
                f.node,
                f.fault_id + (f" ({f.device})" if f.device else ""),
                f.reason,
                f.phase.value,
                age(parse_time(f.created_at), self.now),
            )
            for f in self.faults
        ]
        blind = [a for a in self.agents if a.problems != (NO_AGENT,)]
        more = len(blind) > _SHOWN_AGENTS
        absent = _some([a.node for a in self.agents if a.problems == (NO_AGENT,)])
        agents_note = (
            ("warn", f"no gpuheal agent has reported on: {absent}")
            if absent
            else ("ok", "a gpuheal agent reports on every GPU node shown")
        )
        b = self.breaker
        style = "bad" if b.remaining == 0 else "warn" if b.quarantined or b.rolling else "ok"
        rolling = f", {b.rolling} in a roll-out's maintenance" if b.rolling else ""
        return (
            Table(
                f"GPU nodes by state ({len(self.nodes)})",
                ("STATE", "NODES", "WHICH"),
                state_rows,
                empty="no GPU nodes",
            ),
            Table(
                "GPUs per pool",
                ("POOL", "NODES", "CAPACITY", "ALLOCATABLE", "ALLOCATED", "FREE"),
                pool_rows,
                empty="no GPU nodes",
            ),
            Table(
                "Open faults",
                ("NODE", "FAULT", "REASON", "PHASE", "AGE"),
                fault_rows,
                empty="none",
            ),
            Table(
                f"Agents that cannot see ({len(blind)})",
                ("NODE", "PROBLEMS", "REACHES"),
                [(a.node, ", ".join(a.problems), a.reach) for a in blind[:_SHOWN_AGENTS]]
                + ([(f"(+{len(blind) - _SHOWN_AGENTS} more: -o json)", "", "")] if more else []),
                empty="none: every agent reaches NVML, its GPUs and the kernel log",
            ),
            Notes("Agents", [agents_note]),
            Notes(
                "Breaker",
                [
                    (
                        style,
                        f"{b.remaining} of {b.capacity} quarantine slots left "
                        f"({b.quarantined} node(s) carry the {TAINT_KEY} taint{rolling})",
                    )
                ],
            ),
            Notes("Observe mode", [("warn" if self.would.faults else "", self.would.sentence())]),
        )


def _some(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:_SHOWN_NAMES])
    more = len(names) - _SHOWN_NAMES
    return f"{shown} (+{more})" if more > 0 else shown


def _open(records: Iterable[FaultRecord]) -> list[FaultRecord]:
    faults = [f for f in records if f.open]
    oldest = dt.datetime.min.replace(tzinfo=dt.UTC)
    return sorted(faults, key=lambda f: (parse_time(f.created_at) or oldest, f.node, f.name))


def fleet_status(
    snap: Snapshot, config: Config, now: dt.datetime, selector: tuple[Requirement, ...] = ()
) -> StatusReport:
    """The whole answer of `gpuheal status`, from a snapshot (pure). `selector`
    narrows the nodes shown; the breaker is the controller's, over every GPU node."""
    offered = {name: gpu_count(devices) for name, devices in snap.devices.items()}
    gpu_nodes = sorted(
        (n for n in snap.nodes if gpu_node(n, config, offered.get(n.metadata.name, 0))),
        key=lambda n: n.metadata.name,
    )
    # The controller's Fleet counts the same way: our fault taint on a managed node,
    # and a roll-out's maintenance.
    tainted = sum(taint_of(n, TAINT_KEY) is not None for n in gpu_nodes)
    rolling = sum(
        taint_of(n, TAINT_KEY) is None
        and in_maintenance(n.metadata.labels)
        and bool(n.metadata.annotations.get(MAINTENANCE_ROLLOUT))
        for n in gpu_nodes
    )
    breaker = Breaker(quarantine_capacity(len(gpu_nodes), config), tainted, rolling)
    shown = [n for n in gpu_nodes if selected(n.metadata.labels, selector)]
    names = {n.metadata.name for n in shown}
    records = snap.faults or []
    faults = [f for f in _open(records) if not selector or f.node in names]
    would = would_have((r for r in records if not selector or r.node in names), now)
    faults_by_node: dict[str, list[FaultRecord]] = defaultdict(list)
    for fault in faults:
        faults_by_node[fault.node].append(fault)
    nodes: list[NodeStatus] = []
    pools: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for node in shown:
        name = node.metadata.name
        pool = pool_of(node.metadata.labels, config)
        state = node_state(node_view(node), faults_by_node.get(name, ()))
        nodes.append(NodeStatus(name, state, pool))
        totals = pools[pool]
        totals[0] += 1
        devices = snap.devices.get(name, ())
        totals[1] += gpu_total(node.status.capacity, config) + gpu_count(devices)
        totals[2] += gpu_total(node.status.allocatable, config) + usable_count(devices)
        totals[3] += sum(
            pod_gpus(p, config) + held_through_claims(p, snap)
            for p in snap.pods_by_node.get(name, ())
            if pod_live(p)
        )
    agents = tuple(a for n in shown if (a := agent_access(n)) is not None)
    return StatusReport(
        agents=agents,
        nodes=tuple(nodes),
        pools=tuple(PoolStatus(pool, *totals) for pool, totals in sorted(pools.items())),
        faults=tuple(faults),
        breaker=breaker,
        now=now,
        would=would,
    )


async def run_status(ctx: Context, *, selector: str = "") -> int:
    """Print the fleet's status; 0 (status informs, it checks nothing), 2 for a bad selector."""
    try:
        wanted = parse_selector(selector)
    except SelectorError as err:
        ctx.err.print(Text(f"gpuheal status: {err}", style="red"))
        return exitcodes.USAGE
    # Only GPU nodes matter here (the breaker counts them all; -l narrows what is shown).
    snap = await read_snapshot(
        ctx.api,
        faults=True,
        node_selector=node_selector_query(ctx.config),
        drivers=frozenset(ctx.config.gpu_drivers),
    )
    if snap.faults is None:
        # The controller is not installed (yet): nothing has faulted through it.
        ctx.err.print(Text("warning: no GPUFault CRD in this cluster: no fault records", "yellow"))
    report = fleet_status(snap, ctx.config, ctx.now(), wanted)
    render(report, ctx.output, ctx.out)
    return exitcodes.OK
