"""What every operator command reads from the cluster, and the small facts it
derives from API objects (GPU quantities, readiness, ownership).

Reads go through one blocking lightkube client, in pages, with no watch: a
command is a snapshot. Facts about a node's pool and expected state come from
gpuheal.policy.pools, so all commands and the controller agree. The read
commands (status, audit) work on slim projections instead: ops/fleet.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import msgspec
from lightkube.generic_resource import GenericGlobalResource
from lightkube.models.core_v1 import Container
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.config import Config
from gpuheal.kube.projections import FaultJson, fault_record
from gpuheal.model import FaultRecord
from gpuheal.ops.fleet import gpu_total, scheduled_gpus, wanted_gpus
from gpuheal.ops.fleet import quantity as quantity  # noqa: PLC0414 -- re-exported, commands read it here

LIST_PAGE = 500

log = logging.getLogger(__name__)


def _container_gpus(container: Container, config: Config) -> int:
    resources = container.resources
    if resources is None:
        return 0
    return wanted_gpus(resources.limits, resources.requests, config)


def pod_gpus(pod: Pod, config: Config) -> int:
    """GPUs the scheduler counts for this pod (ops/fleet.py: scheduled_gpus)."""
    spec = pod.spec
    if spec is None:
        return 0
    return scheduled_gpus(
        (_container_gpus(c, config) for c in spec.containers),
        (_container_gpus(c, config) for c in spec.initContainers or ()),
    )


def node_ready(node: Node) -> bool | None:
    """The Ready condition: True, False, or None when it is Unknown or absent."""
    for condition in (node.status.conditions if node.status else None) or ():
        if condition.type == "Ready":
            return {"True": True, "False": False}.get(condition.status)
    return None


def owner_kind(pod: Pod) -> str:
    """The kind of the pod's controller ("" for a bare pod)."""
    for owner in (pod.metadata.ownerReferences if pod.metadata else None) or ():
        if owner.controller:
            return owner.kind
    return ""


def is_mirror_pod(pod: Pod) -> bool:
    annotations = (pod.metadata.annotations if pod.metadata else None) or {}
    return "kubernetes.io/config.mirror" in annotations


def pod_live(pod: Pod) -> bool:
    """Still holds its node's resources: not Succeeded or Failed."""
    phase = pod.status.phase if pod.status else None
    return phase not in ("Succeeded", "Failed")


def gpu_node(node: Node, config: Config) -> bool:
    """Managed by gpuheal: matches the controller's nodeSelector (or has GPU capacity)."""
    labels = (node.metadata.labels if node.metadata else None) or {}
    if config.node_selector:
        return all(labels.get(k) == v for k, v in config.node_selector.items())
    return gpu_total(node.status.capacity if node.status else None, config) > 0


def labels_of(obj: Node | Pod) -> dict[str, str]:
    return dict((obj.metadata.labels if obj.metadata else None) or {})


def annotations_of(obj: Node | Pod) -> dict[str, str]:
    return dict((obj.metadata.annotations if obj.metadata else None) or {})


def name_of(obj: Node | Pod | GenericGlobalResource) -> str:
    return (obj.metadata.name if obj.metadata else None) or ""


def fault_records(records: Iterable[GenericGlobalResource]) -> list[FaultRecord]:
    """GPUFault objects as the controller sees them (kube/projections.py);
    a malformed one is skipped with a warning naming it, never a crash."""
    out = []
    for record in records:
        try:
            out.append(fault_record(msgspec.convert(dict(record), FaultJson)))
        except msgspec.ValidationError as err:
            name = (record.metadata.name if record.metadata else None) or "?"
            log.warning("GPUFault %s skipped: it cannot be read (%s)", name, err)
    return out
