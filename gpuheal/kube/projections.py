"""Slim projections: decode API JSON straight into the few fields we keep.

msgspec skips every field a Struct does not declare, so a Pod's hundreds of
fields cost nothing to retain; the views (model.py) are what the caches hold.

Every field the API may send as null is declared `| None` and read as "" (or
empty): a metav1.Time is serialized as null when it is zero (a condition
written without lastTransitionTime), and the GPUFault CRD declares
status.recoveringSince and status.expiry nullable. Nulls of the CRD's other
fields never arrive: the API server prunes them (they are not nullable).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

import msgspec

from gpuheal.model import (
    ANNOTATION_PREFIX,
    CANARY_LABEL,
    CHECKPOINT_DONE,
    CHECKPOINT_REQUESTED,
    DECISIONS,
    FOREIGN_ANNOTATIONS,
    ActionEntry,
    CanaryView,
    ClaimView,
    Condition,
    DeviceHealth,
    DeviceKey,
    DeviceReport,
    DeviceTaint,
    FaultRecord,
    FenceView,
    NodeView,
    Phase,
    PodView,
    RepairApproval,
    Severity,
    SliceView,
    Taint,
    scheduled_gpus,
)
from gpuheal.policy.dra import GPU_DRIVERS, gpu_device
from gpuheal.policy.fence import NODE_ANNOTATION, record_of


class OwnerRef(msgspec.Struct):
    kind: str = ""
    name: str = ""
    controller: bool = False


class Meta(msgspec.Struct):
    name: str = ""
    creationTimestamp: str | None = None  # noqa: N815 -- a metav1.Time: null when zero
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""  # noqa: N815 -- API field name
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    deletionTimestamp: str | None = None  # noqa: N815
    ownerReferences: list[OwnerRef] = []  # noqa: N815
    finalizers: list[str] = []  # what keeps a deleted object (the CLI's audit names them)


class TaintJson(msgspec.Struct):
    key: str
    effect: str
    value: str = ""
    timeAdded: str | None = None  # noqa: N815


class NodeSpec(msgspec.Struct):
    taints: list[TaintJson] = []
    unschedulable: bool = False
    providerID: str = ""  # noqa: N815 -- API field name


class ConditionJson(msgspec.Struct):
    type: str
    status: str
    reason: str = ""
    message: str = ""
    lastTransitionTime: str | None = None  # noqa: N815 -- a metav1.Time: null when zero


class AddressJson(msgspec.Struct):
    address: str = ""
    type: str = ""


class NodeInfoJson(msgspec.Struct):
    bootID: str = ""  # noqa: N815 -- API field name


class NodeStatus(msgspec.Struct):
    nodeInfo: NodeInfoJson = msgspec.field(default_factory=NodeInfoJson)  # noqa: N815
    conditions: list[ConditionJson] = []
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}
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


class PodClaimJson(msgspec.Struct):
    """spec.resourceClaims[]: a claim by name, or made from a template."""

    name: str = ""
    resourceClaimName: str | None = None  # noqa: N815
    resourceClaimTemplateName: str | None = None  # noqa: N815


class PodSpec(msgspec.Struct):
    nodeName: str = ""  # noqa: N815
    containers: list[Container] = []
    initContainers: list[Container] = []  # noqa: N815
    resourceClaims: list[PodClaimJson] | None = None  # noqa: N815


class ResourceHealthJson(msgspec.Struct):
    resourceID: str = ""  # noqa: N815
    health: str = ""
    message: str | None = None


class ResourceStatusJson(msgspec.Struct):
    """allocatedResourcesStatus[]: a resource name (or DRA claim) and its devices."""

    name: str = ""
    resources: list[ResourceHealthJson] | None = None


class StateTimes(msgspec.Struct):
    startedAt: str | None = None  # noqa: N815
    finishedAt: str | None = None  # noqa: N815


class ContainerState(msgspec.Struct):
    running: StateTimes | None = None
    terminated: StateTimes | None = None


class ContainerStatusJson(msgspec.Struct):
    state: ContainerState | None = None
    allocatedResourcesStatus: list[ResourceStatusJson] | None = None  # noqa: N815


class PodConditionJson(msgspec.Struct):
    type: str = ""
    status: str = ""
    lastTransitionTime: str | None = None  # noqa: N815
    lastProbeTime: str | None = None  # noqa: N815


class ClaimStatusJson(msgspec.Struct):
    """status.resourceClaimStatuses[]: the claim made for a template entry."""

    name: str = ""
    resourceClaimName: str | None = None  # noqa: N815


class PodStatus(msgspec.Struct):
    phase: str = ""
    resourceClaimStatuses: list[ClaimStatusJson] | None = None  # noqa: N815
    conditions: list[PodConditionJson] | None = None
    containerStatuses: list[ContainerStatusJson] | None = None  # noqa: N815
    initContainerStatuses: list[ContainerStatusJson] | None = None  # noqa: N815
    # Pod-level: devices of DRA claims.
    allocatedResourcesStatus: list[ResourceStatusJson] | None = None  # noqa: N815


class PodJson(msgspec.Struct):
    metadata: Meta
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class FaultSpecJson(msgspec.Struct):
    node: str = ""
    faultID: str = ""  # noqa: N815
    scope: str = "node"
    resourceName: str = ""  # noqa: N815
    resourceID: str = ""  # noqa: N815
    expiry: str = ""
    reason: str = ""
    severity: str = "P0"
    source: str = ""
    detectedAt: str = ""  # noqa: N815
    supersedes: list[str] = msgspec.field(default_factory=list)


class ActionJson(msgspec.Struct):
    time: str = ""
    action: str = ""
    result: str = ""
    detail: str = ""


class ApprovalJson(msgspec.Struct):
    decision: str = ""
    by: str = ""
    at: str = ""


class RepairApprovalJson(msgspec.Struct):
    attempt: int = 0
    action: str = ""
    since: str = ""
    decision: str = ""
    by: str = ""
    at: str = ""


class ReleaseJson(msgspec.Struct):
    by: str = ""
    at: str = ""


class PlanJson(msgspec.Struct):
    evict: list[str] = []


class FaultStatusJson(msgspec.Struct):
    phase: str = ""
    recoveringSince: str | None = None  # noqa: N815 -- nullable in the CRD
    evictedPods: list[str] = []  # noqa: N815
    actions: list[ActionJson] = []
    expiry: str | None = None
    contactSupport: bool = False  # noqa: N815
    approval: ApprovalJson | None = None
    release: ReleaseJson | None = None
    plan: PlanJson | None = None
    repairApproval: RepairApprovalJson | None = None  # noqa: N815


class FaultJson(msgspec.Struct):
    metadata: Meta
    spec: FaultSpecJson = msgspec.field(default_factory=FaultSpecJson)
    status: FaultStatusJson = msgspec.field(default_factory=FaultStatusJson)


def quantity(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


def node_view(node: NodeJson, gpu_resource: str = "nvidia.com/gpu") -> NodeView:
    meta = node.metadata
    return NodeView(
        name=meta.name,
        resource_version=meta.resourceVersion,
        uid=meta.uid,
        labels=meta.labels,
        annotations={
            k: v
            for k, v in meta.annotations.items()
            if k.startswith(ANNOTATION_PREFIX) or k in FOREIGN_ANNOTATIONS
        },
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
                last_transition_time=c.lastTransitionTime or "",
            )
            for c in node.status.conditions
        ),
        gpus=quantity(node.status.capacity.get(gpu_resource, "0")),
        addresses=tuple(a.address for a in node.status.addresses if a.address),
        # Extended resources only (a domain in the name): a handful, not cpu/memory/pods.
        allocatable=_extended(node.status.allocatable),
        capacity=_extended(node.status.capacity),
        provider_id=node.spec.providerID,
        boot_id=node.status.nodeInfo.bootID,
    )


def _extended(resources: Mapping[str, str]) -> tuple[tuple[str, int], ...]:
    """Extended resources only (a domain in the name): a handful, not cpu/memory/pods."""
    return tuple(sorted((k, quantity(v)) for k, v in resources.items() if "/" in k))


def device_plugin_matcher(
    selector: Mapping[str, str], namespaces: Collection[str] = ()
) -> Callable[[str, Mapping[str, str]], bool]:
    """Is a pod (namespace, labels) the node's GPU device plugin (healthGate config)?"""
    wanted = dict(selector)

    def matches(namespace: str, labels: Mapping[str, str]) -> bool:
        if not wanted or (namespaces and namespace not in namespaces):
            return False
        return all(labels.get(k) == v for k, v in wanted.items())

    return matches


