"""`gpuheal doctor NODE`: read what the four questions need, then answer them.

Reads only, never writes: the node, every node (candidates, pool, rack), the
pods on the node, the Pending pods, and then only what those call for — the
node's GPUFault records, PodDisruptionBudgets and ResourceQuotas of the
namespaces involved, the scheduler's FailedScheduling Events of the Pending
pods shown, and the pods bound elsewhere when free GPUs matter. Optional reads
that are refused (no CRD, RBAC) become an "could not read" line, not a failure.
The reasoning is in ops/diagnosis.py and the modules it names.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeVar

import httpx2
from lightkube import ApiError, Client
from lightkube.operators import not_equal, not_in
from lightkube.resources.core_v1 import Event, Node, Pod, ResourceQuota
from lightkube.resources.policy_v1 import PodDisruptionBudget

from gpuheal.config import Config
from gpuheal.kube.resources import GPUFault
from gpuheal.model import NODE_LABEL
from gpuheal.ops.cluster import LIST_PAGE, fault_records, pod_gpus
from gpuheal.ops.context import Context
from gpuheal.ops.diagnosis import Diagnosis, diagnose
from gpuheal.ops.findings import Facts
from gpuheal.ops.movement import PENDING_SHOWN, evictable, relevant_pending
from gpuheal.ops.output import render
from gpuheal.values import node_label

T = TypeVar("T")
R = TypeVar("R")
# Reads that may be refused without spoiling the diagnosis: not found, forbidden.
_OPTIONAL = (403, 404)


def run(ctx: Context, node: str) -> int:
    diagnosis = examine(ctx.client, ctx.config, node, ctx.now())
    render(diagnosis, ctx.output, ctx.out)
    return diagnosis.exit_code


def examine(client: Client, config: Config, name: str, now: dt.datetime) -> Diagnosis:
    return diagnose(gather(client, config, name, now), config)


class _Reads:
    """Optional reads: a refusal (no CRD, RBAC) is noted, not raised."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.unread: list[str] = []

    def optional(
        self, what: str, read: Callable[[], Iterable[T]], *, missing: str = "not found"
    ) -> list[T] | None:
        why = {403: "forbidden", 404: missing}
        try:
            return list(read())
        except ApiError as err:
            if err.status.code not in _OPTIONAL:
                raise
            self.unread.append(f"{what} ({why[err.status.code]})")
        except httpx2.HTTPStatusError as err:
            # An API path that does not exist (no CRD) answers 404 in plain text,
            # which lightkube leaves as an HTTP error rather than an ApiError.
            if err.response.status_code not in _OPTIONAL:
                raise
            self.unread.append(f"{what} ({why[err.response.status_code]})")
        return None

    def per_namespace(
        self, what: str, resource: type[R], namespaces: Iterable[str], **options: Any
    ) -> list[R]:
        found: list[R] = []
        for namespace in sorted(set(namespaces)):
            read = partial(self.client.list, resource, namespace=namespace, **options)
            found += self.optional(f"{what} in {namespace}", read) or []
        return found


def gather(client: Client, config: Config, name: str, now: dt.datetime) -> Facts:
    try:
        node = client.get(Node, name)
    except ApiError as err:
        if err.status.code == 404:
            return Facts(name=name, node=None, now=now)
        raise
    nodes = list(client.list(Node, chunk_size=LIST_PAGE))
    on_node = list(
        client.list(Pod, namespace="*", fields={"spec.nodeName": name}, chunk_size=LIST_PAGE)
    )
    pending = list(
        client.list(Pod, namespace="*", fields={"status.phase": "Pending"}, chunk_size=LIST_PAGE)
    )
    shown = relevant_pending(node, pending, config)[:PENDING_SHOWN]
    movable = evictable(on_node)
    reads = _Reads(client)
    # Free GPUs on other nodes matter only to explain a Pending pod.
    bound = None
    if shown:
        bound = reads.optional(
            "the pods bound to nodes",
            partial(
                client.list,
                Pod,
                namespace="*",
                fields={
                    "spec.nodeName": not_equal(""),
                    "status.phase": not_in(["Succeeded", "Failed"]),
                },
                chunk_size=LIST_PAGE,
            ),
        )
    records = reads.optional(
        "the node's GPUFault records",
        partial(client.list, GPUFault, labels={NODE_LABEL: node_label(name)}, chunk_size=LIST_PAGE),
        missing="not found: is the GPUFault CRD installed?",
    )
    pdbs = reads.per_namespace(
        "PodDisruptionBudgets", PodDisruptionBudget, (_namespace(p) for p in movable)
    )
    moving_gpus = [_namespace(p) for p in movable if pod_gpus(p, config) > 0]
    quotas = reads.per_namespace(
        "ResourceQuotas", ResourceQuota, [*(_namespace(p) for p in shown), *moving_gpus]
    )
    events = reads.per_namespace(
        "Events",
        Event,
        (_namespace(p) for p in shown),
        fields={"reason": "FailedScheduling", "involvedObject.kind": "Pod"},
        chunk_size=LIST_PAGE,
    )
    return Facts(
        name=name,
        node=node,
        now=now,
        nodes=nodes,
        pods_on_node=on_node,
        pending=pending,
        bound_pods=bound,
        faults=None if records is None else [f for f in fault_records(records) if f.node == name],
        pdbs=pdbs,
        quotas=quotas,
        scheduler_says=latest_messages(events),
        unread=reads.unread,
    )


def _namespace(pod: Pod) -> str:
    return (pod.metadata.namespace if pod.metadata else None) or ""


def _event_time(event: Event) -> dt.datetime:
    """When the event was last seen: its series, last timestamp, event time or creation."""
    series = event.series.lastObservedTime if event.series else None
    created = event.metadata.creationTimestamp if event.metadata else None
    for moment in (series, event.lastTimestamp, event.eventTime, event.firstTimestamp, created):
        if moment is not None:
            return moment
    return dt.datetime.min.replace(tzinfo=dt.UTC)


def latest_messages(events: Iterable[Event]) -> dict[str, str]:
    """Pod UID -> the message of its newest event."""
    newest: dict[str, tuple[dt.datetime, str]] = {}
    for event in events:
        uid = event.involvedObject.uid if event.involvedObject else None
        if not uid or not event.message:
            continue
        moment = _event_time(event)
        if uid not in newest or moment >= newest[uid][0]:
            newest[uid] = (moment, event.message.strip())
    return {uid: message for uid, (_, message) in newest.items()}
