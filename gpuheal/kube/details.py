"""Fuller projections of Nodes and Pods, and of the PodDisruptionBudgets,
ResourceQuotas and Events around them, for `gpuheal doctor` and the drain of
`gpuheal maintenance`: what the scheduler and the eviction API decide by
(taints against tolerations, node affinity, owners, budgets, quotas, emptyDir
volumes), and the times their sentences quote.

The controller's slim projections (kube/projections.py) keep less, for 40,000
pods at once; these keep what one node's diagnosis reads, under the API's field
names, with times decoded into datetimes. Every field the API may send as null
(a metav1.Time that is zero, a pointer) is declared `| None`; absent lists and
maps decode empty.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

# A container's resources are the same two maps in both projections.
from gpuheal.kube.projections import ClaimStatusJson, Container, PodClaimJson


class OwnerReference(msgspec.Struct):
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class ObjectMeta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    creationTimestamp: dt.datetime | None = None  # noqa: N815 -- API field names
    # The end of the grace period, not the delete request.
    deletionTimestamp: dt.datetime | None = None  # noqa: N815
    finalizers: list[str] = []
    ownerReferences: list[OwnerReference] = []  # noqa: N815


class Taint(msgspec.Struct):
    key: str
    effect: str
    value: str | None = None


class Toleration(msgspec.Struct):
    key: str | None = None
    operator: str | None = None  # Equal (when absent) or Exists
    value: str | None = None
    effect: str | None = None  # every effect when absent


class NodeSpec(msgspec.Struct):
    taints: list[Taint] = []
    unschedulable: bool | None = None


class NodeCondition(msgspec.Struct):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None
    lastTransitionTime: dt.datetime | None = None  # noqa: N815 -- null when zero


class NodeStatus(msgspec.Struct):
    conditions: list[NodeCondition] = []
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}


class Node(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


class SelectorRequirement(msgspec.Struct):
    """One requirement of a node selector term or a label selector: the API's
    NodeSelectorRequirement and LabelSelectorRequirement have these same fields;
    node selectors also allow Gt and Lt (ops/scheduling.py)."""

    key: str
    operator: str
    values: list[str] = []


class NodeSelectorTerm(msgspec.Struct):
    matchExpressions: list[SelectorRequirement] = []  # noqa: N815
    matchFields: list[SelectorRequirement] = []  # noqa: N815


class NodeSelector(msgspec.Struct):
    nodeSelectorTerms: list[NodeSelectorTerm] = []  # noqa: N815


class NodeAffinity(msgspec.Struct):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None  # noqa: N815


class Affinity(msgspec.Struct):
    nodeAffinity: NodeAffinity | None = None  # noqa: N815
    # Not modelled (ops/scheduling.py): only whether the pod has any.
    podAffinity: dict[str, Any] | None = None  # noqa: N815
    podAntiAffinity: dict[str, Any] | None = None  # noqa: N815


class Volume(msgspec.Struct):
    name: str = ""
    # Not modelled: only whether it is one (its data dies with the pod: the drain asks first).
    emptyDir: dict[str, Any] | None = None  # noqa: N815


class PodSpec(msgspec.Struct):
    nodeName: str | None = None  # noqa: N815
    containers: list[Container] = []
    initContainers: list[Container] = []  # noqa: N815
    nodeSelector: dict[str, str] = {}  # noqa: N815
    tolerations: list[Toleration] = []
    affinity: Affinity | None = None
    volumes: list[Volume] = []
    resourceClaims: list[PodClaimJson] = []  # noqa: N815


class Waiting(msgspec.Struct):
    reason: str | None = None


class Terminated(msgspec.Struct):
    reason: str | None = None


class ContainerState(msgspec.Struct):
    waiting: Waiting | None = None
    terminated: Terminated | None = None


class ContainerStatus(msgspec.Struct):
    ready: bool = False
    restartCount: int = 0  # noqa: N815
    state: ContainerState | None = None
    lastState: ContainerState | None = None  # noqa: N815


class PodStatus(msgspec.Struct):
    phase: str | None = None
    containerStatuses: list[ContainerStatus] = []  # noqa: N815
    resourceClaimStatuses: list[ClaimStatusJson] = []  # noqa: N815


class Pod(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class LabelSelector(msgspec.Struct):
    """A metav1.LabelSelector (ops/scheduling.selector_matches)."""

    matchLabels: dict[str, str] = {}  # noqa: N815
    matchExpressions: list[SelectorRequirement] = []  # noqa: N815


class PdbSpec(msgspec.Struct):
    selector: LabelSelector | None = None  # None selects nothing, an empty one everything


class PdbStatus(msgspec.Struct):
    disruptionsAllowed: int = 0  # noqa: N815
    currentHealthy: int = 0  # noqa: N815
    desiredHealthy: int = 0  # noqa: N815
    expectedPods: int = 0  # noqa: N815


class PodDisruptionBudget(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PdbSpec = msgspec.field(default_factory=PdbSpec)
    status: PdbStatus | None = None  # None: not yet observed by its controller


class QuotaStatus(msgspec.Struct):
    hard: dict[str, str] = {}
    used: dict[str, str] = {}


class ResourceQuota(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    status: QuotaStatus | None = None


class InvolvedObject(msgspec.Struct):
    uid: str | None = None


class EventSeries(msgspec.Struct):
    lastObservedTime: dt.datetime | None = None  # noqa: N815


class Event(msgspec.Struct):
    """A core/v1 Event (the scheduler's FailedScheduling): its times are null when zero."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    involvedObject: InvolvedObject = msgspec.field(default_factory=InvolvedObject)  # noqa: N815
    message: str | None = None
    series: EventSeries | None = None
    lastTimestamp: dt.datetime | None = None  # noqa: N815
    eventTime: dt.datetime | None = None  # noqa: N815
    firstTimestamp: dt.datetime | None = None  # noqa: N815
