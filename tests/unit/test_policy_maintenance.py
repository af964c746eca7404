"""The controller and maintenance: a node in maintenance is no fault and costs the
breaker nothing; recovery returns a node only through the health gate."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

import msgspec

from gpuheal.clock import iso
from gpuheal.config import Config, HealthGateConfig
from gpuheal.controller.fleet import Fleet
from gpuheal.kube.projections import PodJson, decode_node, device_plugin_matcher, pod_view_factory
from gpuheal.model import (
    DRIVER_VERSION,
    FAULT_ID,
    FAULT_REASON,
    MAINTENANCE_ROLLOUT,
    MAINTENANCE_TAINT_KEY,
    STATE_LABEL,
    STATUS,
    TAINT_KEY,
    ActionEntry,
    Condition,
    FaultRecord,
    NodeView,
    Phase,
    Taint,
    fault_record_name,
)
from gpuheal.policy.actions import Emit, NodeState, RemoveTaint, UpdateRecord
from gpuheal.policy.plan import plan
from gpuheal.vocabulary import Reason
from tests.helpers import NO_GUARD
from tests.unit.test_policy_plan import kinds

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)
# The disruption guard's actions are tests/unit/test_policy_disruption.py's: off
# here, so that these plans are this module's rules alone.
CONFIG = Config(
    breaker_max_nodes=100,
    breaker_max_percent=100,
    recovery_window_seconds=60,
    autoscalers=NO_GUARD,
)
READY = Condition("Ready", "True")
POOL = {"gpuheal.io/pool": "a", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true"}


def node(name: str = "n1", **changes: object) -> NodeView:
    base = NodeView(
        name=name,
        resource_version="1",
        labels=dict(POOL),
        gpus=8,
        conditions=(READY,),
        allocatable=(("nvidia.com/gpu", 8),),
        taints=(Taint(TAINT_KEY, "NoSchedule", "f1"),),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def in_maintenance(view: NodeView) -> NodeView:
    return replace(
        view,
        labels={**view.labels, STATE_LABEL: "maintenance"},
        taints=(*view.taints, Taint(MAINTENANCE_TAINT_KEY, "NoSchedule", "bios")),
    )


def faulty(view: NodeView) -> NodeView:
    marks = {STATUS: "faulty", FAULT_ID: "f9", FAULT_REASON: "XidCritical79"}
    return replace(view, annotations={**view.annotations, **marks})


def recovering(*actions: ActionEntry) -> FaultRecord:
    return FaultRecord(
        name=fault_record_name("n1", "f1"),
        node="n1",
        fault_id="f1",
        phase=Phase.RECOVERING,
        recovering_since=iso(NOW - dt.timedelta(seconds=61)),
        actions=actions,
    )


def test_a_faulty_node_in_maintenance_is_no_fault() -> None:
    bare = in_maintenance(faulty(node(taints=())))
    decided = plan(NodeState(bare, gpu_nodes=4), CONFIG, NOW)
    assert decided.actions == () and decided.suppressed == "maintenance"


def test_maintenance_pauses_the_recovery_of_an_open_record_too() -> None:
    decided = plan(NodeState(in_maintenance(node()), records=(recovering(),)), CONFIG, NOW)
    assert decided.actions == () and decided.suppressed == "maintenance"


def test_recovery_passes_the_gate_then_untaints() -> None:
    decided = plan(NodeState(node(), records=(recovering(),)), CONFIG, NOW)
    assert kinds(decided) == ["RemoveTaint", "UpdateRecord", "Emit"]


def test_recovery_keeps_the_taint_while_the_gate_fails_and_says_so_once() -> None:
    short = node(allocatable=(("nvidia.com/gpu", 7),))
    first = plan(NodeState(short, records=(recovering(),)), CONFIG, NOW)
    assert not any(isinstance(a, RemoveTaint) for a in first.actions)
    assert first.requeue_after == CONFIG.hold_retry_seconds
    update = next(a for a in first.actions if isinstance(a, UpdateRecord))
    assert update.phase is Phase.RECOVERING and update.entry.action == "gate-failed"
    assert update.entry.detail.startswith("gpu-count: ")
    emit = next(a for a in first.actions if isinstance(a, Emit))
    assert emit.reason == Reason.GATE_FAILED and emit.warning and "7 nvidia.com/gpu" in emit.note
    # Requeued with the same failing set: no new entry, no new Event.
    noted = recovering(update.entry)
    again = plan(NodeState(short, records=(noted,)), CONFIG, NOW + dt.timedelta(seconds=10))
    assert again.actions == () and again.requeue_after == CONFIG.hold_retry_seconds
    # Another check fails as well: that is news.
    worse = replace(short, conditions=(Condition("Ready", "False"),))
    changed = plan(NodeState(worse, records=(noted,)), CONFIG, NOW + dt.timedelta(seconds=20))
    entry = next(a for a in changed.actions if isinstance(a, UpdateRecord)).entry
    assert entry.detail.startswith("ready, gpu-count: ")
    # Fixed: the taint goes.
    fixed = plan(NodeState(node(), records=(noted,)), CONFIG, NOW + dt.timedelta(seconds=30))
    assert kinds(fixed) == ["RemoveTaint", "UpdateRecord", "Emit"]


def test_recovery_gate_checks_the_driver_against_the_pool() -> None:
    drifted = node(annotations={DRIVER_VERSION: "535.1"})
    state = NodeState(drifted, records=(recovering(),), pool_drivers={"550.2": 2})
    decided = plan(state, CONFIG, NOW)
    assert "RemoveTaint" not in kinds(decided)
    assert "driver" in next(a for a in decided.actions if isinstance(a, Emit)).note


def test_the_gate_on_recovery_can_be_turned_off() -> None:
    config = replace(CONFIG, health_gate=HealthGateConfig(on_recovery=False))
    short = node(allocatable=())
    assert kinds(plan(NodeState(short, records=(recovering(),)), config, NOW))[0] == "RemoveTaint"


def test_a_manual_untaint_resolves_without_the_gate() -> None:
    untainted = node(taints=(), allocatable=())
    decided = plan(NodeState(untainted, records=(recovering(),)), CONFIG, NOW)
    assert kinds(decided) == ["UpdateRecord", "Emit"]


def test_the_breaker_counts_only_the_fault_taint_not_maintenance() -> None:
    fleet = Fleet(lambda: Config(node_selector={"nvidia.com/gpu.present": "true"}))
    fleet.on_node(None, in_maintenance(node("m1", taints=())))
    fleet.on_node(None, node("q1"))
    assert fleet.gpu_nodes == {"m1", "q1"}
    assert fleet.quarantined == {"q1"}
    # Both taints: the fault one counts, whoever else took the node out.
    fleet.on_node(None, in_maintenance(node("m2")))
    assert fleet.quarantined == {"q1", "m2"}


def test_the_breaker_counts_a_roll_outs_maintenance_not_a_persons() -> None:
    fleet = Fleet(lambda: Config(node_selector={"nvidia.com/gpu.present": "true"}))
    person = in_maintenance(node("m1", taints=()))
    rolled = replace(in_maintenance(node("r1", taints=())), annotations={MAINTENANCE_ROLLOUT: "x"})
    fleet.on_node(None, person)
    fleet.on_node(None, rolled)
    assert fleet.rolling == {"r1"}
    assert fleet.quarantined == set()
    # Given back (the label gone): it no longer counts.
    fleet.on_node(rolled, replace(rolled, labels=dict(POOL)))
    assert fleet.rolling == set()
    # With a full breaker, a fault elsewhere is held while the roll-out has nodes out.
    config = Config(node_selector={"nvidia.com/gpu.present": "true"}, breaker_max_nodes=1)
    faulty_node = faulty(node("f1", taints=()))
    busy = NodeState(faulty_node, gpu_nodes=10, quarantined=frozenset({"r1"}))
    free = NodeState(faulty_node, gpu_nodes=10)
    held = plan(busy, config, NOW).actions
    assert next(getattr(a, "phase", None) for a in held) is Phase.HELD
    assert not any(type(a).__name__ == "AddTaint" for a in held)
    assert any(type(a).__name__ == "AddTaint" for a in plan(free, config, NOW).actions)


def test_the_fleet_keeps_driver_versions_per_pool() -> None:
    fleet = Fleet(lambda: Config(node_selector={"nvidia.com/gpu.present": "true"}))
    views = [
        node(f"n{i}", annotations={DRIVER_VERSION: v}) for i, v in enumerate(("550", "550", "535"))
    ]
    for view in views:
        fleet.on_node(None, view)
    assert fleet.drivers_besides(views[2]) == {"550": 2}
    assert fleet.drivers_besides(views[0]) == {"550": 1, "535": 1}
    upgraded = replace(views[2], annotations={DRIVER_VERSION: "550"})
    fleet.on_node(views[2], upgraded)
    assert fleet.drivers_besides(upgraded) == {"550": 2}
    fleet.on_node(views[0], None)
    assert fleet.drivers_besides(upgraded) == {"550": 1}
    other_pool = node("x", labels={**POOL, "gpuheal.io/pool": "b"})
    assert fleet.drivers_besides(other_pool) == {}


def test_projections_carry_what_the_gate_needs() -> None:
    raw = {
        "metadata": {"name": "n1", "resourceVersion": "5"},
        "status": {
            "allocatable": {"cpu": "64", "nvidia.com/gpu": "7", "nvidia.com/mig-1g.10gb": "x"},
        },
    }
    view = decode_node(json.dumps(raw).encode())
    assert view.allocatable == (("nvidia.com/gpu", 7), ("nvidia.com/mig-1g.10gb", 0))
    pod = {
        "metadata": {"name": "dp", "namespace": "gpu-operator", "labels": {"app": "dp"}},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    to_view = pod_view_factory(lambda _: False, device_plugin_matcher({"app": "dp"}))
    seen = to_view(msgspec.json.decode(json.dumps(pod).encode(), type=PodJson))
    assert seen.ready and seen.device_plugin
    elsewhere = pod_view_factory(lambda _: False, device_plugin_matcher({"app": "dp"}, ("ks",)))
    assert not elsewhere(msgspec.json.decode(json.dumps(pod).encode(), type=PodJson)).device_plugin
