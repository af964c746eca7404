"""The cluster's GPU state: per node, GPUs present and allocated, GPU pods.

`summarize` is a pure function of node and pod lists, so it is tested without
a server; `read_gpu_state` is the one function here that does I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.sim.nodes import GPU_RESOURCE, is_ready

_TERMINAL_PHASES = {"Succeeded", "Failed"}


@dataclass(frozen=True)
class NodeGpuState:
    name: str
    ready: bool
    product: str
    gpus: int
    allocated: int
    gpu_pods: int
    running_gpu_pods: int


def _quantity(value: str | None) -> int:
    # GPU counts are plain integers; anything else counts as none rather than crashing.
    try:
        return int(value or 0)
    except ValueError:
        return 0


def pod_gpus(pod: Pod, resource: str = GPU_RESOURCE) -> int:
    """GPUs a pod holds while it runs: max(sum over containers, any init container)."""
    spec = pod.spec
    if spec is None:
        return 0

    def request(container: object) -> int:
        resources = getattr(container, "resources", None)
        limits = (resources.limits if resources else None) or {}
        requests = (resources.requests if resources else None) or {}
        return _quantity(limits.get(resource) or requests.get(resource))

    main = sum(request(c) for c in spec.containers or [])
    init = max((request(c) for c in spec.initContainers or []), default=0)
    return max(main, init)


def summarize(
    nodes: Iterable[Node], pods: Iterable[Pod], resource: str = GPU_RESOURCE
) -> list[NodeGpuState]:
    allocated: dict[str, int] = defaultdict(int)
    counted: dict[str, int] = defaultdict(int)
    running: dict[str, int] = defaultdict(int)
    for pod in pods:
        node_name = pod.spec.nodeName if pod.spec else None
        phase = pod.status.phase if pod.status else None
        gpus = pod_gpus(pod, resource)
        if not node_name or gpus == 0 or phase in _TERMINAL_PHASES:
            continue
        allocated[node_name] += gpus
        counted[node_name] += 1
        running[node_name] += phase == "Running"
    rows = []
    for node in nodes:
        meta, status = node.metadata, node.status
        name = (meta.name if meta else None) or ""
        labels = (meta.labels if meta else None) or {}
        capacity = (status.capacity if status else None) or {}
        rows.append(
            NodeGpuState(
                name=name,
                ready=is_ready(node),
                product=labels.get("nvidia.com/gpu.product", "-"),
                gpus=_quantity(capacity.get(resource)),
                allocated=allocated[name],
                gpu_pods=counted[name],
                running_gpu_pods=running[name],
            )
        )
    return sorted(rows, key=lambda r: r.name)


def read_gpu_state(client: Client, resource: str = GPU_RESOURCE) -> list[NodeGpuState]:
    return summarize(client.list(Node), client.list(Pod, namespace="*"), resource)


def render(rows: list[NodeGpuState]) -> str:
    header = ("NODE", "READY", "GPU PRODUCT", "GPUS", "ALLOCATED", "GPU PODS")
    table = [header] + [
        (
            r.name,
            str(r.ready),
            r.product,
            str(r.gpus),
            str(r.allocated),
            f"{r.running_gpu_pods}/{r.gpu_pods} running",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in table]
    total_gpus = sum(r.gpus for r in rows)
    total_alloc = sum(r.allocated for r in rows)
    share = f"{100 * total_alloc / total_gpus:.0f}%" if total_gpus else "-"
    lines.append(
        f"{sum(r.ready for r in rows)}/{len(rows)} nodes Ready, {total_gpus} GPUs, "
        f"{total_alloc} allocated ({share}), "
        f"{sum(r.running_gpu_pods for r in rows)}/{sum(r.gpu_pods for r in rows)} GPU pods running"
    )
    return "\n".join(line.rstrip() for line in lines)
