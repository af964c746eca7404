"""What follows a node's plan whatever its stage: the disruption guard follows
the work on the node, and our state label follows our taint."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuheal.config import Config
from gpuheal.model import MAINTENANCE_ROLLOUT, STATE_LABEL, FaultRecord, Mode, NodeView
from gpuheal.policy import disruption
from gpuheal.policy.actions import (
    STATE_QUARANTINED,
    AddTaint,
    NodeState,
    Plan,
    RemoveTaint,
    UpdateRecord,
)
from gpuheal.policy.repair import RequestRepair

# Suppressed plans that leave the guard as it is (the plan's rules did not look at
# the node's work): a maintenance drain's, the memory rule's. An opted-out node's
# guard is taken back: it is no longer gpuheal's to hold.
_GUARD_STANDS = frozenset({"maintenance", "memory"})


def guard_follows_work(state: NodeState, config: Config, decided: Plan) -> Plan:
    """The disruption guard follows the work on the node as it stands once the plan
    is carried out (policy/disruption.py): set before the step that starts the work
    (at the head of the repair stage: before the repair request), taken back after
    the one that ends it (at the tail of the release stage: after the untaint)."""
    if decided.suppressed in _GUARD_STANDS and not state.node.annotations.get(MAINTENANCE_ROLLOUT):
        return decided  # the work is paused, not ended: the guard stays as it is
    updates: dict[str, list[UpdateRecord]] = {}
    for a in decided.actions:
        if isinstance(a, UpdateRecord):
            updates.setdefault(a.name, []).append(a)
    standing = [_standing(r, updates.get(r.name, [])) for r in state.records if not r.device_scope]
    untaints = any(isinstance(a, RemoveTaint) for a in decided.actions)
    taints = any(isinstance(a, AddTaint) for a in decided.actions)
    work = disruption.work_on(
        state.node,
        standing,
        fenced=taints or (state.node.taint() is not None and not untaints),
        requesting_repair=any(isinstance(a, RequestRepair) for a in decided.actions),
        rollouts=config.mode is not Mode.OBSERVE,
    )
    guard = disruption.change(state.node, config.autoscalers.do_not_disrupt, work)
    if guard is None:
        return decided
    if guard.add:
        return replace(decided, repair=(guard, *decided.repair))
    return replace(decided, release=(*decided.release, guard))


def _standing(record: FaultRecord, news: Sequence[UpdateRecord]) -> disruption.Standing:
    """The record as it stands once the plan's updates of it are written."""
    return disruption.Standing(
        phase=news[-1].phase if news else record.phase,
        entries=(*(e.action for e in record.actions), *(u.entry.action for u in news)),
        contact_support=record.contact_support or any(u.contact_support for u in news),
    )


def label_follows_taint(node: NodeView, decided: Plan) -> Plan:
    """Our state label goes with our taint: when the taint is gone (a person removed
    it) and the plan does not put it back, the label goes too, or label selectors
    and dashboards go on counting the node as quarantined."""
    if node.taint() is not None or node.labels.get(STATE_LABEL) != STATE_QUARANTINED:
        return decided
    if any(isinstance(a, AddTaint | RemoveTaint) for a in decided.actions):
        return decided
    # Without our taint on the node, the executor's RemoveTaint removes the label alone.
    return replace(decided, release=(*decided.release, RemoveTaint(node.name)))