def pod_view_factory(
    is_gpu_resource: Callable[[str], bool],
    is_device_plugin: Callable[[str, Mapping[str, str]], bool] = lambda _ns, _labels: False,
    gpu_drivers: frozenset[str] = GPU_DRIVERS,
) -> Callable[[PodJson], PodView]:
    def requests_gpu(container: Container) -> bool:
        wanted = {**container.resources.requests, **container.resources.limits}
        return any(is_gpu_resource(n) and q not in ("0", "") for n, q in wanted.items())

    def gpus_requested(container: Container) -> int:
        wanted = {**container.resources.limits, **container.resources.requests}
        return sum(quantity(q) for n, q in wanted.items() if is_gpu_resource(n))

    def view(pod: PodJson) -> PodView:
        meta = pod.metadata
        status = pod.status
        return PodView(
            namespace=meta.namespace,
            name=meta.name,
            uid=meta.uid,
            node=pod.spec.nodeName,
            phase=pod.status.phase,
            resource_version=meta.resourceVersion,
            gpu=any(requests_gpu(c) for c in (*pod.spec.containers, *pod.spec.initContainers)),
            gpu_count=scheduled_gpus(
                (gpus_requested(c) for c in pod.spec.containers),
                (gpus_requested(c) for c in pod.spec.initContainers),
            ),
            daemonset=any(o.kind == "DaemonSet" for o in meta.ownerReferences),
            deleting=meta.deletionTimestamp is not None,
            deletion_time=meta.deletionTimestamp or "",
            finalizers=tuple(meta.finalizers),
            canary=meta.labels.get(CANARY_LABEL) == "true",
            devices=_devices(status, is_gpu_resource, gpu_drivers),
            status_time=_status_time(status),
            ready=any(c.type == "Ready" and c.status == "True" for c in status.conditions or ()),
            device_plugin=is_device_plugin(meta.namespace, meta.labels),
            checkpoint_requested=meta.annotations.get(CHECKPOINT_REQUESTED, ""),
            checkpoint_done=meta.annotations.get(CHECKPOINT_DONE, ""),
            owner=next((f"{o.kind}/{o.name}" for o in meta.ownerReferences if o.controller), ""),
            created_at=meta.creationTimestamp or "",
            claims=pod_claims(pod),
        )

    return view


