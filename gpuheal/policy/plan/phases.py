"""The fault lifecycle as a declared table: the phases a GPUFault record may move
to from each phase. The stages decide; this table is what they must keep to, and
the property tests check every plan they make against it (`violations`).

    (new) -> Detected | Held | Quarantined (a restored record)
    Detected -> AwaitingApproval -> Detected (approved) | Resolved (rejected) | Failed (expired)
    Detected | Held -> Quarantined -> Draining -> Drained -> Recovering -> Resolved
    Recovering -> Quarantined (the fault returned)

A device's record (policy/devices.py) adds Canary between Recovering and its
release. Any open record may close (Resolved: superseded, cleared, its node
deleted); a closed one never opens again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuheal.model import FaultRecord, Phase
from gpuheal.policy.actions import Action, CreateRecord, UpdateRecord

# A record's first phase (CreateRecord).
FIRST: frozenset[Phase] = frozenset({Phase.DETECTED, Phase.HELD, Phase.QUARANTINED})

# From each phase, the phases a record may move to. Staying in a phase, with a new
# entry, is allowed while the record is open; a closed record never moves again.
TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    Phase.DETECTED: frozenset(
        {Phase.AWAITING_APPROVAL, Phase.HELD, Phase.QUARANTINED, Phase.RESOLVED}
    ),
    Phase.AWAITING_APPROVAL: frozenset({Phase.DETECTED, Phase.RESOLVED, Phase.FAILED}),
    Phase.HELD: frozenset({Phase.AWAITING_APPROVAL, Phase.QUARANTINED, Phase.RESOLVED}),
    Phase.QUARANTINED: frozenset({Phase.DRAINING, Phase.DRAINED, Phase.RECOVERING, Phase.RESOLVED}),
    Phase.DRAINING: frozenset({Phase.DRAINED, Phase.RECOVERING, Phase.RESOLVED}),
    # New GPU pods on a drained node (ones that tolerate our taint) are drained too.
    Phase.DRAINED: frozenset({Phase.DRAINING, Phase.RECOVERING, Phase.RESOLVED}),
    Phase.RECOVERING: frozenset({Phase.QUARANTINED, Phase.CANARY, Phase.RESOLVED}),
    Phase.CANARY: frozenset({Phase.RECOVERING, Phase.QUARANTINED, Phase.RESOLVED}),
    Phase.RESOLVED: frozenset(),
    Phase.FAILED: frozenset(),
}

CLOSED: frozenset[Phase] = frozenset(p for p, onward in TRANSITIONS.items() if not onward)


def allowed(before: Phase | None, after: Phase) -> bool:
    """A record may move from `before` (None: it does not exist yet) to `after`."""
    if before is None:
        return after in FIRST
    if before is after:
        return before not in CLOSED
    return after in TRANSITIONS[before]


def violations(records: Iterable[FaultRecord], actions: Iterable[Action]) -> list[str]:
    """Each move in `actions` (in order) that the table does not allow, said as
    `name: before -> after`; empty when the plan keeps to the lifecycle."""
    phases: dict[str, Phase | None] = {r.name: r.phase for r in records}
    wrong: list[str] = []
    for action in actions:
        if not isinstance(action, CreateRecord | UpdateRecord):
            continue
        before = phases.get(action.name)
        if isinstance(action, CreateRecord) and action.name in phases:
            continue  # the API server refuses it (AlreadyExists): no move
        if not allowed(before, action.phase):
            wrong.append(f"{action.name}: {before} -> {action.phase}")
        phases[action.name] = action.phase
    return wrong
