"""The small facts `gpuheal doctor` derives from the objects it read (ops/findings.py:
Facts), as kube/details.py decodes them: GPU quantities, liveness, ownership.

Facts about a node's pool and expected state come from gpuheal.policy.pools, so
all commands and the controller agree; the quantity arithmetic, readiness and
whether a node is a GPU node are ops/fleet.py's, for both projections.
"""

from __future__ import annotations

from gpuheal.config import Config
from gpuheal.kube.details import Container, Node, Pod
from gpuheal.ops.fleet import quantity as quantity  # noqa: PLC0414 -- re-exported, commands read it here
from gpuheal.ops.fleet import scheduled_gpus, wanted_gpus


def _container_gpus(container: Container, config: Config) -> int:
    return wanted_gpus(container.resources.limits, container.resources.requests, config)


def pod_gpus(pod: Pod, config: Config) -> int:
    """GPUs the scheduler counts for this pod (ops/fleet.py: scheduled_gpus)."""
    return scheduled_gpus(
        (_container_gpus(c, config) for c in pod.spec.containers),
        (_container_gpus(c, config) for c in pod.spec.initContainers),
    )


def owner_kind(pod: Pod) -> str:
    """The kind of the pod's controller ("" for a bare pod)."""
    return next((o.kind for o in pod.metadata.ownerReferences if o.controller), "")


def is_mirror_pod(pod: Pod) -> bool:
    return "kubernetes.io/config.mirror" in pod.metadata.annotations


def pod_live(pod: Pod) -> bool:
    """Still holds its node's resources: not Succeeded or Failed."""
    return pod.status.phase not in ("Succeeded", "Failed")


def labels_of(obj: Node | Pod) -> dict[str, str]:
    return dict(obj.metadata.labels)


def annotations_of(obj: Node | Pod) -> dict[str, str]:
    return dict(obj.metadata.annotations)


def name_of(obj: Node | Pod) -> str:
    return obj.metadata.name
