"""Fake GPU nodes: Node objects that kwok keeps alive (Ready, lease heartbeat).

They look like GPU nodes labelled by NVIDIA's GPU feature discovery, so the
scheduler and gpuheal see what they would see on a real GPU cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Node

from gpuheal import values
from gpuheal.sim.controlplane import FAKE_NODE_ANNOTATION, FAKE_NODE_VALUE

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"


def hostname_label(name: str) -> str:
    return name if values.is_label_value(name) else name.split(".", 1)[0][:63]


def gpu_node(
    name: str,
    *,
    gpus: int = 8,
    product: str = DEFAULT_GPU_PRODUCT,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """The manifest of one fake GPU node (status included: kwok keeps it)."""
    resources = {
        "cpu": "192",
        "memory": "2Ti",
        "pods": "110",
        "ephemeral-storage": "30Ti",
        GPU_RESOURCE: str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                # As EKS sets it: the node name, unless that is no label value (an
                # FQDN past 63 characters), where the kubelet's short host name stands.
                "kubernetes.io/hostname": hostname_label(name),
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "gpu-8x",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": str(gpus),
                **(labels or {}),
            },
            "annotations": {
                FAKE_NODE_ANNOTATION: FAKE_NODE_VALUE,
                "node.alpha.kubernetes.io/ttl": "0",
                **(annotations or {}),
            },
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        # kwok's node-initialize stage keeps these and fills in the rest (nodeInfo, addresses).
        "status": {"capacity": resources, "allocatable": resources},
    }


def plain_node(name: str, *, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The manifest of one fake node without GPUs: no GPU capacity and no GPU labels
    (an infrastructure node, where the system's pods run)."""
    manifest = gpu_node(name)
    manifest["metadata"]["labels"] = {
        **{k: v for k, v in manifest["metadata"]["labels"].items() if "nvidia.com/" not in k},
        "node.kubernetes.io/instance-type": "cpu-16x",
        # What kube-controller-manager adds to every node a moment after it registers:
        # here from the start, so the node does not change under a test that compares.
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        **(labels or {}),
    }
    status = manifest["status"]
    resources = {k: v for k, v in status["capacity"].items() if k != GPU_RESOURCE}
    status.update(capacity=resources, allocatable=resources)
    return manifest


def create_gpu_nodes(
    client: Client,
    names: Iterable[str],
    *,
    gpus: int = 8,
    product: str = DEFAULT_GPU_PRODUCT,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """Create fake GPU nodes one after another; returns their names.

    Not in threads: lightkube decodes through msgspec, whose lazy per-type set-up
    crashed the interpreter (SIGSEGV) when two threads decoded a type for the first
    time at once. Bulk creation belongs on the asyncio client instead.
    """
    wanted = list(names)
    for name in wanted:
        client.create(codecs.from_dict(gpu_node(name, gpus=gpus, product=product, labels=labels)))
    return wanted


def is_ready(node: Node) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def wait_nodes_ready(client: Client, names: Iterable[str], *, timeout_s: float = 60) -> None:
    """Block until every named node reports Ready=True, or raise TimeoutError."""
    pending = set(names)
    deadline = time.monotonic() + timeout_s
    while pending:
        for node in client.list(Node):
            if node.metadata and node.metadata.name in pending and is_ready(node):
                pending.discard(node.metadata.name)
        if not pending:
            return
        if time.monotonic() >= deadline:
            shown = ", ".join(sorted(pending)[:5])
            raise TimeoutError(f"{len(pending)} node(s) not Ready after {timeout_s}s: {shown}")
        time.sleep(0.2)


def delete_nodes(client: Client, names: Iterable[str]) -> None:
    """Delete nodes, ignoring those already gone."""
    for name in names:
        try:
            client.delete(Node, name)
        except ApiError as err:
            if err.status.code != 404:
                raise