def pod_claims(pod: PodJson) -> tuple[str, ...]:
    """The ResourceClaims the pod uses, by name (claim_names)."""
    return claim_names(pod.spec.resourceClaims, pod.status.resourceClaimStatuses)


def claim_names(
    claims: Iterable[PodClaimJson] | None, statuses: Iterable[ClaimStatusJson] | None
) -> tuple[str, ...]:
    """A pod's ResourceClaims by name, from its spec's `resourceClaims` and its status'
    `resourceClaimStatuses`: named in the spec, or generated from a template (the name
    the control plane chose is in the status)."""
    generated = {s.name: s.resourceClaimName for s in statuses or ()}
    names = (c.resourceClaimName or generated.get(c.name) for c in claims or ())
    return tuple(n for n in names if n)


def _health(value: str) -> DeviceHealth:
    try:
        return DeviceHealth(value)
    except ValueError:
        return DeviceHealth.UNKNOWN  # an unknown word is not a verdict


def _devices(
    status: PodStatus, is_gpu_resource: Callable[[str], bool], gpu_drivers: frozenset[str]
) -> tuple[DeviceReport, ...]:
    """Every GPU the kubelet reports for the pod: containers' GPU resources, and the
    devices of DRA claims (containers' and pod-level "claim:<claim>[/<request>]"
    entries) of a GPU driver, each named by its driver and "driver/pool/device"
    (the kubelet's resourceID): one card is one device whichever claim holds it."""
    containers = (*(status.containerStatuses or ()), *(status.initContainerStatuses or ()))
    lists = [
        s
        for c in containers
        for s in c.allocatedResourcesStatus or ()
        if is_gpu_resource(s.name) or s.name.startswith(CLAIM_PREFIX)
    ]
    lists += status.allocatedResourcesStatus or ()
    if not lists:
        return ()
    seen: dict[tuple[str, str], DeviceReport] = {}
    for s in lists:
        for r in s.resources or ():
            resource = _resource(s.name, r.resourceID, gpu_drivers)
            if not r.resourceID or not resource:
                continue
            device = physical_device(r.resourceID)
            report = DeviceReport(resource, device, _health(r.health), r.message or "")
            # A GPU shared by replicas (or claims) is reported once per replica: the
            # GPU is what is healthy or not, and its worst report stands.
            held = seen.get((resource, device))
            if held is None or _WORSE[report.health] > _WORSE[held.health]:
                seen[(resource, device)] = report
    return tuple(seen[k] for k in sorted(seen))


