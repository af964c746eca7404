"""Domain types shared by every layer. Pure data: no I/O, no Kubernetes client.

Views (NodeView, PodView, FaultRecord) are slim projections of API objects:
only what the policy needs, so tens of thousands fit in a small heap.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

# The GPUFault custom resource (deploy/crds/gpufaults.gpuheal.io.yaml).
GPUFAULT_GROUP = "gpuheal.io"
GPUFAULT_VERSION = "v1alpha1"
GPUFAULT_API_VERSION = f"{GPUFAULT_GROUP}/{GPUFAULT_VERSION}"
GPUFAULT_KIND = "GPUFault"
GPUFAULT_PLURAL = "gpufaults"
# The GPURollout custom resource (deploy/crds/gpurollouts.gpuheal.io.yaml), same group.
GPUROLLOUT_KIND = "GPURollout"
GPUROLLOUT_PLURAL = "gpurollouts"

# The node-annotation contract (who writes and reads each key:
# docs/architecture.md#node-annotations): annotations the agent writes on its Node.
ANNOTATION_PREFIX = "gpuheal.io/"
STATUS = "gpuheal.io/status"
FAULT_ID = "gpuheal.io/fault-id"
FAULT_TIME = "gpuheal.io/fault-time"
FAULT_REASON = "gpuheal.io/fault-reason"
FAULT_DEVICES = "gpuheal.io/fault-devices"
# P0 | P1 | P2: how bad the reported fault is. Absent: P0 (a person's `kubectl
# annotate`, an older agent); any other value is taken as P0 and said (an Event).
FAULT_SEVERITY = "gpuheal.io/fault-severity"
STATUS_FAULTY = "faulty"
# Written by the controller; never deleted on recovery.
HANDLED_FAULT_ID = "gpuheal.io/handled-fault-id"
HANDLED_AT = "gpuheal.io/handled-at"
LAST_PROCESS_TIME = "gpuheal.io/last-process-time"

# Written by the controller for device-level health (comma-separated resourceIDs).
QUARANTINED_DEVICES = "gpuheal.io/quarantined-devices"
SUSPECT_DEVICES = "gpuheal.io/suspect-devices"
UNKNOWN_DEVICES = "gpuheal.io/unknown-devices"
# Canary pods the controller runs before it releases a device.
CANARY_LABEL = "gpuheal.io/canary"
# On a canary pod or a validation Job: the GPUFault it was started for.
RECORD_ANNOTATION = "gpuheal.io/fault-record"

# Facts the agent reports on its Node for the health gate, `status` and `audit`.
DRIVER_VERSION = "gpuheal.io/driver-version"
CUDA_VERSION = "gpuheal.io/cuda-version"
# The GPUs' VBIOS version (nvmlDeviceGetVbiosVersion), or the versions the node's
# GPUs disagree on, comma-separated: the agent's fact, `gpuheal audit`'s vbios-skew.
VBIOS_VERSION = "gpuheal.io/vbios-version"
# Error counters since COUNTERS_SINCE (the agent's start: a reboot resets them).
XID_ERRORS = "gpuheal.io/xid-errors"
ECC_ERRORS = "gpuheal.io/ecc-errors"  # uncorrectable
COUNTERS_SINCE = "gpuheal.io/counters-since"
LAST_GPU_ERROR = "gpuheal.io/last-gpu-error"  # RFC 3339 of the newest Xid or ECC error
# Compute processes on the GPUs: "pid@podUID,..." ("pid@" when the process is in no pod,
# "pid@?" when the agent could not tell: the process exited, or the host's /proc is not visible).
GPU_PROCESSES = "gpuheal.io/gpu-processes"
# The agent's NVML view of MIG: devices per profile ("1g.10gb=56"), or "disabled"
# (gpuheal/policy/sharing.py::layout); the gate compares it with nvidia.com/mig.config.
MIG_LAYOUT = "gpuheal.io/mig-layout"
# What the agent reaches on its node: NVML, the GPUs it sees, the kernel log
# (policy/access.py).
AGENT_ACCESS = "gpuheal.io/agent-access"
# The start-order facts the runbooks check after a reboot, one annotation:
# "modules=ok;persistenced=ok;fabricmanager=n/a;runtimehook=ok" (policy/environment.py).
NODE_ENVIRONMENT = "gpuheal.io/node-environment"
# Its facts, in the order they are written: the driver's kernel modules, the persistence
# daemon, Fabric Manager (NVSwitch systems only), the container runtime's NVIDIA hook.
ENVIRONMENT_FACTS = ("modules", "persistenced", "fabricmanager", "runtimehook")
# A diagnostics run (dcgmi diag, nccl-tests) recorded on the node by whoever ran it:
# JSON {"result": "pass"|"fail", "time": RFC 3339, "tool": str, "detail": str}.
DIAGNOSTICS = "gpuheal.io/diagnostics"

# Written by `gpuheal maintenance` on the Node; removed by `maintenance finish`.
MAINTENANCE_TAINT_KEY = "gpuheal.io/maintenance"
MAINTENANCE_REASON = "gpuheal.io/maintenance-reason"
MAINTENANCE_SINCE = "gpuheal.io/maintenance-since"
# The error counters when maintenance began: JSON {"xid": n, "ecc": n, "since": ts}.
MAINTENANCE_BASELINE = "gpuheal.io/maintenance-baseline"
# "true" when maintenance cordoned the node (finish uncordons only then).
MAINTENANCE_CORDONED = "gpuheal.io/maintenance-cordoned"
# The GPURollout that put the node in maintenance (its name): the breaker counts
# such nodes, a roll-out being many maintenances at once.
MAINTENANCE_ROLLOUT = "gpuheal.io/maintenance-rollout"
# `gpuheal maintenance start|finish` is a request the leader carries out
# (policy/maintenancewire.py has both formats): the request, written by the CLI and
# removed by the controller once done, and the controller's progress and result,
# which the CLI follows.
MAINTENANCE_REQUEST = "gpuheal.io/maintenance-request"
MAINTENANCE_PROGRESS = "gpuheal.io/maintenance-progress"
# On GPU pods: checkpoint now, the pod is about to be moved (RFC 3339 deadline);
# written by `maintenance start` and by the controller's drain (`checkpoint` config).
CHECKPOINT_REQUESTED = "gpuheal.io/checkpoint-requested"
# On GPU pods, written by the workload (or its operator): the checkpoint asked for is
# saved, the pod may be moved now (RFC 3339 time; any value counts).
CHECKPOINT_DONE = "gpuheal.io/checkpoint-done"

# A repair (policy/repairwire.py has the format): the request, written by the controller
# only, and the agent's result, written by the agent only, on the Node.
REPAIR_REQUEST = "gpuheal.io/repair-request"
REPAIR_RESULT = "gpuheal.io/repair-result"

# The idle-node sweep (policy/sweep.py): the node's check, running or last ended
# (JSON, the controller's only; a person removes it to end a failed check's hold),
# and the taint that fences the node while its check runs.
SWEEP = "gpuheal.io/sweep"
SWEEP_TAINT = "gpuheal.io/sweep"

# The autoscalers' "leave this node alone" annotations (Cluster Autoscaler's, and
# Karpenter's from v0.32 and before it), which the controller sets on a node while
# a repair, the gate or a roll-out step is in progress there, and the ones of them
# it set (comma-separated: only those it removes after): policy/disruption.py.
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
DO_NOT_CONSOLIDATE = "karpenter.sh/do-not-consolidate"
DISRUPTION_KEYS = (SCALE_DOWN_DISABLED, DO_NOT_DISRUPT, DO_NOT_CONSOLIDATE)
DISRUPTION_GUARD = "gpuheal.io/disruption-guard"

# gpu-operator's driver upgrade controller (k8s-operator-libs pkg/upgrade): the
# node's upgrade state label, the label that opts a node out of it, and the
# annotation gpu-operator (since v23.3) puts on every GPU node while
# ClusterPolicy spec.driver.upgradePolicy.autoUpgrade is on: policy/operator.py.
DRIVER_UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
DRIVER_UPGRADE_SKIP = "nvidia.com/gpu-driver-upgrade.skip"
DRIVER_UPGRADE_ENABLED = "nvidia.com/gpu-driver-upgrade-enabled"
# Annotations of other systems the caches keep beside gpuheal.io/ ones.
FOREIGN_ANNOTATIONS = frozenset((*DISRUPTION_KEYS, DRIVER_UPGRADE_ENABLED))

TAINT_KEY = "gpuheal.io/gpu-fault"
# On each GPUFault: its node, as a label value (gpuheal.values.node_label).
NODE_LABEL = "gpuheal.io/node"
STATE_LABEL = "gpuheal.io/state"
STATE_MAINTENANCE = "maintenance"
MANAGED_LABEL = "gpuheal.io/managed"
GPU_HEALTHY_CONDITION = "GPUHealthy"


class Severity(StrEnum):
    P0 = "P0"  # act now
    P1 = "P1"  # act, rate limited
    P2 = "P2"  # record and notify

    @classmethod
    def written(cls, value: str) -> Severity:
        """A severity as gpuheal itself wrote it (a record's spec.severity, the agent's
        own annotation before a restart); P0 when there is none, as an absent
        severity is read everywhere. Input from outside goes through gpuheal/sources."""
        try:
            return cls(value)
        except ValueError:
            return cls.P0

    @property
    def rank(self) -> int:
        """0 for the worst: sorting by rank puts the most urgent first."""
        return _SEVERITY_ORDER.index(self)


_SEVERITY_ORDER = (Severity.P0, Severity.P1, Severity.P2)


class Mode(StrEnum):
    OBSERVE = "observe"  # record and notify only
    QUARANTINE = "quarantine"  # taint, no eviction
    FULL = "full"  # taint and evict GPU pods


class Phase(StrEnum):
    DETECTED = "Detected"
    # The plan is recorded and waits for a person's approval (`approval` config).
    AWAITING_APPROVAL = "AwaitingApproval"
    HELD = "Held"
    QUARANTINED = "Quarantined"
    DRAINING = "Draining"
    DRAINED = "Drained"
    RECOVERING = "Recovering"
    CANARY = "Canary"  # a device's canary pod is running
    RESOLVED = "Resolved"
    FAILED = "Failed"


OPEN_PHASES = frozenset(
    {
        Phase.DETECTED,
        Phase.AWAITING_APPROVAL,
        Phase.HELD,
        Phase.QUARANTINED,
        Phase.DRAINING,
        Phase.DRAINED,
        Phase.RECOVERING,
        Phase.CANARY,
    }
)
# Phases in which our taint was placed on the node at some point.
TAINTED_PHASES = frozenset({Phase.QUARANTINED, Phase.DRAINING, Phase.DRAINED, Phase.RECOVERING})


APPROVED = "approved"
REJECTED = "rejected"
DECISIONS = (APPROVED, REJECTED)


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""
    time_added: str | None = None


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""


class _ConditionLike(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def status(self) -> str: ...


def ready(conditions: Iterable[_ConditionLike]) -> bool | None:
    """A node's Ready condition: True, False, or None when it is Unknown or absent.
    Any projection's conditions (NodeView's, kube/details', kube/projections')."""
    for condition in conditions:
        if condition.type == "Ready":
            return {"True": True, "False": False}.get(condition.status)
    return None


# Fleet hygiene's findings that leave a node's GPUs unusable to new pods
# (gpuheal/policy/hygiene.py): the ones `hygiene.signals` may make fault signals.
ZERO_ALLOCATABLE = "zero-allocatable"
ALLOCATABLE_DROP = "allocatable-drop"
DEVICE_PLUGIN_MISSING = "device-plugin-missing"
HYGIENE_SIGNAL_KINDS = (ZERO_ALLOCATABLE, ALLOCATABLE_DROP, DEVICE_PLUGIN_MISSING)


def scheduled_gpus(containers: Iterable[int], init_containers: Iterable[int]) -> int:
    """GPUs the scheduler counts for a pod, from its containers' counts: the larger of
    the containers' sum and the largest init container (they run one at a time, first)."""
    return max(sum(containers), max(init_containers, default=0))


