"""What each console page shows, computed from the controller's caches as they
are now (`Cluster`): pure, so a page is tested, and timed at 5,000 nodes,
without a server. Rendering (escaping included) is `render.py`'s."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from gpuheal.api.console.moves import Move, moves
from gpuheal.clock import parse_time
from gpuheal.config import Config
from gpuheal.model import (
    ANNOTATION_PREFIX,
    FAULT_REASON,
    GPUFAULT_KIND,
    MAINTENANCE_REASON,
    MAINTENANCE_SINCE,
    ActionEntry,
    EventView,
    FaultRecord,
    NodeView,
    Phase,
    PodView,
)
from gpuheal.policy import repair
from gpuheal.policy.breaker import quarantine_capacity
from gpuheal.policy.nodes import (
    DRAINING,
    HEALTHY,
    HELD,
    MAINTENANCE,
    NODE_STATES,
    NOT_READY,
    QUARANTINED,
    SUSPECT,
    in_maintenance,
    node_state,
    usable_gpus,
)
from gpuheal.policy.nodes import gpus as node_gpus
from gpuheal.policy.offenders import waits_for_a_person
from gpuheal.policy.pools import pool_of
from gpuheal.policy.sharing import sharing
from gpuheal.vocabulary import Entry

# A node's state on the console, worst first: the order of the columns.
# The fleet page's columns: gpuheal/policy/nodes.py's states, as `gpuheal status`
# shows them; the attention list puts those gpuheal acts on first.
STATES = NODE_STATES
_ATTENTION = (QUARANTINED, DRAINING, HELD, SUSPECT, NOT_READY, MAINTENANCE, HEALTHY)


@dataclass(frozen=True)
class Cluster:
    """The controller's caches, read in place (the console renders between two
    awaits, so nothing changes under it): what `Intake.cluster` hands over."""

    nodes: Mapping[str, NodeView]
    pods: Mapping[str, PodView]
    records: Mapping[str, FaultRecord]
    pods_by_node: Mapping[str, Iterable[str]]
    records_by_node: Mapping[str, Iterable[str]]
    gpu_nodes: Collection[str]  # the nodes gpuheal manages
    quarantined: int  # nodes carrying the fault taint (the breaker's count)
    config: Config
    leading: bool
    version: str  # the change feed's tag: a page says which it shows
    # gpuheal's own Events about any of these (kind, name) objects, oldest first
    # (the controller's Event cache, gpuheal/kube/event_cache.py).
    events_of: Callable[[Iterable[tuple[str, str]]], list[EventView]] = lambda _objects: []
    events_synced: bool = False  # that cache has listed once
    # Which fence a bad DRA GPU gets, in a sentence ("" where there are no DRA GPUs).
    fence: str = ""


def _open_records(cluster: Cluster, name: str) -> list[FaultRecord]:
    return [
        r
        for n in cluster.records_by_node.get(name, ())
        if (r := cluster.records.get(n)) is not None and r.open
    ]


@dataclass
class PoolRow:
    name: str
    states: Counter[str] = field(default_factory=Counter)
    capacity: int = 0  # GPUs on its nodes
    allocated: int = 0  # GPUs its pods request
    free: int = 0  # GPUs left on nodes that take pods (no taint, schedulable)

    @property
    def nodes(self) -> int:
        return sum(self.states.values())


@dataclass(frozen=True)
class NodeLine:
    name: str
    pool: str
    state: str
    reason: str  # the fault reported, or why it is in maintenance


@dataclass(frozen=True)
class FleetPage:
    mode: str
    leading: bool
    breaker_used: int
    breaker_capacity: int
    pools: list[PoolRow]
    totals: PoolRow
    attention: list[NodeLine]  # every node not healthy, worst first
    held: list[FaultRecord]
    awaiting: list[FaultRecord]
    maintenance: list[NodeLine]
    open_faults: int
    version: str
    fence: str = ""  # which fence a bad DRA GPU gets (Cluster.fence)


def fleet(cluster: Cluster) -> FleetPage:
    config = cluster.config
    pools: dict[str, PoolRow] = {}
    totals = PoolRow("all")
    attention: list[NodeLine] = []
    maintenance: list[NodeLine] = []
    nodes = 0
    for name in cluster.gpu_nodes:
        node = cluster.nodes.get(name)
        if node is None:
            continue
        nodes += 1
        pool = pool_of(node.labels, config)
        row = pools.get(pool) or pools.setdefault(pool, PoolRow(pool))
        state = node_state(node, _open_records(cluster, name))
        allocated = sum(
            pod.gpu_count
            for key in cluster.pods_by_node.get(name, ())
            if (pod := cluster.pods.get(key)) is not None
        )
        takes_pods = not node.taints and not node.unschedulable and node.ready is not False
        gpus = node_gpus(node, config)  # as `gpuheal status` counts: MIG and DRA too
        free = max(0, gpus - allocated) if takes_pods else 0
        # A time-sliced or MPS GPU is offered (and requested) once per replica: the
        # console counts GPUs, one in use as soon as a replica is.
        how = sharing(node.labels)
        replicas = how.replicas if how.shared else 1
        for each in (row, totals):
            each.states[state] += 1
            each.capacity += gpus // replicas
            each.allocated += -(-allocated // replicas)
            each.free += free // replicas
        if state != HEALTHY:
            attention.append(NodeLine(name, pool, state, _why(node, state, cluster)))
        if in_maintenance(node.labels):
            maintenance.append(NodeLine(name, pool, state, _why(node, MAINTENANCE, cluster)))
    attention.sort(key=lambda n: (_ATTENTION.index(n.state), n.name))
    maintenance.sort(key=lambda n: n.name)
    records = list(cluster.records.values())
    return FleetPage(
        mode=config.mode.value,
        leading=cluster.leading,
        breaker_used=cluster.quarantined,
        breaker_capacity=quarantine_capacity(nodes, config),
        pools=sorted(pools.values(), key=lambda p: p.name),
        totals=totals,
        attention=attention,
        held=_newest(r for r in records if r.phase is Phase.HELD or waits_for_a_person(r)),
        awaiting=_newest(
            r
            for r in records
            if r.phase is Phase.AWAITING_APPROVAL or repair.awaiting_approval(r) is not None
        ),
        maintenance=maintenance,
        open_faults=sum(r.open for r in records),
        version=cluster.version,
        fence=cluster.fence,
    )


def _why(node: NodeView, state: str, cluster: Cluster) -> str:
    """Why a node is out: its maintenance reason; else the reason of its newest open
    fault (whatever the source), what it reports, or our taint's value."""
    if state == MAINTENANCE:
        since = node.annotations.get(MAINTENANCE_SINCE, "")
        reason = node.annotations.get(MAINTENANCE_REASON, "")
        return f"{reason} (since {since})" if since else reason
    records = (cluster.records.get(n) for n in cluster.records_by_node.get(node.name, ()))
    open_ = _newest(r for r in records if r is not None and r.open)
    if open_:
        return open_[0].reason
    taint = node.taint()
    return node.annotations.get(FAULT_REASON, "") or (taint.value if taint else "")


