"""Device-level health on the real control plane (ResourceHealthStatus on): the tests
write Pod status allocatedResourcesStatus through pods/status, as the kubelet does."""

from __future__ import annotations

import time
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from gpuheal.model import CANARY_LABEL, QUARANTINED_DEVICES, SUSPECT_DEVICES, UNKNOWN_DEVICES
from gpuheal.sim.nodes import GPU_RESOURCE
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    our_taint,
    pods_on,
    pods_told_evicted,
)

pytestmark = pytest.mark.timeout(240)

CANARY_NAMESPACE = "gpuheal-system"


def gpu_id(index: int) -> str:
    return f"GPU-{index:08d}-1111-2222-3333-444444444444"


def device_config(pool: dict[str, str], **device: Any) -> dict[str, Any]:
    health = {
        "unknownToleranceSeconds": 4,
        "canaryNamespace": CANARY_NAMESPACE,
        "canaryTimeoutSeconds": 60,
        "observationSeconds": 1,
        "evictionsPerMinute": 600,
        "evictionBurst": 10,
        **device,
    }
    return controller_config(pool, deviceHealth=health)


def report_devices(kube: Client, namespace: str, pod: str, devices: dict[str, str]) -> None:
    """Write the pod's device health the way the kubelet does: the whole containerStatuses
    entry with allocatedResourcesStatus, through the pods/status subresource."""
    current = kube.get(Pod, pod, namespace=namespace)
    assert current.status is not None and current.status.containerStatuses
    statuses = [s.to_dict() for s in current.status.containerStatuses]
    resources = [{"resourceID": d, "health": h} for d, h in devices.items()]
    statuses[0]["allocatedResourcesStatus"] = [{"name": GPU_RESOURCE, "resources": resources}]
    kube.patch(
        Pod.Status,
        pod,
        {"status": {"containerStatuses": statuses}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    # kwok may rewrite pod status on its own stage transitions: the report must stay.
    back = kube.get(Pod, pod, namespace=namespace)
    assert back.status is not None and back.status.containerStatuses
    stored = back.status.containerStatuses[0].to_dict().get("allocatedResourcesStatus")
    assert stored == [{"name": GPU_RESOURCE, "resources": resources}]


def gpu_pods(kube: Client, namespace: str, node: str, count: int) -> list[str]:
    """`count` one-GPU pods on the node, job-i holding gpu_id(i), all reported Healthy."""
    names = [f"job-{i}" for i in range(count)]
    for name in names:
        apply(kube, gpu_pod(name, namespace, node_name=node))
    wait_pods_running(kube, namespace, count=count)
    for i, name in enumerate(names):
        report_devices(kube, namespace, name, {gpu_id(i): "Healthy"})
    return names


def marks(kube: Client, node: str, key: str) -> str:
    meta = kube.get(Node, node).metadata
    return (meta.annotations or {}).get(key, "") if meta else ""


def device_faults(kube: Client, node: str) -> list[Any]:
    return [r for r in faults_of(kube, node) if r.spec.get("scope") == "device"]


def phase_of(record: Any) -> str:
    return str((record.status or {}).get("phase", ""))


def canaries_on(kube: Client, node: str) -> list[Pod]:
    return [
        p
        for p in kube.list(Pod, namespace=CANARY_NAMESPACE, labels={CANARY_LABEL: "true"})
        if p.spec and p.spec.nodeName == node and p.metadata and not p.metadata.deletionTimestamp
    ]


def test_one_unhealthy_device_evicts_only_the_pods_holding_it_and_keeps_the_node(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    sink: tuple[str, list[dict[str, Any]]],
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    names = gpu_pods(kube, namespace, node, 8)
    url, received = sink
    controller = start_controller({**device_config(pool), "notificationSinks": [{"url": url}]})
    time.sleep(1)  # all Healthy: nothing happens
    assert not faults_of(kube, node) and pods_on(kube, namespace, node) == set(names)

    started = time.monotonic()
    report_devices(kube, namespace, "job-3", {gpu_id(3): "Unhealthy"})
    wait_for("job-3 evicted", lambda: "job-3" not in pods_on(kube, namespace, node))
    print(f"Unhealthy report -> pod evicted: {time.monotonic() - started:.2f}s")
    (record,) = wait_for("one device fault", lambda: device_faults(kube, node))
    assert record.spec["resourceID"] == gpu_id(3)
    assert record.spec["resourceName"] == GPU_RESOURCE and record.spec["expiry"]
    wait_for("drained", lambda: phase_of(device_faults(kube, node)[0]) == "Drained")
    # The device path tells the sinks too, each step in one line. The notifier sends
    # behind a queue, after the record is written: wait for the lines themselves.
    what = f"{node}: DeviceUnhealthy on {GPU_RESOURCE} {gpu_id(3)} — "
    told = {
        f"{what}detected, device quarantined, evicted 1 pod ({namespace}/job-3)",
        f"{what}drained",
    }
    wait_for("both steps told", lambda: told <= {m["summary"] for m in received})
    print("\n".join(m["summary"] for m in received))
    assert all(m["faultId"] == f"{gpu_id(3)}#1" and m["node"] == node for m in received)
    assert pods_on(kube, namespace, node) == {n for n in names if n != "job-3"}
    assert our_taint(kube, node) is None  # the node keeps its 7 healthy GPUs
    assert len(faults_of(kube, node)) == 1  # no node-level record
    assert marks(kube, node, QUARANTINED_DEVICES) == gpu_id(3)
    assert pods_told_evicted(kube, node, at_least=1) == [f"{namespace}/job-3"]
    assert events_for(kube, node, "GPUFaultDetected", at_least=1)
    metrics = controller.metrics()
    assert 'gpuheal_device_migrations_total{result="evicted"} 1.0' in metrics
    assert "gpuheal_devices_quarantined 1.0" in metrics


def test_unknown_shorter_than_the_window_is_nothing_longer_is_suspect(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    names = gpu_pods(kube, namespace, node, 2)
    controller = start_controller(device_config(pool, unknownToleranceSeconds=4))

    report_devices(kube, namespace, "job-0", {gpu_id(0): "Unknown"})
    wait_for("Unknown noted", lambda: marks(kube, node, UNKNOWN_DEVICES) == gpu_id(0))
    report_devices(kube, namespace, "job-0", {gpu_id(0): "Healthy"})  # back within the window
    wait_for("Unknown cleared", lambda: not marks(kube, node, UNKNOWN_DEVICES))
    time.sleep(5)  # past the window: nothing came of it
    assert not marks(kube, node, SUSPECT_DEVICES)
    assert events_for(kube, node, "GPUDeviceUnknown", at_least=1)
    assert not events_for(kube, node, "GPUDeviceSuspect")

    started = time.monotonic()
    report_devices(kube, namespace, "job-1", {gpu_id(1): "Unknown"})
    wait_for("suspect", lambda: marks(kube, node, SUSPECT_DEVICES) == gpu_id(1), timeout_s=20)
    waited = time.monotonic() - started
    print(f"Unknown -> suspect after {waited:.2f}s (tolerance 4s)")
    assert waited >= 3.5  # not before the tolerance window ended
    assert events_for(kube, node, "GPUDeviceSuspect", at_least=1)
    # Unknown is not Unhealthy: no fault, no eviction, no taint.
    assert not faults_of(kube, node)
    assert pods_on(kube, namespace, node) == set(names)
    assert our_taint(kube, node) is None
    assert "gpuheal_devices_suspect 1.0" in controller.metrics()


def test_a_stale_healthy_report_becomes_unknown_then_suspect(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    gpu_pods(kube, namespace, node, 1)
    start_controller(device_config(pool, heartbeatSeconds=3, unknownToleranceSeconds=3))
    wait_for("stale -> Unknown", lambda: marks(kube, node, UNKNOWN_DEVICES) == gpu_id(0))
    wait_for("Unknown -> suspect", lambda: marks(kube, node, SUSPECT_DEVICES) == gpu_id(0))
    assert not marks(kube, node, UNKNOWN_DEVICES)
    assert not faults_of(kube, node) and our_taint(kube, node) is None
    assert pods_on(kube, namespace, node) == {"job-0"}


def test_three_bad_devices_quarantine_the_whole_node(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    gpu_pods(kube, namespace, node, 8)
    start_controller(device_config(pool))
    for i in range(3):
        report_devices(kube, namespace, f"job-{i}", {gpu_id(i): "Unhealthy"})
    taint = wait_for("the node taint", lambda: our_taint(kube, node))
    assert taint is not None and taint.startswith("devices-")
    wait_for("every GPU pod moved", lambda: not pods_on(kube, namespace, node))
    assert len(device_faults(kube, node)) == 3
    node_faults = [r for r in faults_of(kube, node) if r.spec.get("scope") == "node"]
    assert [r.spec["reason"] for r in node_faults] == ["DeviceEscalation"]
    assert events_for(kube, node, "GPUDeviceEscalated", at_least=1)


def test_a_failing_canary_keeps_the_quarantine_and_a_passing_one_releases(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    gpu_pods(kube, namespace, node, 2)
    start_controller(device_config(pool, quarantineSeconds=6))
    report_devices(kube, namespace, "job-0", {gpu_id(0): "Unhealthy"})
    wait_for("job-0 evicted", lambda: "job-0" not in pods_on(kube, namespace, node))

    # The device plugin reports it healthy again and the kubelet hands it to a new pod.
    apply(kube, gpu_pod("job-0b", namespace, node_name=node))
    wait_for("job-0b running", lambda: _running(kube, namespace, "job-0b"))
    report_devices(kube, namespace, "job-0b", {gpu_id(0): "Healthy"})

    (canary,) = wait_for("a canary pod", lambda: canaries_on(kube, node))
    assert canary.spec is not None and canary.metadata is not None
    assert any(t.key == "gpuheal.io/gpu-fault" for t in canary.spec.tolerations or [])
    assert canary.spec.restartPolicy == "Never"
    name = str(canary.metadata.name)
    wait_for("canary running", lambda: _running(kube, CANARY_NAMESPACE, name))
    _finish(kube, name, "Failed")

    def failed_back_to_quarantine() -> bool:
        (record,) = device_faults(kube, node)
        actions = [a["action"] for a in record.status.get("actions", [])]
        return phase_of(record) == "Quarantined" and "canary-failed" in actions

    wait_for("canary failure noted", failed_back_to_quarantine)
    assert marks(kube, node, QUARANTINED_DEVICES) == gpu_id(0)
    assert events_for(kube, node, "GPUHealthGateFailed", at_least=1)
    # Healthy still, but the quarantine was extended: no new canary at once.
    time.sleep(2)
    assert not canaries_on(kube, node)
    assert phase_of(device_faults(kube, node)[0]) == "Quarantined"

    # After the extension a second canary runs; it passes; observation; release.
    (second,) = wait_for("a second canary", lambda: canaries_on(kube, node), timeout_s=30)
    assert second.metadata is not None and second.metadata.name != name
    second_name = str(second.metadata.name)
    wait_for("second canary running", lambda: _running(kube, CANARY_NAMESPACE, second_name))
    _finish(kube, second_name, "Succeeded")
    wait_for("released", lambda: phase_of(device_faults(kube, node)[0]) == "Resolved")
    wait_for("unmarked", lambda: not marks(kube, node, QUARANTINED_DEVICES))
    assert events_for(kube, node, "GPUFaultRecovered", at_least=1)
    assert our_taint(kube, node) is None


@pytest.mark.parametrize("crash_after", ["CreateDeviceRecord", "Evict"])
def test_a_restart_in_the_middle_of_a_migration_resumes_without_duplicates(
    crash_after: str,
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    # Two pods share one device (time-slicing); a third holds a healthy one.
    for name in ("share-a", "share-b", "other"):
        apply(kube, gpu_pod(name, namespace, node_name=node))
    wait_pods_running(kube, namespace, count=3)
    report_devices(kube, namespace, "other", {gpu_id(2): "Healthy"})
    config = device_config(pool)
    doomed = start_controller(config, env={"GPUHEAL_CRASH_AFTER": crash_after})
    for name in ("share-a", "share-b"):
        report_devices(kube, namespace, name, {gpu_id(1): "Unhealthy"})
    assert doomed.wait_exit(30) == -9, "the crashpoint was not reached"

    start_controller(config)
    wait_for("both moved", lambda: pods_on(kube, namespace, node) == {"other"})
    wait_for("drained", lambda: phase_of(device_faults(kube, node)[0]) == "Drained")
    time.sleep(1)
    (record,) = faults_of(kube, node)  # one record: the lock held across the restart
    assert record.spec["resourceID"] == gpu_id(1) and record.spec["faultID"] == f"{gpu_id(1)}#1"
    evicted = pods_told_evicted(kube, node)
    assert len(evicted) == len(set(evicted)) and len(evicted) <= 2, evicted
    assert len(events_for(kube, node, "GPUFaultDetected")) <= 1
    assert our_taint(kube, node) is None


def _running(kube: Client, namespace: str, name: str) -> bool:
    pod = kube.get(Pod, name, namespace=namespace)
    return pod.status is not None and pod.status.phase == "Running"


def _finish(kube: Client, name: str, phase: str) -> None:
    """What the kubelet writes when the canary's container exits."""
    kube.patch(
        Pod.Status,
        name,
        {"status": {"phase": phase}},
        namespace=CANARY_NAMESPACE,
        patch_type=PatchType.MERGE,
    )
