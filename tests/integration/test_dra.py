"""DRA-native GPU nodes on the real control plane: NVIDIA's DRA driver's DeviceClasses
and ResourceSlice (sim/dra.py) accepted by the real API server, every claim allocated
by the real kube-scheduler, the pods run by kwok, and gpuheal's reading of which pod
holds which GPU (policy/dra.py) checked against the scheduler's choice.

The node carries no `nvidia.com/gpu` anywhere, as under GPU Operator's DRA mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from gpuheal.policy.dra import by_key, pod_gpus, slice_devices
from gpuheal.sim.agent import gpu_spec
from gpuheal.sim.dra import (
    DRIVER,
    MAX_DRA_NODE_NAME,
    claim_pod,
    device_classes,
    dra_node,
    gpu_claim,
    resource_slice,
)
from gpuheal.sim.nodes import GPU_RESOURCE, delete_nodes, wait_nodes_ready
from gpuheal.sim.workloads import apply, wait_pods_running
from tests.corpus import unique_eks_node, unique_fqdn
from tests.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def gpu_classes(kube: Client) -> None:
    for manifest in device_classes():
        try:
            apply(kube, manifest)
        except ApiError as err:
            if err.status.code != 409:
                raise


@pytest.fixture
def dra_nodes(kube: Client, gpu_classes: None) -> Iterator[list[str]]:
    """Created DRA nodes (with their driver's slice), deleted afterwards with it."""
    created: list[str] = []
    yield created
    for name in created:
        for item in as_dicts(kube.list(ResourceSlice, fields={"spec.nodeName": name})):
            kube.delete(ResourceSlice, item["metadata"]["name"])
    delete_nodes(kube, created)


def add_dra_node(kube: Client, created: list[str], name: str, pool: dict[str, str]) -> None:
    created.append(name)
    apply(kube, dra_node(name, labels=pool))
    wait_nodes_ready(kube, [name])
    apply(kube, resource_slice(name, gpu_spec(name)))


def as_dicts(items: Any) -> list[dict[str, Any]]:
    return [i.to_dict() for i in items]


def test_eight_one_gpu_claims_get_eight_cards_and_gpuheal_knows_which_pod_holds_which(
    kube: Client, namespace: str, pool: dict[str, str], dra_nodes: list[str]
) -> None:
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool)
    stored = kube.get(Node, node).to_dict()
    assert GPU_RESOURCE not in stored["status"]["capacity"]
    for i in range(8):
        apply(kube, gpu_claim(f"train-{i}-gpus", namespace))
        apply(kube, claim_pod(f"train-{i}", namespace, f"train-{i}-gpus", node_selector=pool))
    running = as_dicts(wait_pods_running(kube, namespace, count=8, timeout_s=90))
    assert {p["spec"]["nodeName"] for p in running} == {node}

    slices = as_dicts(kube.list(ResourceSlice, fields={"spec.nodeName": node}))
    devices = by_key(slice_devices(slices))
    claims = {
        (namespace, c["metadata"]["name"]): c
        for c in as_dicts(kube.list(ResourceClaim, namespace=namespace))
    }
    held = {p["metadata"]["name"]: pod_gpus(p, claims, devices) for p in running}
    assert all(len(gpus) == 1 for gpus in held.values()), held
    # Eight pods, eight different cards: the node's eight UUIDs, each held once.
    assert sorted(g[0].uuid for g in held.values()) == sorted(
        d["uuid"] for d in gpu_spec(node)["devices"]
    )
    assert {g[0].key.driver for g in held.values()} == {DRIVER}

    # A ninth claim finds no free card: Pending, and the scheduler says why.
    apply(kube, gpu_claim("train-8-gpus", namespace))
    apply(kube, claim_pod("train-8", namespace, "train-8-gpus", node_selector=pool))

    def unschedulable() -> str:
        pod = kube.get(Pod, "train-8", namespace=namespace)
        conditions = (pod.status.conditions if pod.status else None) or []
        return next(
            (c.message or "" for c in conditions if c.type == "PodScheduled" and c.reason),
            "",
        )

    message = wait_for("the ninth pod to be found unschedulable", unschedulable, timeout_s=60)
    assert "claim" in message.lower(), message
    assert kube.get(Pod, "train-8", namespace=namespace).to_dict()["status"]["phase"] == "Pending"


def test_the_longest_node_name_the_driver_can_publish_a_pool_for(
    kube: Client, namespace: str, pool: dict[str, str], dra_nodes: list[str]
) -> None:
    """The driver names the pool after the node and the slice `00000-gpu.nvidia.com-
    <node>-` (its kubelet plugin library, vendored at DRIVER_COMMIT), which the API
    server holds to 253 characters and a dash: a node name of up to 232 characters
    gets its slice and its claims allocated; one longer (a name at the 253 limit)
    gets no slice from the real driver either, so it offers no DRA GPU at all."""
    node = unique_fqdn(MAX_DRA_NODE_NAME)
    add_dra_node(kube, dra_nodes, node, pool)
    (item,) = kube.list(ResourceSlice, fields={"spec.nodeName": node})
    assert item.spec.pool.name == node
    apply(kube, gpu_claim("one-gpus", namespace))
    apply(kube, claim_pod("one", namespace, "one-gpus", node_selector=pool))
    (pod,) = wait_pods_running(kube, namespace, count=1, timeout_s=60)
    claim = kube.get(ResourceClaim, "one-gpus", namespace=namespace).to_dict()
    devices = by_key(slice_devices([item.to_dict()]))
    (gpu,) = pod_gpus(pod.to_dict(), {(namespace, "one-gpus"): claim}, devices)
    assert gpu.node == node and gpu.uuid in {d["uuid"] for d in gpu_spec(node)["devices"]}

    longer = unique_fqdn(MAX_DRA_NODE_NAME + 1)
    with pytest.raises(ApiError) as refused:
        apply(kube, resource_slice(longer, gpu_spec(longer)))
    assert refused.value.status.code == 422
    assert "must be no more than 253 characters" in str(refused.value.status.message)
