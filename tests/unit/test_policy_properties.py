"""Property: whatever the order, duplication and restarts of signals, each
(node, fault id) is remediated at most once and never past the breaker.

A small model of the cluster (nodes with annotations and taints, pods, GPUFault
records) is driven by random steps; the real `plan` decides, and its actions
are applied to the model with the API server's semantics (create conflicts,
idempotent taints, evicted pods gone). Restarts wipe the controller's memory.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.clock import iso
from gpuheal.config import Config
from gpuheal.model import (
    FAULT_ID,
    HANDLED_AT,
    HANDLED_FAULT_ID,
    LAST_PROCESS_TIME,
    STATUS,
    TAINT_KEY,
    Condition,
    FaultRecord,
    NodeView,
    Phase,
    PodView,
    Taint,
)
from gpuheal.policy.actions import (
    AddTaint,
    CreateRecord,
    DeletePod,
    Emit,
    Evict,
    MarkHandled,
    NodeState,
    RemoveTaint,
    UpdateRecord,
)
from gpuheal.policy.breaker import quarantine_capacity
from gpuheal.policy.plan import plan

# Real-shaped: fault ids built from them pass a taint value's 63 characters (and
# the 253-character FQDN's, the record's 256), as an EKS agent's do.
from gpuheal.values import taint_value
from gpuheal.vocabulary import Reason
from tests.corpus import AKS_NODE, EKS_NODES, FQDN_253

NODES = (*EKS_NODES, AKS_NODE, FQDN_253)
CONFIG = Config(
    breaker_max_nodes=2,
    breaker_max_percent=100,
    cooldown_seconds=0,
    recovery_window_seconds=5,
)


@dataclass
class World:
    nodes: dict[str, NodeView]
    pods: dict[str, PodView] = field(default_factory=dict)
    records: dict[str, FaultRecord] = field(default_factory=dict)
    now: dt.datetime = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    quarantines: dict[tuple[str, str], int] = field(default_factory=dict)
    creates: dict[str, int] = field(default_factory=dict)
    evictions: dict[str, int] = field(default_factory=dict)

    def tainted(self) -> set[str]:
        return {n for n, v in self.nodes.items() if v.taint() is not None}


def new_world() -> World:
    ready = (Condition("Ready", "True"),)  # the health gate returns only Ready nodes
    nodes = {n: NodeView(name=n, resource_version="1", gpus=8, conditions=ready) for n in NODES}
    world = World(nodes=nodes)
    for n in NODES:
        for i in range(2):
            pod = PodView("ml", f"{n}-p{i}", f"uid-{n}-{i}", n, "Running", gpu=True)
            world.pods[pod.key] = pod
    return world


def apply(world: World, action: object) -> bool:
    """Apply one action as the API server would; False aborts the rest of the plan."""
    match action:
        case CreateRecord(name=name, signal=sig, phase=phase):
            if name in world.records:
                return False  # AlreadyExists: re-plan
            world.creates[name] = world.creates.get(name, 0) + 1
            world.records[name] = FaultRecord(name, sig.node, sig.fault_id, phase)
        case UpdateRecord(name=name, phase=phase, entry=entry, recovering_since=since):
            rec = world.records[name]
            world.records[name] = replace(
                rec,
                phase=phase,
                actions=(*rec.actions, entry),
                recovering_since=rec.recovering_since if since is None else since,
            )
        case AddTaint(node=n, fault_id=fid, effect=effect):
            view = world.nodes[n]
            others = tuple(t for t in view.taints if t.key != TAINT_KEY)
            world.nodes[n] = replace(
                view, taints=(*others, Taint(TAINT_KEY, effect, taint_value(fid)))
            )
        case RemoveTaint(node=n):
            view = world.nodes[n]
            world.nodes[n] = replace(
                view, taints=tuple(t for t in view.taints if t.key != TAINT_KEY)
            )
        case Evict(pod=pod) | DeletePod(pod=pod):
            if pod.key in world.pods:
                world.evictions[pod.key] = world.evictions.get(pod.key, 0) + 1
                del world.pods[pod.key]
        case MarkHandled(node=n, fault_id=fid):
            view = world.nodes[n]
            stamp = iso(world.now)
            annotations = view.annotations | {
                HANDLED_FAULT_ID: fid,
                HANDLED_AT: stamp,
                LAST_PROCESS_TIME: stamp,
            }
            world.nodes[n] = replace(view, annotations=annotations)
        case Emit(reason=reason, node=n, record=name) if reason == Reason.QUARANTINED:
            key = (n, world.records[name].fault_id)
            world.quarantines[key] = world.quarantines.get(key, 0) + 1
    return True


def node_state(world: World, node: str) -> NodeState:
    """What the controller's caches would say of the node."""
    return NodeState(
        node=world.nodes[node],
        pods=tuple(p for p in world.pods.values() if p.node == node),
        records=tuple(r for r in world.records.values() if r.node == node),
        gpu_nodes=len(NODES),
        quarantined=frozenset(world.tainted()),
    )


def reconcile(world: World, node: str) -> None:
    for action in plan(node_state(world, node), CONFIG, world.now).actions:
        if not apply(world, action):
            break


# Steps: report a fault (new or repeated id), clear it, a person untaints,
# reconcile a node (possibly several times: duplicate events), time passes.
step = st.one_of(
    st.tuples(st.just("report"), st.sampled_from(NODES), st.sampled_from(["a", "b"])),
    st.tuples(st.just("clear"), st.sampled_from(NODES), st.just("")),
    st.tuples(st.just("untaint"), st.sampled_from(NODES), st.just("")),
    st.tuples(st.just("reconcile"), st.sampled_from(NODES), st.sampled_from(["1", "3"])),
    # A resync: every node, in a random order.
    st.tuples(st.just("resync"), st.permutations(NODES).map(",".join), st.just("")),
    st.tuples(st.just("tick"), st.just(""), st.sampled_from(["1", "10"])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, min_size=5, max_size=80))
def test_each_fault_is_remediated_at_most_once_and_never_past_the_breaker(
    steps: list[tuple[str, str, str]],
) -> None:
    world = new_world()
    cap = quarantine_capacity(len(NODES), CONFIG)
    for kind, node, arg in steps:
        if kind == "report":
            view = world.nodes[node]
            annotations = view.annotations | {STATUS: "faulty", FAULT_ID: f"{node}-{arg}"}
            world.nodes[node] = replace(view, annotations=annotations)
        elif kind == "clear":
            view = world.nodes[node]
            annotations = {k: v for k, v in view.annotations.items() if k not in (STATUS, FAULT_ID)}
            world.nodes[node] = replace(view, annotations=annotations)
        elif kind == "untaint":
            apply(world, RemoveTaint(node))
        elif kind == "reconcile":
            for _ in range(int(arg)):
                reconcile(world, node)
        elif kind == "resync":
            for name in node.split(","):
                reconcile(world, name)
        else:
            world.now += dt.timedelta(seconds=int(arg))
        assert all(count == 1 for count in world.creates.values()), world.creates
        assert all(count == 1 for count in world.quarantines.values()), world.quarantines
        assert all(count == 1 for count in world.evictions.values()), world.evictions
        # Quarantines the controller started never exceed the cap (a person's
        # untaint only lowers the count).
        ours = {n for n in world.tainted()}
        assert len(ours) <= cap, (ours, cap)
    # A record is only ever in one of the known phases.
    assert all(isinstance(r.phase, Phase) for r in world.records.values())
