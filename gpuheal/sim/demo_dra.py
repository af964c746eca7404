"""`gpuheal demo --dra N`: DRA-native GPU nodes beside the device-plugin fleet, and
one bad card fenced alone.

N nodes whose GPUs only NVIDIA's DRA driver offers (sim/dra.py: no `nvidia.com/gpu`,
one ResourceSlice each), an inference Deployment's worth of one-GPU pods, each
through its own ResourceClaim the real scheduler allocates. Then the driver taints
one card with Xid 48 (a double-bit ECC error), as its health check does: the
controller fences that card alone (a DeviceTaintRule), moves the one pod on it, and
leaves the node and its seven other cards in service.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.resources.resource_v1beta2 import DeviceTaintRule
from lightkube.types import PatchType

from gpuheal.policy.dra import by_key, pod_gpus, slice_devices
from gpuheal.policy.fence import FENCE_LABEL, FENCE_LABEL_VALUE
from gpuheal.sim.agent import gpu_spec
from gpuheal.sim.dra import (
    DRIVER,
    claim_pod,
    device_classes,
    dra_node,
    gpu_claim,
    resource_slice,
    with_taint,
)
from gpuheal.sim.nodes import wait_nodes_ready
from gpuheal.sim.workloads import apply, create_namespace, wait_pods_running

NAMESPACE = "inference"
PODS_PER_NODE = 4
XID_KEY = f"{DRIVER}/xid"


def dra_names(count: int) -> list[str]:
    return [f"dra-node-{i:03d}" for i in range(count)]


def setup(client: Client, count: int, timeout_s: float) -> list[str]:
    """The DRA nodes, their slices, and PODS_PER_NODE claim pods on each."""
    for manifest in device_classes():
        apply(client, manifest)
    names = dra_names(count)
    for name in names:
        apply(client, dra_node(name))
    wait_nodes_ready(client, names, timeout_s=timeout_s)
    for name in names:
        item = resource_slice(name, gpu_spec(name))
        item["metadata"] = {"name": f"00000-{DRIVER}-{name}"}
        apply(client, item)
    create_namespace(client, NAMESPACE)
    for name in names:
        pinned = {"kubernetes.io/hostname": name}
        for j in range(PODS_PER_NODE):
            pod = f"{name}-serve-{j}"
            apply(client, gpu_claim(f"{pod}-gpus", NAMESPACE))
            apply(client, claim_pod(pod, NAMESPACE, f"{pod}-gpus", node_selector=pinned))
    wait_pods_running(client, NAMESPACE, count=count * PODS_PER_NODE, timeout_s=timeout_s)
    return names


def card_of(client: Client, pod: str) -> tuple[str, str]:
    """The node and device (gpu-<n>) the scheduler gave a claim pod."""
    found = client.get(Pod, pod, namespace=NAMESPACE).to_dict()
    slices = [s.to_dict() for s in client.list(ResourceSlice)]
    claims = {
        (NAMESPACE, str(c.metadata.name)): c.to_dict()
        for c in client.list(ResourceClaim, namespace=NAMESPACE)
        if c.metadata is not None
    }
    (gpu,) = pod_gpus(found, claims, by_key(slice_devices(slices)))
    return gpu.node, gpu.key.device


def act(client: Client, node: str, say: Callable[[str], None], timeout_s: float) -> str:
    """The driver taints the card of the node's first pod (Xid 48); the controller's
    answer, waited for and said. Returns the summary line."""
    pod = f"{node}-serve-0"
    _, device = card_of(client, pod)
    say(f"NVIDIA's DRA driver taints {node}'s {device}: {XID_KEY}=48 (double-bit ECC)")
    started = time.monotonic()
    slice_name = f"00000-{DRIVER}-{node}"
    current = client.get(ResourceSlice, slice_name).to_dict()
    tainted = with_taint(current, device, XID_KEY, "48", "NoSchedule")
    client.patch(
        ResourceSlice, slice_name, {"spec": {"devices": tainted["spec"]["devices"]}},
        patch_type=PatchType.MERGE,
    )  # fmt: skip
    rule = _wait(lambda: _rule(client, node), timeout_s, f"{node}'s {device} fenced")
    fenced_s = time.monotonic() - started
    _wait(lambda: not _running(client, pod), timeout_s, f"{pod} moved")
    moved_s = time.monotonic() - started
    spec = client.get(Node, node).spec
    node_taints = [t.key for t in (spec.taints if spec else None) or []]
    line = (
        f"{node}'s {device} fenced alone by DeviceTaintRule {rule} in {fenced_s:.1f}s, "
        f"{pod} evicted in {moved_s:.1f}s; the node keeps its 7 other cards "
        f"(node taints: {', '.join(node_taints) or 'none'})"
    )
    say(line)
    return line


def _rule(client: Client, node: str) -> str:
    for rule in client.list(DeviceTaintRule, labels={FENCE_LABEL: FENCE_LABEL_VALUE}):
        annotations: dict[str, Any] = (rule.metadata.annotations if rule.metadata else None) or {}
        if annotations.get("gpuheal.io/node") == node and rule.metadata is not None:
            return str(rule.metadata.name)
    return ""


def _running(client: Client, pod: str) -> bool:
    try:
        found = client.get(Pod, pod, namespace=NAMESPACE)
    except ApiError as err:
        if err.status.code == 404:
            return False
        raise
    deleting = found.metadata is not None and found.metadata.deletionTimestamp is not None
    return not deleting and found.status is not None and found.status.phase == "Running"


def _wait(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the demo waited {timeout_s:.0f}s for {what}")
        time.sleep(0.2)
    return result
