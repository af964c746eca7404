"""The disruption guard: while work is in progress on a node (a repair, the health
gate with its validation, a roll-out step), the autoscalers are asked to leave the
node alone; when the work ends, the ask is taken back.

Cluster Autoscaler and Karpenter see a quarantined, drained GPU node as idle (only
DaemonSet pods on it) and may remove it: Cluster Autoscaler after its
scale-down-unneeded-time, Karpenter's consolidation once the node is empty. A node
removed mid-reboot or mid-validation loses the repair that was about to bring it
back; a node a person has to look at (the repair ladder ended) or one the
provider's hook is replacing is not guarded: removing it is what the fleet wants.

Each autoscaler has its own annotation (model.DISRUPTION_KEYS), set to "true". The
controller sets those of `autoscalers.doNotDisrupt` the node does not carry
already, and names the ones it set in gpuheal.io/disruption-guard: it only ever
removes those (an annotation a person set stays). One write sets the guard, one
write takes it back, whatever the steps in between (a reboot, then the gate).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpuheal.model import DISRUPTION_GUARD, MAINTENANCE_ROLLOUT, TAINTED_PHASES, NodeView, Phase
from gpuheal.vocabulary import Entry


class Work(StrEnum):
    """What keeps a node guarded."""

    REPAIR = "repair"  # from the first repair request until the ladder ends
    GATE = "gate"  # the record Recovering: the recovery window, the gate, its validation
    ROLLOUT = "roll-out"  # the node held by a roll-out (taken out, not yet returned)


# Entries of a record's repair that end it: after them no attempt follows (a person
# is asked, or the provider's hook replaces the node).
_REPAIR_ENDS = frozenset(
    {
        Entry.REPAIR_EXHAUSTED,
        Entry.REPAIR_REJECTED,
        Entry.REPAIR_APPROVAL_EXPIRED,
        Entry.REPLACE_REQUESTED,
    }
)
_REPAIR_GOES_ON = frozenset(
    {
        Entry.REPAIR_REQUESTED,
        Entry.REPAIRED,
        Entry.REPAIR_FAILED,
        Entry.REPAIR_HELD,
        Entry.REPAIR_AWAITING_APPROVAL,
        Entry.REPAIR_APPROVED,
    }
)


@dataclass(frozen=True)
class Standing:
    """A node-scope record as it stands once the plan is carried out."""

    phase: Phase
    entries: tuple[str, ...]  # its action entries' names, oldest first
    contact_support: bool = False


@dataclass(frozen=True)
class GuardDisruption:
    """Set the guard (`add`: the annotations to set "true", which the guard annotation
    then names) or take it back (`remove`: the ones it names, and itself)."""

    node: str
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    work: str = ""  # why it is set; "" when taken back


def guarded_by(node: NodeView) -> tuple[str, ...]:
    """The annotations the guard set on the node (none: no guard of ours)."""
    return tuple(k for k in node.annotations.get(DISRUPTION_GUARD, "").split(",") if k)


def work_on(
    node: NodeView,
    records: Iterable[Standing],
    *,
    fenced: bool,
    requesting_repair: bool,
    rollouts: bool,
) -> Work | None:
    """The work in progress on the node, if any. `fenced`: our taint is on the node once
    the plan is carried out (a node a person untainted is back in use: a record's work
    no longer holds it); `requesting_repair`: the plan writes a repair request now;
    `rollouts`: a roll-out's hold counts (not in observe mode)."""
    if rollouts and node.annotations.get(MAINTENANCE_ROLLOUT):
        return Work.ROLLOUT
    if requesting_repair:
        return Work.REPAIR
    if not fenced:
        return None
    for record in records:
        if record.phase not in TAINTED_PHASES:
            continue
        if record.phase is Phase.RECOVERING:
            return Work.GATE
        if not record.contact_support and _repairing(record.entries):
            return Work.REPAIR
    return None


def _repairing(entries: Sequence[str]) -> bool:
    """A repair was asked for and nothing since ended the ladder."""
    if Entry.REPAIR_REQUESTED not in entries:
        return False  # held by the budget, or awaiting a person: nothing asked of the node
    last = next(e for e in reversed(entries) if e in _REPAIR_ENDS or e in _REPAIR_GOES_ON)
    return last not in _REPAIR_ENDS


def change(node: NodeView, keys: Collection[str], work: Work | None) -> GuardDisruption | None:
    """What to write so that the guard matches the work (None: nothing)."""
    ours = guarded_by(node)
    if work is None:
        return GuardDisruption(node.name, remove=ours) if ours else None
    if ours:
        return None  # set already (a key a person removed since stays removed)
    add = tuple(k for k in keys if k not in node.annotations)
    return GuardDisruption(node.name, add=add, work=work) if add else None