def _newest(records: Iterable[FaultRecord]) -> list[FaultRecord]:
    return sorted(records, key=lambda r: (r.created_at, r.name), reverse=True)


def open_faults(cluster: Cluster) -> list[FaultRecord]:
    """Every open fault, newest first."""
    return _newest(r for r in cluster.records.values() if r.open)


@dataclass(frozen=True)
class Fault:
    record: FaultRecord
    timeline: list[ActionEntry]  # oldest first, as the record keeps them
    pods: list[str]  # moved off the node (or, awaiting approval, planned)
    moves: list[Move]  # where each moved pod went (none before an eviction)
    events: list[EventView]  # gpuheal's Events about it, oldest first
    events_synced: bool
    node_known: bool
    version: str


def fault(cluster: Cluster, name: str) -> Fault | None:
    record = cluster.records.get(name)
    if record is None:
        return None
    return Fault(
        record=record,
        timeline=list(record.actions),
        pods=list(record.evicted_pods or record.plan_evict),
        moves=moves(record.evicted_pods, _eviction_began(record), cluster.pods),
        events=fault_events(
            record, cluster.events_of([(GPUFAULT_KIND, record.name), ("Node", record.node)])
        ),
        events_synced=cluster.events_synced,
        node_known=record.node in cluster.nodes,
        version=cluster.version,
    )


def fault_events(record: FaultRecord, events: Iterable[EventView]) -> list[EventView]:
    """Of the Events about the record or its node, those of this fault: every one
    about the record, and the node's since the record was made that name no other
    record (a node's Events before it, or another fault's, are not this one's)."""
    created = parse_time(record.created_at)
    since = created.replace(microsecond=0) if created else None
    mine = []
    for event in events:
        if (GPUFAULT_KIND, record.name) not in (event.regarding, event.related):
            other = event.related is not None and event.related[0] == GPUFAULT_KIND
            when = parse_time(event.time)
            if other or since is None or when is None or when < since:
                continue
        mine.append(event)
    return mine


def _eviction_began(record: FaultRecord) -> str:
    began = next((a.time for a in record.actions if a.action == Entry.EVICT), "")
    return began or record.created_at


@dataclass(frozen=True)
class NodePage:
    node: NodeView
    pool: str
    state: str
    managed: bool
    gpus: int  # every GPU resource of its capacity (MIG too), as `gpuheal status` counts
    usable: int  # of those, what new pods may be given (allocatable, untainted devices)
    facts: list[tuple[str, str]]  # its gpuheal.io/ annotations, as the agent wrote them
    pods: list[PodView]
    faults: list[FaultRecord]  # newest first
    maintenance: str  # why and since when, or ""
    version: str


def node(cluster: Cluster, name: str) -> NodePage | None:
    view = cluster.nodes.get(name)
    if view is None:
        return None
    pods = [p for k in cluster.pods_by_node.get(name, ()) if (p := cluster.pods.get(k)) is not None]
    records = [
        r
        for n in cluster.records_by_node.get(name, ())
        if (r := cluster.records.get(n)) is not None
    ]
    maintained = in_maintenance(view.labels)
    return NodePage(
        node=view,
        pool=pool_of(view.labels, cluster.config),
        state=node_state(view, [r for r in records if r.open]),
        managed=name in cluster.gpu_nodes,
        gpus=node_gpus(view, cluster.config),
        usable=usable_gpus(view, cluster.config),
        facts=sorted(
            (k.removeprefix(ANNOTATION_PREFIX), v)
            for k, v in view.annotations.items()
            if k.startswith(ANNOTATION_PREFIX)
        ),
        pods=sorted(pods, key=lambda p: p.key),
        faults=_newest(records),
        maintenance=_why(view, MAINTENANCE, cluster) if maintained else "",
        version=cluster.version,
    )