CLAIM_PREFIX = "claim:"


def _resource(name: str, resource_id: str, gpu_drivers: frozenset[str]) -> str:
    """The resource a reported device is counted under: its extended resource, or for
    a DRA claim's device the driver ("" when it is not a GPU driver's)."""
    if not name.startswith(CLAIM_PREFIX):
        return name
    driver, sep, _ = resource_id.partition("/")
    return driver if sep and driver in gpu_drivers else ""


_WORSE = {DeviceHealth.HEALTHY: 0, DeviceHealth.UNKNOWN: 1, DeviceHealth.UNHEALTHY: 2}


def physical_device(resource_id: str) -> str:
    """The GPU behind a device plugin's ID: a time-sliced or MPS replica is
    `<device id>::<replica>` (NVIDIA/k8s-device-plugin, rm.AnnotatedID)."""
    return resource_id.split("::", 1)[0]


def _status_time(status: PodStatus) -> str:
    """The latest timestamp in the pod's status: the age of its device reports starts
    no earlier than this (RFC 3339 strings of one format sort as times)."""
    times = [
        t for c in status.conditions or () for t in (c.lastTransitionTime, c.lastProbeTime) if t
    ]
    for container in (*(status.containerStatuses or ()), *(status.initContainerStatuses or ())):
        state = container.state
        for part in (state.running, state.terminated) if state else ():
            if part is not None:
                times += [t for t in (part.startedAt, part.finishedAt) if t]
    return max(times, default="")


def canary_view(pod: PodJson) -> CanaryView:
    return CanaryView(name=pod.metadata.name, node=pod.spec.nodeName, phase=pod.status.phase)


def _phase(value: str) -> Phase:
    try:
        return Phase(value)
    except ValueError:
        return Phase.DETECTED


def fault_record(fault: FaultJson) -> FaultRecord:
    spec, status = fault.spec, fault.status
    return FaultRecord(
        name=fault.metadata.name,
        node=spec.node,
        fault_id=spec.faultID,
        phase=_phase(status.phase),
        resource_version=fault.metadata.resourceVersion,
        reason=spec.reason,
        severity=Severity.written(spec.severity),
        source=spec.source,
        detected_at=spec.detectedAt,
        recovering_since=status.recoveringSince or "",
        evicted_pods=tuple(status.evictedPods),
        actions=tuple(
            ActionEntry(time=a.time, action=a.action, result=a.result, detail=a.detail)
            for a in status.actions
        ),
        created_at=fault.metadata.creationTimestamp or "",
        scope=spec.scope or "node",
        resource=spec.resourceName,
        device=spec.resourceID,
        expiry=status.expiry or spec.expiry,
        contact_support=status.contactSupport,
        plan_evict=tuple(status.plan.evict) if status.plan else (),
        **_approval(status.approval),
        released_by=status.release.by if status.release else "",
        released_at=status.release.at if status.release else "",
        repair_approval=_repair_approval(status.repairApproval),
        uid=fault.metadata.uid,
        supersedes=tuple(spec.supersedes),
    )


def _repair_approval(asked: RepairApprovalJson | None) -> RepairApproval | None:
    """The question and its answer; an answer that is no decision is no answer."""
    if asked is None or asked.attempt < 1:
        return None
    if asked.decision not in DECISIONS:
        return RepairApproval(asked.attempt, asked.action, asked.since)
    return RepairApproval(
        asked.attempt, asked.action, asked.since, asked.decision, asked.by, asked.at
    )


def _approval(approval: ApprovalJson | None) -> dict[str, str]:
    if approval is None or approval.decision not in DECISIONS:
        return {}
    return {"decision": approval.decision, "decided_by": approval.by, "decided_at": approval.at}


class AttributeJson(msgspec.Struct):
    """A device attribute: one typed value; gpuheal reads the strings (type, uuid)."""

    string: str | None = None


class DeviceTaintJson(msgspec.Struct):
    key: str = ""
    value: str | None = None
    effect: str = ""
    timeAdded: str | None = None  # noqa: N815


class SliceDeviceJson(msgspec.Struct):
    name: str = ""
    attributes: dict[str, AttributeJson] | None = None
    taints: list[DeviceTaintJson] | None = None


