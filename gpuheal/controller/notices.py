"""What one remediation step tells people: a Notice with a one-line summary.

"ip-10-0-12-34.us-west-2.compute.internal: XidCritical79 — detected, tainted,
evicted 3 pods (ml/a, ml/b, ml/c)": the node, what is wrong with it, and what
was done, from the actions the step ran and what came of them. Node and device
steps alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuheal.controller.effects.context import PassOutcome
from gpuheal.controller.notify import Notice
from gpuheal.model import FaultRecord, Phase
from gpuheal.policy.actions import (
    Action,
    AddTaint,
    CreateRecord,
    DeletePod,
    Emit,
    Evict,
    RemoveTaint,
    UpdateRecord,
)
from gpuheal.policy.devices import (
    CreateCanary,
    CreateDeviceRecord,
    DeviceAction,
    MarkDevices,
)
from gpuheal.vocabulary import Entry, said

PODS_NAMED = 5  # pods named in a summary before "and N more"

# A record's new entry is said in its words (gpuheal/vocabulary.py::SAID), save
# those another verb of the step already says (the record's creation, the taint,
# the evictions, the canary's start) and those too small to tell (a repeat held,
# one pod's checkpoint answer, the history's trimming).
_UNSAID = frozenset(
    {
        Entry.DETECT,
        Entry.TAINT,
        Entry.EVICT,
        Entry.CANARY_START,
        Entry.REPAIR_HELD,
        Entry.CHECKPOINTED,
        Entry.CHECKPOINT_TIMEOUT,
        Entry.ELIDED,
    }
)


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


def _verbs(ran: Sequence[Action | DeviceAction], outcome: PassOutcome) -> list[str]:
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
            case UpdateRecord() if action.entry.action not in _UNSAID:
                verbs.append(said(action.entry.action))
                if action.plan is not None:  # what it would do: taint, which pods
                    verbs.append(action.plan.text())
                if action.phase is Phase.RESOLVED:
                    verbs.append("resolved")
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
    # "detected" first, however the step ordered its writes (the taint goes first).
    return sorted(dict.fromkeys(verbs), key=lambda verb: verb != "detected")


def notice_for(
    node: str,
    ran: Sequence[Action | DeviceAction],
    outcome: PassOutcome,
    record: Callable[[str], FaultRecord | None],
    fault_id: str = "",
    *,
    reason: str = "",
) -> Notice | None:
    """The Notice of one remediation step, or None when it wrote nothing worth telling
    (only Events, or only the node's device marks). `reason`: what is wrong, when no
    record the step touched says (a new quarantine's fence pass is the taint alone)."""
    steps = tuple(
        dict.fromkeys(type(a).__name__ for a in ran if not isinstance(a, Emit | MarkDevices))
    )
    if not steps:
        return None
    faults = _faults(ran, record)
    what = ", ".join(dict.fromkeys(w for _, w in faults if w)) or reason or "fault"
    done = ", ".join(_verbs(ran, outcome)) or ", ".join(steps)
    fault = fault_id or next((f for f, _ in faults), "")
    return Notice(
        node=node,
        fault_id=fault,
        actions=steps,
        evicted=tuple(outcome.evicted),
        summary=f"{node}: {what} — {done}",
    )
