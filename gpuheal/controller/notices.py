"""What one remediation step tells people: a Notice with a one-line summary.

"ip-10-0-12-34.us-west-2.compute.internal: XidCritical79 — detected, tainted,
evicted 3 pods (ml/a, ml/b, ml/c)": the node, what is wrong with it, and what
was done, from the actions the step ran and what came of them. Node and device
steps alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuheal.controller.executor import Outcome
from gpuheal.controller.notify import Notice
from gpuheal.model import FaultRecord
from gpuheal.policy import repair, validation
from gpuheal.policy import replace as replacing
from gpuheal.policy.devices import (
    CreateCanary,
    CreateDeviceRecord,
    DeviceAction,
    MarkDevices,
)
from gpuheal.policy.plan import (
    APPROVED_ACTION,
    AWAIT_ACTION,
    CHECKPOINT_ACTION,
    ESCALATE_ACTION,
    EXPIRED_ACTION,
    REJECTED_ACTION,
    WOULD_QUARANTINE_ACTION,
    Action,
    AddTaint,
    CreateRecord,
    DeletePod,
    Emit,
    Evict,
    RemoveTaint,
    UpdateRecord,
)
from gpuheal.policy.repair import (
    EXHAUSTED_ACTION,
    FAILED_ACTION,
    PROPOSED_ACTION,
    REPAIRED_ACTION,
    REQUESTED_ACTION,
)

PODS_NAMED = 5  # pods named in a summary before "and N more"

# A record's new action entry, as people say it; entries another verb already
# covers (taint, evict, detect, canary-start) say nothing more.
_ENTRY_VERBS = {
    AWAIT_ACTION: "awaiting approval",
    APPROVED_ACTION: "plan approved",
    REJECTED_ACTION: "plan rejected, nothing done",
    EXPIRED_ACTION: "approval expired, nothing done",
    WOULD_QUARANTINE_ACTION: "observed (would have quarantined)",
    ESCALATE_ACTION: "escalated (handled as P0)",
    CHECKPOINT_ACTION: "GPU pods asked to checkpoint",
    "hold": "held by the blast-radius breaker",
    "superseded": "superseded by a newer fault",
    "drain": "drained",
    "recovering": "recovering",
    "recovered": "resolved",
    "untaint": "resolved",
    "manual-untaint": "taint removed by hand (respected)",
    "fault-returned": "fault returned",
    "gate-failed": "health gate failed, stays tainted",
    validation.START_ACTION: "validation Job started",
    validation.PASSED_ACTION: "validation passed",
    validation.FAILED_ACTION: "validation failed, stays tainted",
    "canary-passed": "canary passed",
    "canary-failed": "canary failed, quarantine extended",
    "extend": "quarantine extended",
    "release": "device released",
    "node-deleted": "node deleted, record closed",
    REQUESTED_ACTION: "repair requested",
    REPAIRED_ACTION: "repaired",
    FAILED_ACTION: "repair failed",
    PROPOSED_ACTION: "repair proposed (not asked)",
    EXHAUSTED_ACTION: "repairs exhausted: contact support",
    repair.AWAITING_APPROVAL_ACTION: "repair awaits approval",
    repair.APPROVED_ACTION: "repair approved",
    repair.REJECTED_ACTION: "repair rejected, not carried out",
    repair.EXPIRED_ACTION: "repair approval expired, not carried out",
    replacing.REQUESTED_ACTION: "node replacement requested from the provider",
    replacing.ACCEPTED_ACTION: "node replacement accepted by the provider",
    replacing.FAILED_ACTION: "node replacement call failed",
}


def _pods(keys: Sequence[str]) -> str:
    names = ", ".join(keys[:PODS_NAMED])
    more = f" and {len(keys) - PODS_NAMED} more" if len(keys) > PODS_NAMED else ""
    return f"{len(keys)} pod{'s' if len(keys) != 1 else ''} ({names}{more})"


def _faults(
    ran: Sequence[Action | DeviceAction], record: Callable[[str], FaultRecord | None]
) -> list[tuple[str, str]]:
    """(fault id, what is wrong) of every fault the step touched, in order."""
    found: dict[str, str] = {}
    for action in ran:
        match action:
            case CreateRecord():
                found.setdefault(action.signal.fault_id, action.signal.reason)
            case CreateDeviceRecord():
                r = action.record
                found.setdefault(r.fault_id, f"{r.reason} on {r.resource} {r.device}")
            case UpdateRecord():
                known = record(action.name)
                if known is not None:
                    what = known.reason or "fault"
                    if known.device_scope:
                        what = f"{what} on {known.resource} {known.device}"
                    found.setdefault(known.fault_id, what)
            case Evict() | DeletePod():
                found.setdefault(action.fault_id, "")
    return list(found.items())


def _verbs(ran: Sequence[Action | DeviceAction], outcome: Outcome) -> list[str]:
    verbs: list[str] = []
    for action in ran:
        match action:
            case CreateRecord():
                verbs.append("detected")
            case CreateDeviceRecord():
                verbs += ["detected", "device quarantined"]
            case AddTaint():
                verbs.append(f"tainted {action.effect}")
            case RemoveTaint():
                # Without our taint on the node only the state label went.
                verbs.append("untainted" if outcome.untainted else "state label removed")
            case UpdateRecord() if action.entry.action in _ENTRY_VERBS:
                verbs.append(_ENTRY_VERBS[action.entry.action])
                if action.plan is not None:  # what it would do: taint, which pods
                    verbs.append(action.plan.text())
            case CreateCanary():
                verbs.append("canary started")
    deleted = {a.pod.key for a in ran if isinstance(a, DeletePod)}
    evicted = [k for k in outcome.evicted if k not in deleted]
    removed = [k for k in outcome.evicted if k in deleted]
    if evicted:
        verbs.append(f"evicted {_pods(evicted)}")
    if removed:
        verbs.append(f"deleted {_pods(removed)} (eviction stayed blocked)")
    if outcome.blocked:
        by = sorted({outcome.blocked_by.get(k, "?") for k in outcome.blocked})
        verbs.append(f"eviction of {_pods(sorted(outcome.blocked))} refused by {', '.join(by)}")
    return list(dict.fromkeys(verbs))


def notice_for(
    node: str,
    ran: Sequence[Action | DeviceAction],
    outcome: Outcome,
    record: Callable[[str], FaultRecord | None],
    fault_id: str = "",
) -> Notice | None:
    """The Notice of one remediation step, or None when it wrote nothing worth telling
    (only Events, or only the node's device marks)."""
    steps = tuple(
        dict.fromkeys(type(a).__name__ for a in ran if not isinstance(a, Emit | MarkDevices))
    )
    if not steps:
        return None
    faults = _faults(ran, record)
    what = ", ".join(dict.fromkeys(w for _, w in faults if w)) or "fault"
    done = ", ".join(_verbs(ran, outcome)) or ", ".join(steps)
    fault = fault_id or next((f for f, _ in faults), "")
    return Notice(
        node=node,
        fault_id=fault,
        actions=steps,
        evicted=tuple(outcome.evicted),
        summary=f"{node}: {what} — {done}",
    )
