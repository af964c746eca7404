"""The small facts the read commands (`status`, `audit`) derive from the slim
projections of kube/snapshot.py: GPU quantities, readiness, liveness.

The facts both projections share (GPU counts, liveness, readiness, the GPU-node
rule) are here for both, so `doctor` and maintenance's drain (the fuller
projections of kube/details.py) read them here too; ops/cluster.py has the facts
only the fuller projections carry.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import msgspec

from gpuheal.config import Config
from gpuheal.kube import details
from gpuheal.kube.api import ApiError, KubeApi, claim_path, node_path
from gpuheal.kube.projections import (
    ClaimJson,
    Container,
    NodeJson,
    PodJson,
    TaintJson,
    claim_names,
    claim_view_factory,
    pod_claims,
)
from gpuheal.kube.snapshot import Snapshot, list_all
from gpuheal.model import ready, scheduled_gpus
from gpuheal.policy import dra, nodes
from gpuheal.policy.pools import pool_of
from gpuheal.values import is_label_value

if TYPE_CHECKING:
    from gpuheal.ops.context import Context


def quantity(value: str | None) -> int:
    """A whole-number resource quantity ("8", "8000m" is not a GPU count: 0)."""
    try:
        return int(value or "0")
    except ValueError:
        return 0


def gpu_total(resources: Mapping[str, str] | None, config: Config) -> int:
    """The sum of every GPU resource (nvidia.com/gpu and MIG profiles) in a resource map."""
    return config.gpu_count((k, quantity(v)) for k, v in (resources or {}).items())


def wanted_gpus(
    limits: Mapping[str, str] | None, requests: Mapping[str, str] | None, config: Config
) -> int:
    """One container's GPUs: for extended resources a limit alone implies an equal request."""
    return gpu_total({**(limits or {}), **(requests or {})}, config)


def _container_gpus(container: Container, config: Config) -> int:
    return wanted_gpus(container.resources.limits, container.resources.requests, config)


def pod_gpus(pod: PodJson | details.Pod, config: Config) -> int:
    """GPUs the scheduler counts for this pod (scheduled_gpus)."""
    return scheduled_gpus(
        (_container_gpus(c, config) for c in pod.spec.containers),
        (_container_gpus(c, config) for c in pod.spec.initContainers),
    )


async def claim_holders(
    api: KubeApi, pods: Iterable[details.Pod], drivers: frozenset[str]
) -> set[str]:
    """The pods ("namespace/name") whose ResourceClaims were allocated a GPU of
    `drivers`: a DRA pod holds its GPUs through claims, not a count. Each claim read
    once, all at once; one gone or unreadable (403, 404) holds nothing."""
    wanted = {
        (p.metadata.namespace, name): f"{p.metadata.namespace}/{p.metadata.name}"
        for p in pods
        for name in claim_names(p.spec.resourceClaims, p.status.resourceClaimStatuses)
    }
    view = claim_view_factory(drivers)

    async def holds(namespace: str, name: str) -> bool:
        try:
            raw = await api.get(claim_path(namespace, name))
        except ApiError as err:
            if err.code in (403, 404):
                return False
            raise
        return bool(view(msgspec.json.decode(raw, type=ClaimJson)).allocated)

    keys = list(wanted)
    answers = await asyncio.gather(*(holds(ns, name) for ns, name in keys))
    return {wanted[key] for key, held in zip(keys, answers, strict=True) if held}


def pod_live(pod: PodJson | details.Pod) -> bool:
    """Still holds its node's resources: not Succeeded or Failed."""
    return pod.status.phase not in ("Succeeded", "Failed")


def pod_name(pod: PodJson) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def node_ready(node: NodeJson | details.Node) -> bool | None:
    """The Ready condition: True, False, or None when it is Unknown or absent."""
    return ready(node.status.conditions)


def gpu_node(node: NodeJson | details.Node, config: Config, dra_gpus: int = 0) -> bool:
    """Managed by gpuheal (policy/nodes.py), its GPU capacity every GPU resource's and
    `dra_gpus`, the GPUs DRA drivers offer on it."""
    capacity = gpu_total(node.status.capacity, config) + dra_gpus
    return nodes.gpu_node(node.metadata.labels, capacity, config)


def held_through_claims(pod: PodJson, snap: Snapshot) -> int:
    """The GPUs a pod's ResourceClaims were allocated (a snapshot read with DRA)."""
    claims = pod_claims(pod)
    if not claims:
        return 0
    devices = dra.by_key(snap.devices)
    return dra.gpu_count(dra.claim_gpus(pod.metadata.namespace, claims, snap.allocated, devices))


def why_unmanaged(node: NodeJson | details.Node, config: Config) -> str | None:
    """Why gpuheal does not act on the node (policy/nodes.py: not a GPU node, or opted
    out), or None: maintenance and roll-outs take only nodes it manages."""
    capacity = gpu_total(node.status.capacity, config)
    return nodes.why_unmanaged(node.metadata.labels, capacity, config)


_LABEL_KEY = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]*$")


def node_selector_query(config: Config) -> str:
    """The controller's nodeSelector as a LIST labelSelector, so the API server sends
    only GPU nodes; "" when it cannot say that exactly (no nodeSelector: GPU capacity
    decides; a key or value no label can have). gpu_node still decides either way."""
    terms = sorted(config.node_selector.items())
    if not terms or not all(_LABEL_KEY.match(k) and is_label_value(v) for k, v in terms):
        return ""
    return ",".join(f"{k}={v}" for k, v in terms)


def taint_of(node: NodeJson, key: str) -> TaintJson | None:
    return next((t for t in node.spec.taints if t.key == key), None)


async def gpu_nodes(ctx: Context) -> list[NodeJson]:
    """Every GPU node now, listed with the controller's nodeSelector (the one read
    of this module: the roll-out driver's and selftest's fleet)."""
    nodes = await list_all(
        ctx.api, node_path(), NodeJson, "Node", label_selector=node_selector_query(ctx.config)
    )
    return [n for n in nodes if gpu_node(n, ctx.config)]


def in_pool(nodes: Iterable[NodeJson], pool: str, config: Config) -> dict[str, NodeJson]:
    """The nodes of one pool (pools.label), by name."""
    return {n.metadata.name: n for n in nodes if pool_of(n.metadata.labels, config) == pool}
