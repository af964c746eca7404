"""gpuheal against a real kubelet and container runtime (the node tier): a pod that
really runs, a checkpoint request that really reaches the process, an eviction that
really runs the preStop hook and sends SIGTERM, and a drain that waits for the pod to
be gone. The real node is the only one that runs containers; kwok's nodes beside it
take the replacements."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.model import CHECKPOINT_DONE
from gpuheal.sim import ControlPlane
from gpuheal.sim.realnode import POD_SUBNET, RealNode
from gpuheal.sim.workloads import apply
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    record_entries,
    record_of,
    record_phase,
    report_fault,
)
from tests.node.workload import journal, trainer_template

pytestmark = pytest.mark.timeout(240)


def label(kube: Client, node: str, labels: Mapping[str, str | None]) -> None:
    kube.patch(Node, node, {"metadata": {"labels": labels}})


def deployment(
    name: str, namespace: str, template: dict[str, Any], selector: dict[str, str]
) -> dict[str, Any]:
    template["spec"]["nodeSelector"] = selector
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": template["metadata"]["labels"]},
            "template": template,
        },
    }


def running_pods(kube: Client, namespace: str) -> list[Pod]:
    return [
        p
        for p in kube.list(Pod, namespace=namespace)
        if p.status
        and p.status.phase == "Running"
        and p.metadata
        and not p.metadata.deletionTimestamp
    ]


def test_the_real_node_runs_the_release_and_its_pods(
    real_node: RealNode, control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    node = kube.get(Node, real_node.name)
    assert node.status and node.status.nodeInfo
    assert node.status.nodeInfo.kubeletVersion == control_plane.version
    assert node.status.nodeInfo.containerRuntimeVersion.startswith("containerd://")
    addresses = {a.type: a.address for a in node.status.addresses or []}
    assert addresses["InternalIP"] == real_node.config.address

    template = trainer_template(
        real_node.config.build.workload_image, real_node.workdir / "journal", grace_s=5, stop_s=0
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello", "namespace": namespace, **template["metadata"]},
        "spec": template["spec"] | {"nodeName": real_node.name},
    }
    pod["spec"]["containers"][0]["resources"] = {}
    apply(kube, pod)
    started = wait_for(
        "the pod to run on the real node", lambda: running_pods(kube, namespace), timeout_s=60
    )
    assert started[0].status and started[0].status.podIP
    assert ipaddress.ip_address(started[0].status.podIP) in ipaddress.ip_network(POD_SUBNET)
    said = wait_for("its log", lambda: journal(real_node.workdir / "journal", "hello"))
    assert said[0][1] == "started"
    assert "started" in real_node.pod_logs(namespace, "hello")


def _ended(kube: Client, namespace: str, pod: str) -> bool:
    """Gone, or every container ended: a pod that holds no GPU, deleted or not."""
    try:
        found = kube.get(Pod, pod, namespace=namespace)
    except ApiError as err:
        if err.status.code == 404:
            return True
        raise
    return found.status is not None and found.status.phase in ("Succeeded", "Failed")


def _trainer_on(real_node: RealNode, kube: Client, namespace: str, pool: dict[str, str]) -> str:
    """The training Deployment's one pod, running on the real node (the pool's only node
    yet); its SIGTERM takes 4 s of a 30 s grace period."""
    template = trainer_template(
        real_node.config.build.workload_image, real_node.workdir / "journal", grace_s=30, stop_s=4
    )
    apply(kube, deployment("trainer", namespace, template, pool))
    (first,) = wait_for(
        "the trainer on the real node", lambda: running_pods(kube, namespace), timeout_s=60
    )
    assert first.spec and first.spec.nodeName == real_node.name
    return str(first.metadata.name)  # type: ignore[union-attr]


def test_a_checkpoint_request_reaches_the_process_and_the_eviction_is_real(
    real_node: RealNode,
    device_plugin: str,
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    """XidCritical48 with a checkpoint: the request reaches the training process through
    the real kubelet's downward API volume; once it says done, gpuheal evicts it, the
    kubelet runs its preStop hook and sends SIGTERM, and the record turns Drained only
    after the pod's containers have ended. The Deployment's replacement lands on a kwok
    node."""
    journal_dir = real_node.workdir / "journal"
    label(kube, real_node.name, dict(pool))
    try:
        trainer = _trainer_on(real_node, kube, namespace, pool)
        (spare,) = fake_gpu_nodes(1, labels=pool)
        checkpoint = {"reasons": ["XidCritical48"], "waitSeconds": 120}
        start_controller(controller_config(pool, checkpoint=checkpoint))
        report_fault(kube, real_node.name, "xid48-real-node", reason="XidCritical48")

        def asked() -> list[str]:
            return [w for _, w in journal(journal_dir, trainer) if w.startswith("checkpoint-req")]

        wait_for("the checkpoint request in the process", asked, timeout_s=60)
        # The workload's operator says done once the process has saved.
        done = {"metadata": {"annotations": {CHECKPOINT_DONE: "saved"}}}
        kube.patch(Pod, trainer, done, namespace=namespace)

        def drained() -> bool:
            phase = record_phase(record_of(kube, real_node.name))
            ended = _ended(kube, namespace, trainer)
            assert ended or phase != "Drained", "Drained while the evicted pod still ran"
            return phase == "Drained"

        wait_for("the record Drained", drained, timeout_s=90)
        said = journal(journal_dir, trainer)
        what = [w for _, w in said]
        assert what[0] == "started"
        assert what[1].startswith("checkpoint-requested")
        assert what[2:] == ["preStop", "SIGTERM", "exited"], said
        when = {what: at for at, what in said}
        assert when["exited"] - when["SIGTERM"] >= 4  # the grace period was honoured
        entries = record_entries(record_of(kube, real_node.name), "checkpointed")
        assert entries, record_entries(record_of(kube, real_node.name))
        (replacement,) = wait_for(
            "the replacement running", lambda: running_pods(kube, namespace), timeout_s=60
        )
        assert replacement.spec and replacement.spec.nodeName == spare
    finally:
        label(kube, real_node.name, dict.fromkeys(pool))
