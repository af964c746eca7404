"""The controller against the real control plane: quarantine, evict, dedupe,
recover, breaker, PDBs, rescheduling."""

from __future__ import annotations

import time
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import (
    apply,
    gpu_deployment,
    gpu_pod,
    wait_pods_running,
)
from tests.conftest import AUDITED_CONTROLLER
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    clear_fault,
    controller_config,
    events_for,
    evictions_from,
    faults_of,
    guarded_pod,
    handled_fault,
    our_taint,
    pods_on,
    pods_told_evicted,
    record_of,
    record_phase,
    report_fault,
)
from tests.integration.test_failures import metric

pytestmark = pytest.mark.timeout(240)


def cpu_pod(name: str, namespace: str, node: str) -> dict[str, Any]:
    manifest = gpu_pod(name, namespace, node_name=node)
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    return manifest


def test_fault_quarantines_node_and_evicts_only_its_gpu_pods(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    bad, good = fake_gpu_nodes(2, labels=pool)
    for i in range(2):
        apply(kube, gpu_pod(f"train-{i}", namespace, node_name=bad))
    apply(kube, cpu_pod("logger", namespace, bad))
    apply(kube, gpu_pod("elsewhere", namespace, node_name=good))
    wait_pods_running(kube, namespace, count=4)
    start_controller(controller_config(pool))

    started = time.monotonic()
    report_fault(kube, bad, "manual-001")
    wait_for("the taint", lambda: our_taint(kube, bad) == "manual-001", timeout_s=30)
    latency = time.monotonic() - started
    print(f"fault-to-taint latency: {latency * 1000:.0f} ms")

    wait_for(
        "GPU pods gone from the faulty node", lambda: pods_on(kube, namespace, bad) == {"logger"}
    )
    assert pods_on(kube, namespace, good) == {"elsewhere"}
    wait_for("handled-fault-id", lambda: handled_fault(kube, bad) == "manual-001")
    (record,) = faults_of(kube, bad)
    assert record.spec["faultID"] == "manual-001"
    name = record.metadata.name
    wait_for("record Drained", lambda: record_phase(kube.get(GPUFault, name)) == "Drained")
    record = kube.get(GPUFault, name)
    status: Any = record.status or {}
    assert sorted(status["evictedPods"]) == [f"{namespace}/train-0", f"{namespace}/train-1"]
    assert len(events_for(kube, bad, "GPUFaultQuarantined", at_least=1)) == 1
    # One Event for the pass that evicted both, on the node, naming them.
    assert len(evictions_from(kube, bad, at_least=1)) == 1
    assert sorted(pods_told_evicted(kube, bad, at_least=2)) == status["evictedPods"]
    assert our_taint(kube, good) is None


def test_a_fault_re_reported_100_times_is_remediated_once(
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
    controller = start_controller(controller_config(pool))

    for _ in range(100):  # Alertmanager-style repeats; fault-time churns each time
        report_fault(kube, node, "xid-79-a")
    wait_for("drained", lambda: not pods_on(kube, namespace, node))
    time.sleep(2)  # let any duplicate work show itself

    assert len(faults_of(kube, node)) == 1
    assert len(events_for(kube, node, "GPUFaultDetected", at_least=1)) == 1
    assert len(events_for(kube, node, "GPUFaultQuarantined", at_least=1)) == 1
    assert sorted(pods_told_evicted(kube, node, at_least=3)) == [
        f"{namespace}/job-{i}" for i in range(3)
    ]
    metrics = controller.metrics()
    assert 'gpuheal_pods_evicted_total{result="evicted"} 3.0' in metrics
    assert 'gpuheal_remediations_total{action="AddTaint",result="tainted"} 1.0' in metrics
    # One more re-report of the handled fault: its node's look stops at the memory
    # layer and is counted there (not exactly once per report: the work queue
    # coalesces reports that come while the node is looked at, uncounted).
    stopped = 'gpuheal_duplicates_suppressed_total{layer="memory"}'
    before = metric(controller, stopped)
    report_fault(kube, node, "xid-79-a")
    wait_for("the re-report stopped", lambda: metric(controller, stopped) > before)
    assert metric(controller, 'gpuheal_duplicates_suppressed_total{layer="handled"}') == 0


def test_recovery_after_the_window_and_a_manual_untaint_is_respected(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    healed, overridden = fake_gpu_nodes(2, labels=pool)
    start_controller(controller_config(pool, recoveryWindowSeconds=2))
    report_fault(kube, healed, "f-healed")
    report_fault(kube, overridden, "f-override")
    wait_for("both tainted", lambda: our_taint(kube, healed) and our_taint(kube, overridden))

    # A person takes the node back by removing our taint; the fault is still reported.
    kube.patch(Node, overridden, {"spec": {"taints": []}})
    clear_fault(kube, healed)
    started = time.monotonic()
    wait_for("the healed node untainted", lambda: our_taint(kube, healed) is None, timeout_s=30)
    assert time.monotonic() - started >= 1.5  # not before the health window
    # The taint goes first, then the record: two writes a busy machine can part.
    wait_for(
        "the record Resolved",
        lambda: [record_phase(r) for r in faults_of(kube, healed)] == ["Resolved"],
    )
    wait_for("the Event", lambda: events_for(kube, healed, "GPUFaultRecovered"))
    assert len(events_for(kube, healed, "GPUFaultRecovered", at_least=1)) == 1
    labels = kube.get(Node, healed).metadata.labels or {}  # type: ignore[union-attr]
    assert "gpuheal.io/state" not in labels
    assert handled_fault(kube, healed) == "f-healed"

    time.sleep(2)
    assert our_taint(kube, overridden) is None  # not re-tainted for the same fault
    (record,) = faults_of(kube, overridden)
    assert any(a["action"] == "manual-untaint" for a in record.status["actions"])
    # Our state label went with the taint: selectors no longer count the node.
    labels = kube.get(Node, overridden).metadata.labels or {}  # type: ignore[union-attr]
    assert labels.get("gpuheal.io/state") is None, labels


def test_a_record_a_person_deletes_while_quarantined_is_restored_and_the_node_returns(
    kube: Client,
    control_plane: ControlPlane,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    audited_controller_user: str,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    config = controller_config(pool, recoveryWindowSeconds=2)
    start_controller(config, user=audited_controller_user).wait_leading()
    report_fault(kube, node, "f-deleted")
    wait_for("quarantined and handled", lambda: our_taint(kube, node) and handled_fault(kube, node))
    (record,) = faults_of(kube, node)
    since = audit.offset(control_plane.audit_log)
    kube.delete(GPUFault, record.metadata.name)  # by hand, the fault still reported
    clear_fault(kube, node)
    started = time.monotonic()
    wait_for("the node returned", lambda: our_taint(kube, node) is None, timeout_s=30)
    assert time.monotonic() - started >= 1.5  # through the recovery window, not at once
    wait_for("Resolved", lambda: [record_phase(r) for r in faults_of(kube, node)] == ["Resolved"])
    (restored,) = faults_of(kube, node)
    assert restored.metadata.name == record.metadata.name  # the fault's own name again
    assert restored.spec["reason"] == "RecordRestored"
    assert [a["action"] for a in restored.status["actions"]][-1] == "untaint"
    (told,) = events_for(kube, node, "GPUFaultRestored", at_least=1)
    assert told.type == "Warning" and "f-deleted" in str(told.message)
    found = list(audit.requests(control_plane.audit_log, user=AUDITED_CONTROLLER, since=since))
    writes = audit.by_verb_and_resource(
        iter(r for r in found if r.verb in ("create", "patch", "update", "delete"))
    )
    print(writes)
    assert writes.get("create gpufaults") == 1, writes  # restored once
    time.sleep(2)
    assert len(faults_of(kube, node)) == 1 and our_taint(kube, node) is None


def test_a_fault_on_a_gpu_node_outside_the_selector_is_said_once(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    """A GPU node without the selector's label (here the test's pool label, as a node
    missing nvidia.com/gpu.present would be): its fault is not acted on, and a Warning
    Event says so once; the metric counts such nodes."""
    (outside,) = fake_gpu_nodes(1)
    controller = start_controller(controller_config(pool)).wait_leading()
    report_fault(kube, outside, "xid-79-outside")
    wait_for("the warning", lambda: events_for(kube, outside, "GPUNodeUnmanaged"))
    kube.patch(Node, outside, {"metadata": {"labels": {"touched": "again"}}})
    time.sleep(1.5)
    (event,) = events_for(kube, outside, "GPUNodeUnmanaged", at_least=1)
    assert "xid-79-outside" in str(event.message) and event.type == "Warning"
    assert our_taint(kube, outside) is None and not faults_of(kube, outside)

    def unmanaged() -> int:
        return sum(
            1
            for n in kube.list(Node)
            if n.metadata
            and (n.metadata.labels or {}).get("gpuheal.test/pool") != pool["gpuheal.test/pool"]
            and (n.metadata.labels or {}).get("gpuheal.io/managed") != "false"
            and int((n.status.capacity or {}).get("nvidia.com/gpu", "0") if n.status else 0)
        )

    wait_for(
        "the gauge", lambda: f"gpuheal_unmanaged_gpu_nodes {unmanaged()}.0" in controller.metrics()
    )


def test_opt_out_label_is_respected(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels={**pool, "gpuheal.io/managed": "false"})
    apply(kube, gpu_pod("keep", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)
    start_controller(controller_config(pool))
    report_fault(kube, node, "ignored")
    time.sleep(2)
    assert our_taint(kube, node) is None
    assert pods_on(kube, namespace, node) == {"keep"}
    assert faults_of(kube, node) == []


def test_breaker_holds_faults_beyond_the_cap_and_releases_them_as_nodes_recover(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    nodes = fake_gpu_nodes(50, labels=pool)
    faulty = nodes[:15]  # 30% of 50
    start_controller(controller_config(pool, breakerMaxPercent=10, breakerMaxNodes=100))
    for node in faulty:
        report_fault(kube, node, f"storm-{node}")

    def tainted() -> list[str]:
        return [n for n in faulty if our_taint(kube, n)]

    def held() -> list[str]:
        return [n for n in faulty if any(record_phase(r) == "Held" for r in faults_of(kube, n))]

    wait_for("5 quarantined and 10 held", lambda: len(tainted()) == 5 and len(held()) == 10)
    time.sleep(1.5)
    assert len(tainted()) == 5  # exactly the cap, stable
    for node in held():
        assert len(events_for(kube, node, "GPUFaultHeld", at_least=1)) == 1

    # The quarantined ones recover: the held ones proceed, never more than 5 at once.
    first = tainted()
    for node in first:
        clear_fault(kube, node)
    wait_for(
        "the next 5 quarantined",
        lambda: len([n for n in tainted() if n not in first]) == 5,
        timeout_s=60,
    )
    assert len(tainted()) <= 5
    assert len(held()) == 5


def test_pdb_blocks_eviction_it_is_retried_not_deleted(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    guarded_pod(kube, namespace, node)
    wait_pods_running(kube, namespace, count=1)
    start_controller(controller_config(pool))
    report_fault(kube, node, "pdb-fault")

    blocked = "GPUPodEvictionBlocked"
    wait_for("a blocked-eviction event", lambda: evictions_from(kube, node, blocked))
    time.sleep(2)  # several retries happen meanwhile
    assert pods_on(kube, namespace, node) == {"guarded"}  # not deleted
    assert len(evictions_from(kube, node, blocked, at_least=1)) == 1
    (record,) = faults_of(kube, node)
    assert record_phase(record) == "Draining"

    # The budget is lifted: the retry goes through.
    kube.delete(PodDisruptionBudget, "guarded", namespace=namespace)
    wait_for("the pod evicted", lambda: not pods_on(kube, namespace, node))


def test_evicted_deployment_pods_are_recreated_on_healthy_nodes_only(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    bad, good = fake_gpu_nodes(2, labels=pool)
    deployment = gpu_deployment("serve", namespace, replicas=8, node_selector=pool)
    # The scheduler spreads replicas as its scores say (a preferred affinity once lost
    # too, and the fault had nothing to move): the other node is cordoned until the
    # replicas run, so they start on the node about to fail.
    kube.patch(Node, good, {"spec": {"unschedulable": True}})
    apply(kube, deployment)
    wait_pods_running(kube, namespace, count=8, labels={"app": "serve"})
    kube.patch(Node, good, {"spec": {"unschedulable": False}})
    on_bad = len(pods_on(kube, namespace, bad))
    assert on_bad > 0
    start_controller(controller_config(pool))
    report_fault(kube, bad, "deploy-fault")

    def settled() -> bool:
        running = wait_pods_running(kube, namespace, count=8, labels={"app": "serve"}, timeout_s=5)
        return all(p.spec and p.spec.nodeName == good for p in running) and not pods_on(
            kube, namespace, bad
        )

    wait_for("all 8 replicas Running on the healthy node", _tolerant(settled), timeout_s=90)


def _tolerant(check: Any) -> Any:
    def run() -> bool:
        try:
            return bool(check())
        except (TimeoutError, ApiError):
            return False

    return run


def test_a_condition_from_another_detector_is_mapped_to_a_fault_by_config(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    rule = {"type": "AcceleratedHardwareReady", "status": "False", "severity": "P0"}
    start_controller(controller_config(pool, conditions=[rule]))
    condition = {
        "type": "AcceleratedHardwareReady",
        "status": "False",
        "reason": "NvidiaXID79Error",
        "message": "GPU has fallen off the bus",
        "lastHeartbeatTime": "2026-11-29T10:00:00Z",
        "lastTransitionTime": "2026-11-29T10:00:00Z",
    }
    # Written the way node-problem-detector or EKS's node monitoring agent writes it.
    kube.patch(
        Node.Status,
        node,
        {"status": {"conditions": [condition]}},
        patch_type=PatchType.STRATEGIC,
    )
    wait_for("the taint", lambda: our_taint(kube, node) is not None)
    record = record_of(kube, node)
    assert record.spec["reason"] == "NvidiaXID79Error"
    assert record.spec["severity"] == "P0"
    assert record.spec["source"] == "node-condition/AcceleratedHardwareReady"
