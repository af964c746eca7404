"""The small facts `gpuheal doctor` derives from the objects it read (ops/findings.py:
Facts), as kube/details.py decodes them: ownership, mirror pods, labels.

Facts about a node's pool and expected state come from gpuheal.policy.pools, so
all commands and the controller agree; GPU counts, liveness, readiness and
whether a node is a GPU node are ops/fleet.py's, for both projections.
"""

from __future__ import annotations

from gpuheal.kube.details import Node, Pod
from gpuheal.ops.fleet import quantity as quantity  # noqa: PLC0414 -- re-exported, commands read it here


def owner_kind(pod: Pod) -> str:
    """The kind of the pod's controller ("" for a bare pod)."""
    return next((o.kind for o in pod.metadata.ownerReferences if o.controller), "")


def is_mirror_pod(pod: Pod) -> bool:
    return "kubernetes.io/config.mirror" in pod.metadata.annotations


def labels_of(obj: Node | Pod) -> dict[str, str]:
    return dict(obj.metadata.labels)


def annotations_of(obj: Node | Pod) -> dict[str, str]:
    return dict(obj.metadata.annotations)


def name_of(obj: Node | Pod) -> str:
    return obj.metadata.name
