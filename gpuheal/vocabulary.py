"""The fault record's vocabulary, defined once: the names of its action entries
(`status.actions[].action`), the reasons of the Events gpuheal sends, and how
people say each entry.

These words are a contract: they are written into GPUFault records and Events
that outlive a release, read back by the policy (what was already done), by the
notifications, the CLI's history and the console. Each is a StrEnum, so a value
read back from the API server (a plain string) compares equal to its member,
and a member is written as its value.

It sits below the policy and the sources (the device-escalation source reads an
entry of the device plan), beside the model: it imports nothing of gpuheal.
"""

from __future__ import annotations

from enum import StrEnum


class Entry(StrEnum):
    """An action entry of a GPUFault record: one step done (or decided) about the
    fault, in order, the record's audit trail (gpuheal/policy/history.py keeps it
    bounded). A repair, validation or replacement entry's detail names its attempt
    first ("reset-gpu attempt 2: ...")."""

    # A fault's way through the node (gpuheal/policy/plan/).
    DETECT = "detect"
    TAINT = "taint"
    EVICT = "evict"
    DRAIN = "drain"
    HOLD = "hold"  # the breaker is full: Held
    RELEASED = "released"  # a person released a Held record (or a repeat offender's)
    REPEAT_OFFENDER = "repeat-offender"  # its node's faults recur: contact support
    HELD_FOR_A_PERSON = "held-for-a-person"  # a repeat offender's node stays out
    SUPERSEDED = "superseded"  # a newer fault of the node took over
    NODE_DELETED = "node-deleted"
    MANUAL_UNTAINT = "manual-untaint"  # a person removed our taint: respected
    FAULT_RETURNED = "fault-returned"  # reported again while recovering
    RECOVERING = "recovering"
    UNTAINT = "untaint"
    RECOVERED = "recovered"  # cleared before anything was done on the node
    GATE_FAILED = "gate-failed"
    # The fault is handled one level up from here on: on a node record, a watched
    # P1 fault as P0; on a device record, the device fault as its node's fault.
    ESCALATE = "escalate"
    # Approval mode and observe mode.
    AWAITING_APPROVAL = "awaiting-approval"
    APPROVED = "approved"
    REJECTED = "rejected"
    APPROVAL_EXPIRED = "approval-expired"
    WOULD_QUARANTINE = "would-quarantine"
    ACKNOWLEDGED = "acknowledged"  # a person said they are on it (API, console)
    # Checkpoint before eviction: the request, then per pod why it was evicted.
    CHECKPOINT_REQUESTED = "checkpoint-requested"
    CHECKPOINTED = "checkpointed"
    CHECKPOINT_TIMEOUT = "checkpoint-timeout"
    # Device faults (gpuheal/policy/devices.py); detect, escalate, drain, evict,
    # recovering and fault-returned as above.
    EXTEND = "extend"  # still Unhealthy: the device's quarantine extended
    CANARY_START = "canary-start"
    CANARY_PASSED = "canary-passed"
    CANARY_FAILED = "canary-failed"
    RELEASE = "release"  # the device returned
    FENCE = "fence"  # a DRA device's DeviceTaintRule is in place (its name the detail)
    # Repairs (gpuheal/policy/repair.py).
    REPAIR_REQUESTED = "repair-requested"
    REPAIRED = "repaired"
    REPAIR_FAILED = "repair-failed"
    WOULD_REPAIR = "would-repair"
    REPAIR_HELD = "repair-held"  # the repair budget is full: waits
    REPAIR_EXHAUSTED = "repair-exhausted"  # contact support: the node stays held
    REPAIR_AWAITING_APPROVAL = "repair-awaiting-approval"
    REPAIR_APPROVED = "repair-approved"
    REPAIR_REJECTED = "repair-rejected"
    REPAIR_APPROVAL_EXPIRED = "repair-approval-expired"
    # Node replacement through the provider's hook (gpuheal/policy/replace.py).
    REPLACE_REQUESTED = "replace-requested"  # the intent, written before the call
    REPLACE_ACCEPTED = "replace-accepted"
    REPLACE_FAILED = "replace-failed"
    # The health gate's validation Job (gpuheal/policy/validation.py).
    VALIDATION_START = "validation-start"
    VALIDATION_PASSED = "validation-passed"
    VALIDATION_FAILED = "validation-failed"
    # Entries dropped from a full history, counted (gpuheal/policy/history.py).
    ELIDED = "elided"


