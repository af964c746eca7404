"""Exactly once under crashes, leader failover and concurrent writers."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    handled_fault,
    our_taint,
    pods_on,
    pods_told_evicted,
    report_fault,
)

pytestmark = pytest.mark.timeout(300)


def assert_remediated_once(
    kube: Client, node: str, fault_id: str, pods: int, *, exact_events: bool = True
) -> None:
    """One record, our taint, handled, and no pod evicted twice. Events are sent
    from a queue, at most once: a SIGKILL right after an eviction loses the Events
    still queued, so after such a kill only "no duplicates" holds for them."""
    records = faults_of(kube, node)
    assert [r.spec["faultID"] for r in records] == [fault_id]
    assert our_taint(kube, node) == fault_id
    assert handled_fault(kube, node) == fault_id
    assert len(events_for(kube, node, "GPUFaultDetected")) <= 1
    assert len(events_for(kube, node, "GPUFaultQuarantined")) <= 1
    evicted = pods_told_evicted(kube, node, at_least=pods if exact_events else 0)
    assert len(evicted) == len(set(evicted)), evicted
    assert len(evicted) == pods if exact_events else len(evicted) <= pods, evicted


@pytest.mark.parametrize(
    "crash_after",
    ["CreateRecord", "Emit", "AddTaint", "UpdateRecord", "Evict", "Evict:2", "MarkHandled"],
)
def test_killed_at_any_step_the_restarted_controller_finishes_without_repeating(
    crash_after: str,
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    for i in range(3):
        apply(kube, gpu_pod(f"job-{i}", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=3)
    config = controller_config(pool)
    doomed = start_controller(config, env={"GPUHEAL_CRASH_AFTER": crash_after})
    report_fault(kube, node, "crash-fault")
    assert doomed.wait_exit(30) == -9, "the crashpoint was not reached"

    start_controller(config)
    wait_for("handled", lambda: handled_fault(kube, node) == "crash-fault", timeout_s=60)
    wait_for("drained", lambda: not pods_on(kube, namespace, node))
    time.sleep(1)
    # A kill after the evictions (an Evict, or the MarkHandled that follows the drain
    # by a fraction of a second) may take the eviction pass's Events still queued
    # with it: only "no duplicates" holds for them then.
    after_evictions = crash_after.startswith("Evict") or crash_after == "MarkHandled"
    assert_remediated_once(kube, node, "crash-fault", pods=3, exact_events=not after_evictions)


def leader_of(replicas: list[ControllerProcess]) -> list[ControllerProcess]:
    leaders = []
    for replica in replicas:
        try:
            with urllib.request.urlopen(f"{replica.url}/readyz", timeout=2) as response:  # noqa: S310
                if json.load(response)["leader"]:
                    leaders.append(replica)
        except OSError:
            continue
    return leaders


def one_leader(replicas: list[ControllerProcess]) -> list[ControllerProcess]:
    leaders = leader_of(replicas)
    return leaders if len(leaders) == 1 else []


@pytest.mark.parametrize("replicas", [2, 3])
def test_only_the_leader_acts_and_a_killed_leader_is_replaced_within_the_lease(
    replicas: int,
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    nodes = fake_gpu_nodes(12, labels=pool)
    for node in nodes:
        apply(kube, gpu_pod(f"on-{node}", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=len(nodes))
    # A slow rate limit spreads the storm over a few seconds, so the kill lands mid-storm.
    config = controller_config(pool, rateLimitPerSecond=3, rateLimitBurst=1)
    group = [start_controller(config, identity=f"replica-{i}") for i in range(replicas)]
    (leader,) = wait_for("one leader", lambda: one_leader(group))

    for node in nodes:
        report_fault(kube, node, f"storm-{node}")
    wait_for("a few quarantined", lambda: sum(bool(our_taint(kube, n)) for n in nodes) >= 3)
    standbys = [r for r in group if r is not leader]
    # Standbys keep warm caches but never act while another replica leads.
    assert all('"msg": "action"' not in s.log() for s in standbys)
    leader.kill()
    killed_at = time.monotonic()
    wait_for("a new leader", lambda: leader_of(standbys), timeout_s=20)
    takeover = time.monotonic() - killed_at
    print(f"takeover after leader SIGKILL: {takeover:.2f}s (lease 4s)")
    assert takeover < 4 + 0.5 + 2  # lease + retry period + scheduling slack

    def all_handled() -> bool:
        return all(handled_fault(kube, n) == f"storm-{n}" for n in nodes)

    wait_for("every fault handled", all_handled, timeout_s=60)
    time.sleep(1)
    for node in nodes:
        assert_remediated_once(kube, node, f"storm-{node}", pods=1, exact_events=False)
        assert not pods_on(kube, namespace, node)  # nothing missed


def test_sigterm_releases_the_lease_for_a_fast_failover(
    pool: dict[str, str], fake_gpu_nodes: FakeNodes, start_controller: StartController
) -> None:
    fake_gpu_nodes(1, labels=pool)
    config = controller_config(pool)
    group = [start_controller(config, identity=f"replica-{i}") for i in range(2)]
    (leader,) = wait_for("one leader", lambda: one_leader(group))
    (standby,) = [r for r in group if r is not leader]
    leader.stop()
    stopped_at = time.monotonic()
    wait_for("the standby to lead", lambda: leader_of([standby]), timeout_s=10)
    failover = time.monotonic() - stopped_at
    print(f"failover after SIGTERM: {failover:.2f}s")
    assert failover < 2.5  # released, not waited out (lease 4s)


def test_a_concurrent_annotation_writer_loses_nothing_and_the_taint_sticks(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    control_plane: Any,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    start_controller(controller_config(pool))
    writer = control_plane.client()
    stop = threading.Event()
    written: list[int] = []

    def churn() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            patch = {"metadata": {"annotations": {"example.com/churn": str(i)}}}
            writer.patch(Node, node, patch, patch_type=PatchType.MERGE)
            written.append(i)

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        time.sleep(0.5)
        report_fault(kube, node, "conflict-fault")
        wait_for("handled", lambda: handled_fault(kube, node) == "conflict-fault", timeout_s=30)
        time.sleep(1)
    finally:
        stop.set()
        thread.join()
    annotations = kube.get(Node, node).metadata.annotations or {}  # type: ignore[union-attr]
    assert annotations["example.com/churn"] == str(written[-1])  # no lost annotation
    assert our_taint(kube, node) == "conflict-fault"  # no lost taint
    assert len(written) > 20
    print(f"{len(written)} concurrent annotation writes during the remediation")
