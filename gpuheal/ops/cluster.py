"""The small facts `gpuheal doctor` derives from the objects it read (ops/findings.py:
Facts), as kube/details.py decodes them: GPU quantities, readiness, ownership.

Facts about a node's pool and expected state come from gpuheal.policy.pools, so
all commands and the controller agree; the quantity arithmetic is ops/fleet.py's.
"""

from __future__ import annotations

from gpuheal.config import Config
from gpuheal.kube.details import Container, Node, Pod
from gpuheal.ops.fleet import gpu_total, scheduled_gpus, wanted_gpus
from gpuheal.ops.fleet import quantity as quantity  # noqa: PLC0414 -- re-exported, commands read it here


def _container_gpus(container: Container, config: Config) -> int:
    return wanted_gpus(container.resources.limits, container.resources.requests, config)


def pod_gpus(pod: Pod, config: Config) -> int:
    """GPUs the scheduler counts for this pod (ops/fleet.py: scheduled_gpus)."""
    return scheduled_gpus(
        (_container_gpus(c, config) for c in pod.spec.containers),
        (_container_gpus(c, config) for c in pod.spec.initContainers),
    )


def node_ready(node: Node) -> bool | None:
    """The Ready condition: True, False, or None when it is Unknown or absent."""
    for condition in node.status.conditions:
        if condition.type == "Ready":
            return {"True": True, "False": False}.get(condition.status)
    return None


def owner_kind(pod: Pod) -> str:
    """The kind of the pod's controller ("" for a bare pod)."""
    return next((o.kind for o in pod.metadata.ownerReferences if o.controller), "")


def is_mirror_pod(pod: Pod) -> bool:
    return "kubernetes.io/config.mirror" in pod.metadata.annotations


def pod_live(pod: Pod) -> bool:
    """Still holds its node's resources: not Succeeded or Failed."""
    return pod.status.phase not in ("Succeeded", "Failed")


def gpu_node(node: Node, config: Config) -> bool:
    """Managed by gpuheal: matches the controller's nodeSelector (or has GPU capacity)."""
    labels = node.metadata.labels
    if config.node_selector:
        return all(labels.get(k) == v for k, v in config.node_selector.items())
    return gpu_total(node.status.capacity, config) > 0


def labels_of(obj: Node | Pod) -> dict[str, str]:
    return dict(obj.metadata.labels)


def annotations_of(obj: Node | Pod) -> dict[str, str]:
    return dict(obj.metadata.annotations)


def name_of(obj: Node | Pod) -> str:
    return obj.metadata.name