# Each entry as people say it (notifications, `gpuheal doctor`'s history, the
# console): one phrase per entry, read by every consumer.
SAID: dict[Entry, str] = {
    Entry.DETECT: "detected",
    Entry.TAINT: "tainted",
    Entry.EVICT: "GPU pods evicted",
    Entry.DRAIN: "drained",
    Entry.HOLD: "held by the blast-radius breaker",
    Entry.RELEASED: "released from the breaker's hold",
    Entry.REPEAT_OFFENDER: "repeat offender: contact support",
    Entry.HELD_FOR_A_PERSON: "cleared, held out until a person releases it",
    Entry.SUPERSEDED: "superseded by a newer fault",
    Entry.NODE_DELETED: "node deleted, record closed",
    Entry.MANUAL_UNTAINT: "taint removed by hand (respected)",
    Entry.FAULT_RETURNED: "fault returned",
    Entry.RECOVERING: "recovering",
    Entry.UNTAINT: "untainted",
    Entry.RECOVERED: "cleared before quarantine",
    Entry.GATE_FAILED: "health gate failed, stays tainted",
    Entry.ESCALATE: "escalated",
    Entry.AWAITING_APPROVAL: "awaiting approval",
    Entry.APPROVED: "plan approved",
    Entry.REJECTED: "plan rejected, nothing done",
    Entry.APPROVAL_EXPIRED: "approval expired, nothing done",
    Entry.WOULD_QUARANTINE: "observed (would have quarantined)",
    Entry.ACKNOWLEDGED: "acknowledged",
    Entry.CHECKPOINT_REQUESTED: "GPU pods asked to checkpoint",
    Entry.CHECKPOINTED: "checkpoint done",
    Entry.CHECKPOINT_TIMEOUT: "checkpoint timed out",
    Entry.EXTEND: "quarantine extended",
    Entry.CANARY_START: "canary started",
    Entry.CANARY_PASSED: "canary passed",
    Entry.CANARY_FAILED: "canary failed, quarantine extended",
    Entry.RELEASE: "device released",
    Entry.FENCE: "device fenced (DeviceTaintRule)",
    Entry.REPAIR_REQUESTED: "repair requested",
    Entry.REPAIRED: "repaired",
    Entry.REPAIR_FAILED: "repair failed",
    Entry.WOULD_REPAIR: "repair proposed (not asked)",
    Entry.REPAIR_HELD: "repair held by the repair budget",
    Entry.REPAIR_EXHAUSTED: "repairs exhausted: contact support",
    Entry.REPAIR_AWAITING_APPROVAL: "repair awaits approval",
    Entry.REPAIR_APPROVED: "repair approved",
    Entry.REPAIR_REJECTED: "repair rejected, not carried out",
    Entry.REPAIR_APPROVAL_EXPIRED: "repair approval expired, not carried out",
    Entry.REPLACE_REQUESTED: "node replacement requested from the provider",
    Entry.REPLACE_ACCEPTED: "node replacement accepted by the provider",
    Entry.REPLACE_FAILED: "node replacement call failed",
    Entry.VALIDATION_START: "validation Job started",
    Entry.VALIDATION_PASSED: "validation passed",
    Entry.VALIDATION_FAILED: "validation failed, stays tainted",
    Entry.ELIDED: "entries elided",
}


def said(action: str) -> str:
    """How people say a record entry; a name this release does not know (written
    by a newer one) as it is."""
    try:
        return SAID[Entry(action)]
    except ValueError:
        return action


