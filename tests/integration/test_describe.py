"""`kubectl describe node|pod|gpufault` shows what gpuheal did and why: the first
thing an on-call engineer types. kubectl selects an object's Events by its UID
(and kind, name, namespace), so every Event names its object's UID; the assertions
are on kubectl's own output."""

from __future__ import annotations

import subprocess

from lightkube import Client

from gpuheal.sim import ControlPlane
from gpuheal.sim.binaries import default_binaries
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    evictions_from,
    faults_of,
    guarded_pod,
    our_taint,
    report_fault,
)


def kubectl(control_plane: ControlPlane, *args: str) -> str:
    done = subprocess.run(
        [str(default_binaries().kubectl), "--kubeconfig", str(control_plane.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_kubectl_describe_lists_gpuheals_events(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    # A budget keeps the pod on the node, so it is still there to be described.
    guarded_pod(kube, namespace, node)
    wait_pods_running(kube, namespace, count=1)
    start_controller(controller_config(pool))
    report_fault(kube, node, "xid-79-describe")
    wait_for("the taint", lambda: our_taint(kube, node) is not None)
    (record,) = wait_for("the record", lambda: faults_of(kube, node))
    wait_for("the events", lambda: events_for(kube, node, "GPUFaultQuarantined"))

    described = kubectl(control_plane, "describe", "node", node)
    print(described[described.find("Events:") :])
    assert "GPUFaultDetected" in described and "GPUFaultQuarantined" in described
    assert "xid-79-describe" in described

    described = kubectl(control_plane, "describe", "gpufault", record.metadata.name)
    print(described[described.find("Events:") :])
    assert "GPUFaultDetected" in described and "GPUFaultQuarantined" in described

    wait_for("the refusal", lambda: evictions_from(kube, node, "GPUPodEvictionBlocked"))
    described = kubectl(control_plane, "describe", "pod", "guarded", "-n", namespace)
    print(described[described.find("Events:") :])
    assert "GPUPodEvictionBlocked" in described
    assert f"PodDisruptionBudget {namespace}/guarded" in described

    # The Event names the version of the object it speaks of, where known.
    (quarantined,) = events_for(kube, node, "GPUFaultQuarantined")
    assert quarantined.involvedObject.uid and quarantined.involvedObject.resourceVersion


def test_events_of_a_pod_live_in_its_namespace(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_pod("train-0", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)
    start_controller(controller_config(pool))
    report_fault(kube, node, "xid-79-evict")
    (evicted,) = wait_for("the eviction event", lambda: evictions_from(kube, node))
    assert evicted.metadata.namespace == namespace
    assert evicted.involvedObject.kind == "Pod" and evicted.involvedObject.name == "train-0"
    assert evicted.involvedObject.uid  # the pod's, as describe pod selects them
    assert evicted.related is not None and evicted.related.uid  # the node's