class SlicePoolJson(msgspec.Struct):
    name: str = ""
    generation: int = 0


class SliceSpecJson(msgspec.Struct):
    driver: str = ""
    nodeName: str | None = None  # noqa: N815
    pool: SlicePoolJson = msgspec.field(default_factory=SlicePoolJson)
    devices: list[SliceDeviceJson] | None = None


class SliceJson(msgspec.Struct):
    """A ResourceSlice: its pool and its devices' string attributes and taints
    (capacities, counters and the rest are skipped in decoding)."""

    metadata: Meta
    spec: SliceSpecJson = msgspec.field(default_factory=SliceSpecJson)


class ResultJson(msgspec.Struct):
    driver: str = ""
    pool: str = ""
    device: str = ""


class AllocatedJson(msgspec.Struct):
    results: list[ResultJson] | None = None


class AllocationJson(msgspec.Struct):
    devices: AllocatedJson | None = None


class ResourceClaimStatusJson(msgspec.Struct):
    allocation: AllocationJson | None = None


class ClaimJson(msgspec.Struct):
    metadata: Meta
    status: ResourceClaimStatusJson | None = None


def slice_view_factory(drivers: frozenset[str]) -> Callable[[SliceJson], SliceView]:
    """A slice of another driver, or bound to no node, is kept with no devices: the
    informer's store holds every slice, and only GPU slices count."""

    def view(item: SliceJson) -> SliceView:
        spec, name = item.spec, item.metadata.name
        node = spec.nodeName or ""
        if spec.driver not in drivers or not node:
            return SliceView(name, "", "", 0, "")
        found = (
            gpu_device(
                DeviceKey(spec.driver, spec.pool.name, d.name),
                node,
                {k: v.string for k, v in (d.attributes or {}).items() if v.string is not None},
                tuple(
                    DeviceTaint(t.key, t.value or "", t.effect, t.timeAdded or "")
                    for t in d.taints or ()
                ),
            )
            for d in spec.devices or ()
        )
        devices = tuple(d for d in found if d is not None)
        return SliceView(name, spec.driver, spec.pool.name, spec.pool.generation, node, devices)

    return view


def claim_view_factory(drivers: frozenset[str]) -> Callable[[ClaimJson], ClaimView]:
    def view(item: ClaimJson) -> ClaimView:
        meta = item.metadata
        allocation = item.status.allocation if item.status else None
        results = allocation.devices.results if allocation and allocation.devices else None
        keys = tuple(
            DeviceKey(r.driver, r.pool, r.device) for r in results or () if r.driver in drivers
        )
        return ClaimView(meta.namespace, meta.name, keys)

    return view


class RuleSelectorJson(msgspec.Struct):
    driver: str = ""
    pool: str = ""
    device: str = ""


class RuleTaintJson(msgspec.Struct):
    key: str = ""
    effect: str = ""


class RuleSpecJson(msgspec.Struct):
    deviceSelector: RuleSelectorJson | None = None  # noqa: N815
    taint: RuleTaintJson = msgspec.field(default_factory=RuleTaintJson)


class RuleJson(msgspec.Struct):
    """One of gpuheal's DeviceTaintRules (its label selects them)."""

    metadata: Meta
    spec: RuleSpecJson = msgspec.field(default_factory=RuleSpecJson)


def fence_view(rule: RuleJson) -> FenceView:
    meta, selector = rule.metadata, rule.spec.deviceSelector or RuleSelectorJson()
    return FenceView(
        name=meta.name,
        node=meta.annotations.get(NODE_ANNOTATION, ""),
        record=record_of(meta.name, rule.spec.taint.key),
        device=DeviceKey(selector.driver, selector.pool, selector.device),
        effect=rule.spec.taint.effect,
    )


def decode_fence(raw: bytes) -> FenceView:
    return fence_view(msgspec.json.decode(raw, type=RuleJson))


class _Object(msgspec.Struct):
    metadata: Meta


def decode_meta(raw: bytes) -> Meta:
    """Any object's metadata (its annotations, resourceVersion, UID)."""
    return msgspec.json.decode(raw, type=_Object).metadata


def decode_node(raw: bytes) -> NodeView:
    return node_view(msgspec.json.decode(raw, type=NodeJson))


def decode_fault(raw: bytes) -> FaultRecord:
    return fault_record(msgspec.json.decode(raw, type=FaultJson))