class Reason(StrEnum):
    """The reason of an Event gpuheal sends (events.k8s.io/v1): what `kubectl
    events --for` and alert rules select on. docs/architecture.md#events says
    which rule sends each."""

    # A fault's way through the node (gpuheal/policy/plan/).
    DETECTED = "GPUFaultDetected"
    QUARANTINED = "GPUFaultQuarantined"
    HELD = "GPUFaultHeld"
    RELEASED = "GPUFaultReleased"
    EVICTED = "GPUPodEvicted"
    EVICTION_BLOCKED = "GPUPodEvictionBlocked"
    RECOVERED = "GPUFaultRecovered"
    INPUT_NORMALIZED = "GPUFaultInputNormalized"
    ESCALATED = "GPUFaultEscalated"
    AWAITING_APPROVAL = "GPUFaultAwaitingApproval"
    APPROVED = "GPUFaultApproved"
    REJECTED = "GPUFaultRejected"
    APPROVAL_EXPIRED = "GPUFaultApprovalExpired"
    CHECKPOINT_REQUESTED = "GPUPodCheckpointRequested"
    RESTORED = "GPUFaultRestored"
    # Device health (gpuheal/policy/devices.py).
    DEVICE_UNKNOWN = "GPUDeviceUnknown"
    DEVICE_SUSPECT = "GPUDeviceSuspect"
    DEVICE_CANARY = "GPUDeviceCanary"
    DEVICE_ESCALATED = "GPUDeviceEscalated"
    # Repairs (gpuheal/policy/repair.py); contact support also from devices.
    REPAIR_REQUESTED = "GPUFaultRepairRequested"
    REPAIRED = "GPUFaultRepaired"
    REPAIR_FAILED = "GPUFaultRepairFailed"
    REPAIR_PROPOSED = "GPUFaultRepairProposed"
    REPAIR_AWAITING_APPROVAL = "GPUFaultRepairAwaitingApproval"
    REPAIR_APPROVED = "GPUFaultRepairApproved"
    REPAIR_REJECTED = "GPUFaultRepairRejected"
    REPAIR_APPROVAL_EXPIRED = "GPUFaultRepairApprovalExpired"
    CONTACT_SUPPORT = "GPUContactSupport"
    # Node replacement (gpuheal/policy/replace.py).
    REPLACE_REQUESTED = "GPUNodeReplaceRequested"
    REPLACE_ACCEPTED = "GPUNodeReplaceAccepted"
    REPLACE_FAILED = "GPUNodeReplaceFailed"
    # The health gate (gpuheal/policy/gate.py, gpuheal/policy/validation.py).
    GATE_FAILED = "GPUHealthGateFailed"
    VALIDATION_STARTED = "GPUValidationStarted"
    VALIDATION_PASSED = "GPUValidationPassed"
    # The idle-node sweep (gpuheal/policy/sweep.py).
    SWEEP_STARTED = "GPUSweepStarted"
    SWEEP_PASSED = "GPUSweepPassed"
    SWEEP_FAILED = "GPUSweepFailed"
    SWEEP_YIELDED = "GPUSweepYielded"
    SWEEP_ERROR = "GPUSweepError"
    # The controller's own (gpuheal/controller/).
    RECONCILE_FAILED = "GPUHealReconcileFailed"
    NODE_UNMANAGED = "GPUNodeUnmanaged"
    FAULT_ID_REUSED = "GPUFaultIdReused"
    ANNOTATION_UNREADABLE = "GPUAnnotationUnreadable"
    ACKNOWLEDGED = "GPUFaultAcknowledged"
    APPLICATION_XID = "GPUApplicationXid"
    INFORMATIONAL_XID = "GPUInformationalXid"
    # Maintenance drains (gpuheal/ops/maintenance.py).
    MAINTENANCE_STARTED = "GPUMaintenanceStarted"
    MAINTENANCE_FINISHED = "GPUMaintenanceFinished"
    # A maintenance request or roll-out step refused: the node is not one gpuheal
    # manages (gpuheal/controller/maintenance.py, gpuheal/controller/rollouts.py).
    MAINTENANCE_REFUSED = "GPUMaintenanceRefused"
