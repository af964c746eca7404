"""lightkube's side of the node reads and Events of `maintenance` and its drain,
the operator commands not yet on kube/'s client (issue 17). `gate` reads the same
facts as slim projections (ops/gate.py); this module goes when they move too.

The Node Events the operator commands write (the gate's failure, maintenance
start and finish) are best effort, like the controller's, never a reason to fail.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

import httpx2
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.events_v1 import Event
from rich.text import Text

from gpuheal.config import Config
from gpuheal.kube.events import EVENT_NAMESPACE, event_body, node_ref
from gpuheal.kube.projections import device_plugin_matcher
from gpuheal.ops.cluster import (
    LIST_PAGE,
    annotations_of,
    gpu_node,
    labels_of,
    name_of,
    node_ready,
    pod_live,
    quantity,
)
from gpuheal.ops.context import Context
from gpuheal.policy.gate import DevicePluginPod, GateFacts
from gpuheal.policy.pools import driver_version, pool_of

REPORTING_CONTROLLER = "gpuheal.io/cli"


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
