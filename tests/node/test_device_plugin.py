"""NVIDIA's device plugin on the real node over the NVML stand-in: an Xid on one GPU
makes the plugin report that device Unhealthy, the real kubelet writes it into the pod
status of the pod holding it (allocatedResourcesStatus), and gpuheal's device path
moves exactly that pod; its replacement lands on another node."""

from __future__ import annotations

import time
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpuheal.sim.nodes import GPU_RESOURCE
from gpuheal.sim.realnode import RealNode
from gpuheal.sim.workloads import apply
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import StartController, controller_config, faults_of, our_taint
from tests.node.conftest import restart_device_plugin
from tests.node.gpus import NodeGpus
from tests.node.test_real_node import deployment, label, running_pods
from tests.node.workload import journal, trainer_template

pytestmark = pytest.mark.timeout(300)
REPLICAS = 8  # every GPU of the node held: exactly one pod holds the faulty one


def device_health(pod: Pod) -> dict[str, str]:
    """What the kubelet says of the pod's GPUs: device ID -> health."""
    statuses = (pod.status.containerStatuses if pod.status else None) or []
    found: dict[str, str] = {}
    for status in statuses:
        for resource in status.allocatedResourcesStatus or []:
            if resource.name == GPU_RESOURCE:
                found |= {r.resourceID: r.health or "" for r in resource.resources or []}
    return found


def holders(kube: Client, namespace: str) -> dict[str, dict[str, str]]:
    """Running pods of the namespace -> their GPUs' health, as the kubelet reports it."""
    return {
        str(p.metadata.name): device_health(p) for p in running_pods(kube, namespace) if p.metadata
    }


def device_config(pool: dict[str, str]) -> dict[str, Any]:
    health = {
        "canaryNamespace": "gpuheal-system",
        "observationSeconds": 1,
        "evictionsPerMinute": 600,
        "evictionBurst": 10,
    }
    return controller_config(pool, deviceHealth=health)


def test_an_xid_on_one_gpu_moves_exactly_the_pod_holding_it(
    real_node: RealNode,
    node_gpus: NodeGpus,
    device_plugin: str,
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    label(kube, real_node.name, dict(pool))
    try:
        template = trainer_template(
            real_node.config.build.workload_image,
            real_node.workdir / "journal",
            grace_s=5,
            stop_s=0,
        )
        manifest = deployment("inference", namespace, template, pool)
        manifest["spec"]["replicas"] = REPLICAS
        apply(kube, manifest)

        def all_reported() -> dict[str, dict[str, str]]:
            found = holders(kube, namespace)
            return found if len(found) == REPLICAS and all(found.values()) else {}

        before = wait_for("8 pods holding the 8 GPUs", all_reported, timeout_s=90)
        faulty = node_gpus.uuid(2)
        (holder,) = [pod for pod, devices in before.items() if faulty in devices]
        (spare,) = fake_gpu_nodes(1, labels=pool)
        start_controller(device_config(pool))
        time.sleep(2)  # all Healthy: nothing moves
        assert set(holders(kube, namespace)) == set(before)

        node_gpus.xid(2, 48)
        wait_for(
            "the kubelet's Unhealthy for the faulty GPU",
            lambda: any(d.get(faulty) == "Unhealthy" for d in _all_health(kube, namespace)),
            timeout_s=60,
        )
        wait_for("the holder moved", lambda: holder not in holders(kube, namespace), timeout_s=60)
        said = wait_for("the holder's end", lambda: _ended_journal(real_node, holder), timeout_s=30)
        assert said == ["started", "preStop", "SIGTERM", "exited"], said
        after = wait_for(
            "the replacement running", lambda: _replaced(kube, namespace, before), timeout_s=60
        )
        assert set(before) - {holder} <= set(after)  # the other seven untouched
        (replacement,) = set(after) - set(before)
        pod = kube.get(Pod, replacement, namespace=namespace)
        assert pod.spec and pod.spec.nodeName == spare
        assert our_taint(kube, real_node.name) is None  # the node keeps its seven good GPUs
        (record,) = faults_of(kube, real_node.name)
        assert record.spec and record.spec.get("resourceID") == faulty
    finally:
        label(kube, real_node.name, dict.fromkeys(pool))
        node_gpus.reset(2)
        restart_device_plugin(kube, device_plugin, real_node.name)


def _ended_journal(real_node: RealNode, pod: str) -> list[str]:
    """What the pod's process said, once it has said it exited (the eviction was real)."""
    said = [what for _, what in journal(real_node.workdir / "journal", pod)]
    return said if said and said[-1] == "exited" else []


def _all_health(kube: Client, namespace: str) -> list[dict[str, str]]:
    return [device_health(p) for p in kube.list(Pod, namespace=namespace)]


def _replaced(kube: Client, namespace: str, before: dict[str, Any]) -> dict[str, Any]:
    now = {str(p.metadata.name): p for p in running_pods(kube, namespace) if p.metadata}
    return now if len(now) == REPLICAS and set(now) != set(before) else {}