@dataclass(frozen=True, order=True)
class DeviceKey:
    """One device offered through Dynamic Resource Allocation, as a ResourceClaim's
    allocation and a DeviceTaintRule's selector name it."""

    driver: str
    pool: str
    device: str


# The taint effects that keep new claims off a device (None only reports a fact).
FENCING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class DeviceTaint:
    """A taint on a DRA device: its driver's (in the ResourceSlice), or a
    DeviceTaintRule's (gpuheal's fence)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"
    time_added: str = ""  # RFC 3339, as the API server stamped it ("" unknown)


@dataclass(frozen=True)
class DraDevice:
    """One GPU or MIG device a DRA driver offers on a node (its ResourceSlice)."""

    key: DeviceKey
    node: str
    uuid: str  # GPU-… for a whole GPU, MIG-… for a MIG device; "" when unpublished
    kind: str  # gpu | mig | vfio (the driver's `type` attribute)
    parent_uuid: str = ""  # the GPU a MIG device is carved from; "" otherwise
    # The taints on it: the driver's own (in the slice), and gpuheal's fence where the
    # controller joined its DeviceTaintRules in.
    taints: tuple[DeviceTaint, ...] = ()

    @property
    def gpu_uuid(self) -> str:
        """The physical GPU: what an Xid or a reset names."""
        return self.parent_uuid or self.uuid

    @property
    def fencing(self) -> tuple[str, ...]:
        """The keys of the taints that keep new claims off it, sorted."""
        return tuple(sorted({t.key for t in self.taints if t.effect in FENCING_EFFECTS}))

    @property
    def usable(self) -> bool:
        """New claims may be given it: no taint keeps them off."""
        return not self.fencing


@dataclass(frozen=True)
class SliceView:
    """A ResourceSlice of a GPU driver bound to one node: its pool and GPU devices."""

    name: str
    driver: str
    pool: str
    generation: int
    node: str
    devices: tuple[DraDevice, ...] = ()


@dataclass(frozen=True)
class ClaimView:
    """A ResourceClaim: the GPU devices the scheduler allocated to it (none before)."""

    namespace: str
    name: str
    allocated: tuple[DeviceKey, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class FenceView:
    """One of gpuheal's DeviceTaintRules: the fence of one device for one fault."""

    name: str
    node: str  # the node the device is on (its annotation)
    record: str  # the GPUFault record it fences for
    device: DeviceKey
    effect: str


