"""`gpuheal doctor NODE`: read what the four questions need, then answer them.

Reads only, never writes: the node, every node (candidates, pool, rack), the
pods on the node, the Pending pods, the node's DRA GPUs (its ResourceSlices and
gpuheal's DeviceTaintRules), and then only what those call for — the
node's GPUFault records, PodDisruptionBudgets and ResourceQuotas of the
namespaces involved, the scheduler's FailedScheduling Events of the Pending
pods shown, and the pods bound elsewhere when free GPUs matter. Each round of
reads goes out at once, decoded into kube/details.py's projections. Optional
reads that are refused (no CRD, RBAC) become an "could not read" line, not a
failure. The reasoning is in ops/diagnosis.py and the modules it names.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, TypeVar

import msgspec

from gpuheal.config import Config
from gpuheal.kube.api import ApiError, KubeApi, gpufault_path, node_path
from gpuheal.kube.details import Event, Node, Pod, PodDisruptionBudget, ResourceQuota
from gpuheal.kube.projections import FaultJson, fault_record
from gpuheal.kube.snapshot import ALL_PODS, LIVE_BOUND_PODS, list_all, read_node_dra
from gpuheal.model import NODE_LABEL
from gpuheal.ops.diagnosis import Diagnosis, diagnose
from gpuheal.ops.findings import Facts
from gpuheal.ops.fleet import pod_gpus
from gpuheal.ops.movement import PENDING_SHOWN, evictable, relevant_pending
from gpuheal.ops.output import render
from gpuheal.values import node_label

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

T = TypeVar("T")
S = TypeVar("S", bound=msgspec.Struct)
# Reads that may be refused without spoiling the diagnosis: not found, forbidden.
_OPTIONAL = (403, 404)
FAILED_SCHEDULING = "reason=FailedScheduling,involvedObject.kind=Pod"


async def run(ctx: Context, node: str) -> int:
    diagnosis = await examine(ctx.api, ctx.config, node, ctx.now())
    render(diagnosis, ctx.output, ctx.out)
    return diagnosis.exit_code


async def examine(api: KubeApi, config: Config, name: str, now: dt.datetime) -> Diagnosis:
    return diagnose(await gather(api, config, name, now), config)


async def _optional(
    what: str, read: Awaitable[list[T]], *, missing: str = "not found"
) -> tuple[list[T] | None, str]:
    """A read that may be refused (no CRD, RBAC): (None, what could not be read and why)."""
    try:
        return await read, ""
    except ApiError as err:
        if err.code not in _OPTIONAL:
            raise
        return None, f"{what} ({'forbidden' if err.code == 403 else missing})"


async def _per_namespace(
    api: KubeApi,
    what: str,
    resource: str,
    json_type: type[S],
    namespaces: Iterable[str],
    *,
    field_selector: str = "",
) -> tuple[list[S], list[str]]:
    """`resource` ("api/v1/resourcequotas"...) listed in each namespace at once:
    what was found, and the namespaces' refusals in their order."""
    group, plural = resource.rsplit("/", 1)
    answers = await asyncio.gather(
        *(
            _optional(
                f"{what} in {namespace}",
                list_all(
                    api,
                    f"/{group}/namespaces/{namespace}/{plural}",
                    json_type,
                    what,
                    field_selector=field_selector,
                ),
            )
            for namespace in sorted(set(namespaces))
        )
    )
    return [o for found, _ in answers for o in found or ()], [why for _, why in answers if why]


async def _unread_nothing() -> tuple[None, str]:
    return None, ""


async def gather(api: KubeApi, config: Config, name: str, now: dt.datetime) -> Facts:
    try:
        node = msgspec.json.decode(await api.get(node_path(name)), type=Node)
    except ApiError as err:
        if err.code == 404:
            return Facts(name=name, node=None, now=now)
        raise
    nodes, on_node, pending, dra = await asyncio.gather(
        list_all(api, node_path(), Node, "Node"),
        list_all(api, ALL_PODS, Pod, "Pod", field_selector=f"spec.nodeName={name}"),
        list_all(api, ALL_PODS, Pod, "Pod", field_selector="status.phase=Pending"),
        read_node_dra(api, name, frozenset(config.gpu_drivers)),
    )
    shown = relevant_pending(node, pending, config)[:PENDING_SHOWN]
    movable = evictable(on_node)
    moving_gpus = [p.metadata.namespace for p in movable if pod_gpus(p, config) > 0]
    # Free GPUs on other nodes matter only to explain a Pending pod.
    bound_read = (
        _optional(
            "the pods bound to nodes",
            list_all(api, ALL_PODS, Pod, "Pod", field_selector=LIVE_BOUND_PODS),
        )
        if shown
        else _unread_nothing()
    )
    (bound, no_bound), (records, no_records), pdbs, quotas, events = await asyncio.gather(
        bound_read,
        _optional(
            "the node's GPUFault records",
            list_all(
                api,
                gpufault_path(),
                FaultJson,
                "GPUFault",
                label_selector=f"{NODE_LABEL}={node_label(name)}",
            ),
            missing="not found: is the GPUFault CRD installed?",
        ),
        _per_namespace(
            api,
            "PodDisruptionBudgets",
            "apis/policy/v1/poddisruptionbudgets",
            PodDisruptionBudget,
            (p.metadata.namespace for p in movable),
        ),
        _per_namespace(
            api,
            "ResourceQuotas",
            "api/v1/resourcequotas",
            ResourceQuota,
            [*(p.metadata.namespace for p in shown), *moving_gpus],
        ),
        _per_namespace(
            api,
            "Events",
            "api/v1/events",
            Event,
            (p.metadata.namespace for p in shown),
            field_selector=FAILED_SCHEDULING,
        ),
    )
    unread = [*dra.unread, no_bound, no_records, *pdbs[1], *quotas[1], *events[1]]
    faults = None if records is None else [fault_record(r) for r in records]
    return Facts(
        name=name,
        node=node,
        now=now,
        nodes=nodes,
        pods_on_node=on_node,
        pending=pending,
        bound_pods=bound,
        faults=None if faults is None else [f for f in faults if f.node == name],
        pdbs=pdbs[0],
        quotas=quotas[0],
        scheduler_says=latest_messages(events[0]),
        unread=[why for why in unread if why],
        dra=dra,
    )


def _event_time(event: Event) -> dt.datetime:
    """When the event was last seen: its series, last timestamp, event time or creation."""
    series = event.series.lastObservedTime if event.series else None
    created = event.metadata.creationTimestamp
    for moment in (series, event.lastTimestamp, event.eventTime, event.firstTimestamp, created):
        if moment is not None:
            return moment
    return dt.datetime.min.replace(tzinfo=dt.UTC)


def latest_messages(events: Iterable[Event]) -> dict[str, str]:
    """Pod UID -> the message of its newest event."""
    newest: dict[str, tuple[dt.datetime, str]] = {}
    for event in events:
        uid = event.involvedObject.uid
        if not uid or not event.message:
            continue
        moment = _event_time(event)
        if uid not in newest or moment >= newest[uid][0]:
            newest[uid] = (moment, event.message.strip())
    return {uid: message for uid, (_, message) in newest.items()}
