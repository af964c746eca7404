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
    pods_told_evicted,
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

    # The record's own history is its account (Events go on the Node, the record
    # named as related: one Event per step, not a copy per object).
    described = kubectl(control_plane, "describe", "gpufault", record.metadata.name)
    print(described[described.find("Status:") :])
    assert "detect" in described and "taint" in described

    wait_for("the refusal", lambda: evictions_from(kube, node, "GPUPodEvictionBlocked"))
    described = kubectl(control_plane, "describe", "pod", "guarded", "-n", namespace)
    print(described[described.find("Events:") :])
    assert "GPUPodEvictionBlocked" in described
    assert f"PodDisruptionBudget {namespace}/guarded" in described

    # The Event names the version of the object it speaks of, where known.
    (quarantined,) = events_for(kube, node, "GPUFaultQuarantined", at_least=1)
    assert quarantined.involvedObject.uid and quarantined.involvedObject.resourceVersion


def test_one_event_on_the_node_names_the_pods_a_pass_evicted(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    for i in range(2):
        apply(kube, gpu_pod(f"train-{i}", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=2)
    start_controller(controller_config(pool))
    report_fault(kube, node, "xid-79-evict")
    (evicted,) = wait_for("the eviction event", lambda: evictions_from(kube, node))
    assert evicted.involvedObject.kind == "Node" and evicted.involvedObject.name == node
    assert evicted.involvedObject.uid  # the node's, as describe node selects them
    assert sorted(pods_told_evicted(kube, node)) == [f"{namespace}/train-{i}" for i in range(2)]
    described = kubectl(control_plane, "describe", "node", node)
    assert "GPUPodEvicted" in described and f"{namespace}/train-1" in described
