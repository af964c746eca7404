"""Slim projections: decode API JSON straight into the few fields we keep.

msgspec skips every field a Struct does not declare, so a Pod's hundreds of
fields cost nothing to retain; the views (model.py) are what the caches hold.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from gpuheal.model import (
    ANNOTATION_PREFIX,
    ActionEntry,
    Condition,
    FaultRecord,
    NodeView,
    Phase,
    PodView,
    Severity,
    Taint,
)


class OwnerRef(msgspec.Struct):
    kind: str = ""


class Meta(msgspec.Struct):
    name: str = ""
    creationTimestamp: str = ""  # noqa: N815
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""  # noqa: N815 -- API field name
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    deletionTimestamp: str | None = None  # noqa: N815
    ownerReferences: list[OwnerRef] = []  # noqa: N815


class TaintJson(msgspec.Struct):
    key: str
    effect: str
    value: str = ""
    timeAdded: str | None = None  # noqa: N815


class NodeSpec(msgspec.Struct):
    taints: list[TaintJson] = []
    unschedulable: bool = False


class ConditionJson(msgspec.Struct):
    type: str
    status: str
    reason: str = ""
    message: str = ""
    lastTransitionTime: str = ""  # noqa: N815


class AddressJson(msgspec.Struct):
    address: str = ""
    type: str = ""


class NodeStatus(msgspec.Struct):
    conditions: list[ConditionJson] = []
    capacity: dict[str, str] = {}
    addresses: list[AddressJson] = []


class NodeJson(msgspec.Struct):
    metadata: Meta
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


class Resources(msgspec.Struct):
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}


class Container(msgspec.Struct):
    resources: Resources = msgspec.field(default_factory=Resources)


class PodSpec(msgspec.Struct):
    nodeName: str = ""  # noqa: N815
    containers: list[Container] = []
    initContainers: list[Container] = []  # noqa: N815


class PodStatus(msgspec.Struct):
    phase: str = ""


class PodJson(msgspec.Struct):
    metadata: Meta
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class FaultSpecJson(msgspec.Struct):
    node: str = ""
    faultID: str = ""  # noqa: N815
    reason: str = ""
    severity: str = "P0"
    source: str = ""
    detectedAt: str = ""  # noqa: N815


class ActionJson(msgspec.Struct):
    time: str = ""
    action: str = ""
    result: str = ""
    detail: str = ""


class FaultStatusJson(msgspec.Struct):
    phase: str = ""
    recoveringSince: str = ""  # noqa: N815
    evictedPods: list[str] = []  # noqa: N815
    actions: list[ActionJson] = []


class FaultJson(msgspec.Struct):
    metadata: Meta
    spec: FaultSpecJson = msgspec.field(default_factory=FaultSpecJson)
    status: FaultStatusJson = msgspec.field(default_factory=FaultStatusJson)


def _quantity(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


def node_view(node: NodeJson, gpu_resource: str = "nvidia.com/gpu") -> NodeView:
    meta = node.metadata
    return NodeView(
        name=meta.name,
        resource_version=meta.resourceVersion,
        labels=meta.labels,
        annotations={k: v for k, v in meta.annotations.items() if k.startswith(ANNOTATION_PREFIX)},
        taints=tuple(
            Taint(key=t.key, effect=t.effect, value=t.value, time_added=t.timeAdded)
            for t in node.spec.taints
        ),
        unschedulable=node.spec.unschedulable,
        conditions=tuple(
            Condition(
                type=c.type,
                status=c.status,
                reason=c.reason,
                message=c.message[:1024],
                last_transition_time=c.lastTransitionTime,
            )
            for c in node.status.conditions
        ),
        gpus=_quantity(node.status.capacity.get(gpu_resource, "0")),
        addresses=tuple(a.address for a in node.status.addresses if a.address),
    )


def pod_view_factory(is_gpu_resource: Callable[[str], bool]) -> Callable[[PodJson], PodView]:
    def requests_gpu(container: Container) -> bool:
        wanted = {**container.resources.requests, **container.resources.limits}
        return any(is_gpu_resource(n) and q not in ("0", "") for n, q in wanted.items())

    def view(pod: PodJson) -> PodView:
        meta = pod.metadata
        return PodView(
            namespace=meta.namespace,
            name=meta.name,
            uid=meta.uid,
            node=pod.spec.nodeName,
            phase=pod.status.phase,
            resource_version=meta.resourceVersion,
            gpu=any(requests_gpu(c) for c in (*pod.spec.containers, *pod.spec.initContainers)),
            daemonset=any(o.kind == "DaemonSet" for o in meta.ownerReferences),
            deleting=meta.deletionTimestamp is not None,
        )

    return view


def _phase(value: str) -> Phase:
    try:
        return Phase(value)
    except ValueError:
        return Phase.DETECTED


def _severity(value: str) -> Severity:
    try:
        return Severity(value)
    except ValueError:
        return Severity.P0


def fault_record(fault: FaultJson) -> FaultRecord:
    spec, status = fault.spec, fault.status
    return FaultRecord(
        name=fault.metadata.name,
        node=spec.node,
        fault_id=spec.faultID,
        phase=_phase(status.phase),
        resource_version=fault.metadata.resourceVersion,
        reason=spec.reason,
        severity=_severity(spec.severity),
        source=spec.source,
        detected_at=spec.detectedAt,
        recovering_since=status.recoveringSince,
        evicted_pods=tuple(status.evictedPods),
        actions=tuple(
            ActionEntry(time=a.time, action=a.action, result=a.result, detail=a.detail)
            for a in status.actions
        ),
        created_at=fault.metadata.creationTimestamp,
    )


def decode_node(raw: bytes) -> NodeView:
    return node_view(msgspec.json.decode(raw, type=NodeJson))


def decode_fault(raw: bytes) -> FaultRecord:
    return fault_record(msgspec.json.decode(raw, type=FaultJson))