@dataclass(frozen=True)
class NodeView:
    name: str
    resource_version: str
    uid: str = ""  # metadata.uid: Events name it, so `kubectl describe node` finds them
    labels: dict[str, str] = field(default_factory=dict)
    # Only gpuheal.io/* annotations are kept, and FOREIGN_ANNOTATIONS.
    annotations: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    conditions: tuple[Condition, ...] = ()
    # status.capacity of the GPU resource (nvidia.com/gpu): whole GPUs, or their
    # replicas when shared; every GPU count people see is Config.gpu_count(capacity).
    gpus: int = 0
    addresses: tuple[str, ...] = ()  # status.addresses (InternalIP, Hostname, ...)
    # status.allocatable of the extended resources (nvidia.com/gpu, MIG profiles, ...),
    # sorted by name: the health gate's GPU count.
    allocatable: tuple[tuple[str, int], ...] = ()
    # status.capacity of the same: whether it is a GPU node at all (a MIG-only node
    # of the mixed strategy has no nvidia.com/gpu).
    capacity: tuple[tuple[str, int], ...] = ()
    provider_id: str = ""  # spec.providerID: the cloud's name of the machine (replace)
    # Its GPUs offered through DRA (the ResourceSlices of the configured drivers),
    # sorted by key: joined to the Node by the controller's DRA index (controller/dra.py).
    devices: tuple[DraDevice, ...] = ()
    # status.nodeInfo.bootID: a new one means the machine booted again (the sweep's
    # failed check holds until then).
    boot_id: str = ""

    def taint(self, key: str = TAINT_KEY) -> Taint | None:
        return next((t for t in self.taints if t.key == key), None)

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def ready(self) -> bool | None:
        return ready(self.conditions)


