"""What every operator command reads from the cluster, and the small facts it
derives from API objects (GPU quantities, readiness, ownership).

Reads go through one blocking lightkube client, in pages, with no watch: a
command is a snapshot. Facts about a node's pool and expected state come from
gpuheal.policy.pools, so all commands and the controller agree.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec
from lightkube import Client
from lightkube.generic_resource import GenericGlobalResource
from lightkube.models.core_v1 import Container
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.config import Config
from gpuheal.kube.projections import FaultJson, fault_record
from gpuheal.kube.resources import GPUFault
from gpuheal.model import FaultRecord

LIST_PAGE = 500

log = logging.getLogger(__name__)


def quantity(value: str | None) -> int:
    """A whole-number resource quantity ("8", "8000m" is not a GPU count: 0)."""
    try:
        return int(value or "0")
    except ValueError:
        return 0


def gpu_total(resources: Mapping[str, str] | None, config: Config) -> int:
    """The sum of every GPU resource (nvidia.com/gpu and MIG profiles) in a resource map."""
    return sum(quantity(v) for k, v in (resources or {}).items() if config.is_gpu_resource(k))


def _container_gpus(container: Container, config: Config) -> int:
    resources = container.resources
    if resources is None:
        return 0
    # Extended resources: a limit alone implies an equal request.
    wanted = {**(resources.limits or {}), **(resources.requests or {})}
    return gpu_total(wanted, config)


def pod_gpus(pod: Pod, config: Config) -> int:
    """GPUs the scheduler counts for this pod: the larger of the containers' sum
    and the largest init container (they run one at a time, before the others)."""
    spec = pod.spec
    if spec is None:
        return 0
    main = sum(_container_gpus(c, config) for c in spec.containers)
    init = max((_container_gpus(c, config) for c in spec.initContainers or ()), default=0)
    return max(main, init)


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


@dataclass
class Snapshot:
    """The cluster as one command sees it."""

    nodes: list[Node]
    pods: list[Pod]
    faults: list[GenericGlobalResource]  # GPUFault records
    pods_by_node: dict[str, list[Pod]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        by_node: dict[str, list[Pod]] = defaultdict(list)
        for pod in self.pods:
            if pod.spec is not None and pod.spec.nodeName:
                by_node[pod.spec.nodeName].append(pod)
        self.pods_by_node = dict(by_node)

    def gpu_nodes(self, config: Config) -> list[Node]:
        return [n for n in self.nodes if gpu_node(n, config)]


def snapshot(client: Client, *, faults: bool = True) -> Snapshot:
    """Every node and pod (and GPUFault record), listed in pages."""
    nodes = list(client.list(Node, chunk_size=LIST_PAGE))
    pods = list(client.list(Pod, namespace="*", chunk_size=LIST_PAGE))
    records = list(client.list(GPUFault, chunk_size=LIST_PAGE)) if faults else []
    return Snapshot(nodes=nodes, pods=pods, faults=records)
