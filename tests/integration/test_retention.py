"""Retention on the real control plane: closed GPUFault records are deleted by age
and by a count per node, open ones never; a large cleanup does not hold a fault's
quarantine back."""

from __future__ import annotations

import datetime as dt

from lightkube import Client

from gpuheal.model import Phase
from gpuheal.sim import ControlPlane
from gpuheal.sim.records import PastFault, create_past_faults
from gpuheal.sim.resources import GPUFault
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    faults_of,
    our_taint,
    report_fault,
)

NOW = dt.datetime.now(dt.UTC)


def days_ago(days: float) -> dt.datetime:
    return NOW - dt.timedelta(days=days)


def names(kube: Client) -> set[str]:
    return {str(r.metadata.name) for r in kube.list(GPUFault) if r.metadata}


def test_old_closed_records_go_by_age_and_count_open_ones_stay(
    kube: Client,
    control_plane: ControlPlane,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    # Outside the pool: the controller leaves its open record alone, however old.
    (outside,) = fake_gpu_nodes(1)
    old = [PastFault(node, f"xid-79-old-{i}", days_ago(40 + i)) for i in range(3)]
    recent = [PastFault(node, f"xid-79-recent-{i}", days_ago(1 + i)) for i in range(5)]
    stuck = PastFault(outside, "xid-79-open", days_ago(90), Phase.QUARANTINED)
    create_past_faults(control_plane.kubeconfig, [*old, *recent, stuck])
    before = names(kube)
    assert {f.name for f in (*old, *recent, stuck)} <= before

    retention = {"perNodeMax": 3, "intervalSeconds": 1, "deletesPerSecond": 50}
    controller = start_controller(controller_config(pool, retention=retention))
    gone = {f.name for f in (*old, *recent[3:])}  # by age, then the 2 oldest recent ones
    wait_for("the old records deleted", lambda: not gone & names(kube))
    left = names(kube)
    assert {f.name for f in recent[:3]} <= left  # the newest 3 of the node stay
    assert stuck.name in left  # open: never
    metrics = controller.metrics()
    print([line for line in metrics.splitlines() if "collect" in line])
    assert 'gpuheal_fault_records_collected_total{why="age"} 3.0' in metrics
    assert 'gpuheal_fault_records_collected_total{why="count"} 2.0' in metrics


def test_a_fault_is_quarantined_while_a_large_cleanup_runs(
    kube: Client,
    control_plane: ControlPlane,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    """Deletes are paced and do not queue reconciles: a fault reported mid-cleanup is
    tainted while most of the old records are still there."""
    (node,) = fake_gpu_nodes(1, labels=pool)
    history = [
        PastFault(f"gone-{i % 30}.example.internal", f"x-{i}", days_ago(60)) for i in range(300)
    ]
    create_past_faults(control_plane.kubeconfig, history)
    retention = {"intervalSeconds": 1, "deletesPerSecond": 25}
    start_controller(controller_config(pool, retention=retention))
    wait_for("the cleanup started", lambda: len(names(kube)) < 300)
    report_fault(kube, node, "xid-79-during-cleanup")
    wait_for("the taint", lambda: our_taint(kube, node) is not None)
    remaining = len(names(kube) - {str(r.metadata.name) for r in faults_of(kube, node)})
    print(f"tainted with {remaining} of 300 old records still to delete")
    assert remaining > 100
    wait_for(
        "the cleanup done",
        lambda: not names(kube) - {str(r.metadata.name) for r in faults_of(kube, node)},
        timeout_s=60,
    )