class DeviceHealth(StrEnum):
    """Pod status allocatedResourcesStatus[].resources[].health (KEP 4680)."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class DeviceReport:
    """One device allocated to a pod and its health, as the kubelet reports it."""

    resource: str  # resource name (nvidia.com/gpu) or a DRA claim ("claim:<name>/<request>")
    device_id: str  # resourceID
    health: DeviceHealth
    message: str = ""


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    uid: str
    node: str
    phase: str
    resource_version: str = ""
    gpu: bool = False  # any container or init container requests a GPU resource
    # GPUs the scheduler counts for it (scheduled_gpus): the console's allocated GPUs
    # per pool, the audit's GPUs held.
    gpu_count: int = 0
    daemonset: bool = False
    deleting: bool = False
    # metadata.deletionTimestamp (the end of its grace period), RFC 3339, and its
    # finalizers: what the audit says of a pod stuck Terminating.
    deletion_time: str = ""
    finalizers: tuple[str, ...] = ()
    canary: bool = False  # one of our canary pods
    devices: tuple[DeviceReport, ...] = ()
    # The latest timestamp in the pod's status (conditions, container states), RFC 3339.
    status_time: str = ""
    ready: bool = False  # the pod's Ready condition is True
    # Matches healthGate.devicePluginSelector (and namespaces): the node's device plugin.
    device_plugin: bool = False
    # Its CHECKPOINT_REQUESTED and CHECKPOINT_DONE annotations ("": absent).
    checkpoint_requested: str = ""
    checkpoint_done: str = ""
    # Its controller (the ownerReference marked controller), "Kind/name", or "":
    # what recreates it once evicted (the console's "where the moved pods went").
    owner: str = ""
    created_at: str = ""  # metadata.creationTimestamp, RFC 3339
    # The ResourceClaims it uses, by name (spec, or generated from a template), and
    # the GPU devices they were allocated, joined by the controller's DRA index: a pod
    # holding one is a GPU pod (gpu, gpu_count count them).
    claims: tuple[str, ...] = ()
    held: tuple[DraDevice, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class EventView:
    """One of gpuheal's own Events (events.k8s.io/v1), as the console shows it."""

    key: str  # namespace/name
    time: str  # eventTime, RFC 3339
    reason: str
    note: str
    type: str  # Normal or Warning
    action: str
    instance: str  # the replica that sent it (reportingInstance)
    regarding: tuple[str, str]  # (kind, name) of the object it is about
    related: tuple[str, str] | None = None


