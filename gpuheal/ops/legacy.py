"""lightkube's side of `maintenance` and its drain, the operator commands not yet
on kube/'s client (issue 17): their node and pod reads, the small facts they
derive from lightkube's models, and their Events. `gate` and `doctor` read the
same facts as projections (ops/gate.py, ops/cluster.py); this module goes when
maintenance moves too.

The Node Events the operator commands write (the gate's failure, maintenance
start and finish) are best effort, like the controller's, never a reason to fail.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping

import httpx2
import msgspec
from lightkube import ApiError, Client
from lightkube.models.core_v1 import Container
from lightkube.models.meta_v1 import LabelSelector
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.events_v1 import Event
from rich.text import Text

from gpuheal.config import Config
from gpuheal.kube import details
from gpuheal.kube.events import EVENT_NAMESPACE, event_body, node_ref
from gpuheal.kube.projections import device_plugin_matcher
from gpuheal.ops import scheduling
from gpuheal.ops.context import Context
from gpuheal.ops.fleet import gpu_total, quantity, scheduled_gpus, wanted_gpus
from gpuheal.policy.gate import DevicePluginPod, GateFacts
from gpuheal.policy.pools import driver_version, pool_of

REPORTING_CONTROLLER = "gpuheal.io/cli"
LIST_PAGE = 500


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


def name_of(obj: Node | Pod) -> str:
    return (obj.metadata.name if obj.metadata else None) or ""


def pod_key(pod: Pod) -> str:
    meta = pod.metadata
    return f"{(meta.namespace if meta else '') or ''}/{(meta.name if meta else '') or ''}"


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """ops/scheduling.selector_matches, of lightkube's LabelSelector."""
    if selector is None:
        return False
    return scheduling.selector_matches(
        msgspec.convert(selector.to_dict(), details.LabelSelector), labels
    )


def get_node(client: Client, name: str) -> Node | None:
    try:
        return client.get(Node, name)
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise


def pods_on(client: Client, node: str) -> list[Pod]:
    return list(
        client.list(Pod, namespace="*", fields={"spec.nodeName": node}, chunk_size=LIST_PAGE)
    )


def pod_ready(pod: Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or ()
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def gather(client: Client, config: Config, node: Node) -> GateFacts:
    """The node's facts: itself, its device-plugin pods, its pool's other nodes' drivers."""
    name = name_of(node)
    labels = labels_of(node)
    pool = pool_of(labels, config)
    peers: Counter[str] = Counter()
    for other in client.list(Node, chunk_size=LIST_PAGE):
        if name_of(other) == name or not gpu_node(other, config):
            continue
        other_labels = labels_of(other)
        if pool_of(other_labels, config) == pool:
            version = driver_version(other_labels, annotations_of(other))
            if version:
                peers[version] += 1
    gate = config.health_gate
    is_plugin = device_plugin_matcher(gate.device_plugin_selector, gate.device_plugin_namespaces)
    plugins = tuple(
        DevicePluginPod(f"{p.metadata.namespace}/{p.metadata.name}", pod_ready(p))
        for p in pods_on(client, name)
        if p.metadata is not None
        and pod_live(p)
        and is_plugin(p.metadata.namespace or "", labels_of(p))
    )
    allocatable = (node.status.allocatable if node.status else None) or {}
    return GateFacts(
        node=name,
        ready=node_ready(node),
        labels=labels,
        annotations=annotations_of(node),
        allocatable={k: quantity(v) for k, v in allocatable.items() if "/" in k},
        pool_drivers=dict(peers),
        device_plugin_pods=plugins,
    )


def emit_node_event(
    ctx: Context, node: Node, *, reason: str, note: str, action: str, warning: bool = False
) -> None:
    """One events.k8s.io/v1 Event on the Node (by its UID, so `kubectl describe node`
    lists it); a failure is a warning, not an error."""
    now = ctx.now().astimezone(dt.UTC)
    # lightkube writes a whole second without its fraction, which a MicroTime refuses.
    now = now.replace(microsecond=now.microsecond or 1)
    meta = node.metadata
    regarding = node_ref(
        name_of(node),
        (meta.uid if meta else None) or "",
        (meta.resourceVersion if meta else None) or "",
    )
    body = event_body(
        regarding,
        reason=reason,
        note=note,
        action=action,
        warning=warning,
        related=None,
        instance=ctx.actor or "gpuheal-cli",
        now=now,
        controller=REPORTING_CONTROLLER,
    )
    try:
        event = Event.from_dict(body)
        assert isinstance(event, Event)  # noqa: S101 -- from_dict is typed loosely
        ctx.client.create(event, namespace=EVENT_NAMESPACE)
    except (ApiError, httpx2.HTTPError) as err:
        ctx.err.print(Text(f"warning: Event {reason} not recorded: {err}", style="yellow"))