@dataclass(frozen=True)
class CanaryView:
    """One of our canary pods (CANARY_LABEL), finished ones included."""

    name: str
    node: str
    phase: str


@dataclass(frozen=True)
class FaultSignal:
    """What a source says about a node now."""

    node: str
    fault_id: str
    reason: str
    source: str
    severity: Severity = Severity.P0
    detected_at: str = ""
    devices: tuple[str, ...] = ()
    # What the source reported that could not be carried as is (the fields, e.g.
    # "fault-id"): the fault is acted on under the normalized values and this is
    # said once, when its record is created.
    altered: tuple[str, ...] = ()


@dataclass(frozen=True)
class ActionEntry:
    time: str
    action: str
    result: str
    detail: str = ""


@dataclass(frozen=True)
class RepairApproval:
    """status.repairApproval: the controller's question (which attempt of which repair
    awaits a person, since when) and, once given, the person's answer."""

    attempt: int
    action: str
    since: str
    decision: str = ""  # "approved" or "rejected"; empty while unanswered
    by: str = ""
    at: str = ""


@dataclass(frozen=True)
class FaultRecord:
    """Projection of one GPUFault object."""

    name: str
    node: str
    fault_id: str
    phase: Phase
    resource_version: str = ""
    reason: str = ""
    severity: Severity = Severity.P0
    source: str = ""
    detected_at: str = ""
    recovering_since: str = ""
    evicted_pods: tuple[str, ...] = ()
    actions: tuple[ActionEntry, ...] = ()
    created_at: str = ""
    # Device scope (empty resource and device for a node-scope record).
    scope: str = "node"
    resource: str = ""
    device: str = ""
    expiry: str = ""  # a device quarantine's end: a canary is tried after it
    contact_support: bool = False
    # A person's answer to an AwaitingApproval plan (status.approval): "approved" or
    # "rejected", who gave it and when; empty until then.
    decision: str = ""
    decided_by: str = ""
    decided_at: str = ""
    # A person's release of a Held fault ahead of the breaker (status.release): who
    # and when; empty until then. The plan lets that one fault past the breaker once.
    released_by: str = ""
    released_at: str = ""
    # status.plan.evict: the GPU pods its plan (approval, observe) would evict.
    plan_evict: tuple[str, ...] = ()
    # status.repairApproval: a repair attempt that awaits (or got) a person's answer.
    repair_approval: RepairApproval | None = None
    uid: str = ""  # metadata.uid: Events name it, so `kubectl describe gpufault` finds them
    # spec.supersedes: the fault ids this one replaced on the node when it was first
    # seen (its open records', our taint's); a report of one of them again is stale.
    supersedes: tuple[str, ...] = ()

    @property
    def device_scope(self) -> bool:
        return self.scope == "device"

    @property
    def open(self) -> bool:
        return self.phase in OPEN_PHASES


_NAME_UNSAFE = re.compile(r"[^a-z0-9.-]+")


def fault_record_name(node: str, fault_id: str, device: str = "") -> str:
    """Deterministic GPUFault name: creating it is the cross-replica lock
    (docs/architecture.md#exactly-once).

    Readable prefix (the node), a hash of the full identity so any fault id
    (any characters, any length) maps to one valid DNS-1123 name.
    """
    digest = hashlib.sha256(f"{node}\x00{fault_id}\x00{device}".encode()).hexdigest()[:12]
    # A cut that ends in a dot would put `.-` before the digest: no valid name (a
    # node name of over 200 characters with a dot at the 200th). Only such names,
    # never created, change here; every name that was valid stays as it was.
    prefix = _NAME_UNSAFE.sub("-", node.lower()).strip("-.")[:200].rstrip(".") or "node"
    return f"{prefix}-{digest}"
