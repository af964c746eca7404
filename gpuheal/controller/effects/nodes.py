"""Effects on the Node: our taint (the fence) and state label, the fault's handled
mark, the repair request, the device marks, the disruption guard. Every write goes through
gpuheal/kube/writes.py and back into the node cache."""

from __future__ import annotations

import datetime as dt

from gpuheal import values
from gpuheal.clock import iso, parse_time
from gpuheal.controller.effects.context import (
    CONFLICT_RETRIES,
    EffectContext,
    Handler,
    PassOutcome,
    Replan,
)
from gpuheal.kube import writes
from gpuheal.kube.api import ApiError, node_path
from gpuheal.kube.projections import decode_node
from gpuheal.model import FAULT_TIME, HANDLED_FAULT_ID, REPAIR_REQUEST, STATE_LABEL, NodeView
from gpuheal.policy.actions import (
    AddTaint,
    MarkHandled,
    NodeState,
    RemoveTaint,
    state_label_with_taint,
)
from gpuheal.policy.devices import MarkDevices
from gpuheal.policy.disruption import GuardDisruption, guarded_by
from gpuheal.policy.repair import RequestRepair


async def add_taint(
    fx: EffectContext, action: AddTaint, state: NodeState, _outcome: PassOutcome
) -> str:
    return await _set_taint(fx, action.node, action, state)


async def remove_taint(
    fx: EffectContext, action: RemoveTaint, state: NodeState, outcome: PassOutcome
) -> str:
    result = await _set_taint(fx, action.node, None, state)
    # "label-removed": a person had removed the taint, only our label went.
    outcome.untainted = result != "label-removed"
    return result


async def _set_taint(fx: EffectContext, name: str, add: AddTaint | None, state: NodeState) -> str:
    """Add (or with None remove) our taint, under optimistic concurrency; with the
    fault's handled mark where the plan merged it (AddTaint.with_mark)."""
    node = fx.caches.node(name) or state.node
    wanted = values.taint_value(add.fault_id) if add is not None else None
    for _ in range(CONFLICT_RETRIES):
        ours = node.taint()
        label = node.labels.get(STATE_LABEL)
        if (
            add is not None
            and ours is not None
            and (ours.value, ours.effect) == (wanted, add.effect)
        ):
            return "present"
        if add is None and ours is None and state_label_with_taint(False, label) is None:
            return "absent"
        moment = dt.datetime.now(dt.UTC)
        body = writes.taint_patch(
            node,
            add.fault_id if add is not None else None,
            add.effect if add is not None else "",
            state=state_label_with_taint(add is not None, label),
            handled_at=iso(moment) if add is not None and add.with_mark else None,
            added_at=iso(moment, "seconds") if add is not None else None,
        )
        try:
            raw = await fx.api.patch(node_path(name), body)
        except ApiError as err:
            if err.code != 409:
                raise
            # Someone else wrote the node meanwhile: read it fresh and try again.
            node = decode_node(await fx.api.get(node_path(name)))
            fx.caches.put_node(node)
            continue
        fx.caches.put_node(decode_node(raw))
        if add is not None:
            _observe_time_to_quarantine(fx, state.node)
            return "tainted"
        # Without our taint (a person removed it) only our state label went.
        return "untainted" if ours is not None else "label-removed"
    raise Replan(f"node {name}: conflicts did not settle")


def _observe_time_to_quarantine(fx: EffectContext, node: NodeView) -> None:
    reported = parse_time(node.annotations.get(FAULT_TIME, ""))
    if reported is not None:
        elapsed = (dt.datetime.now(dt.UTC) - reported).total_seconds()
        fx.metrics.time_to_quarantine.observe(max(0.0, elapsed))


async def mark_handled(
    fx: EffectContext, action: MarkHandled, _state: NodeState, outcome: PassOutcome
) -> str:
    outcome.handled = True
    node = fx.caches.node(action.node)
    if node is not None and node.annotations.get(HANDLED_FAULT_ID) == values.fault_id(
        action.fault_id
    ):
        return "present"  # written with the taint
    body = writes.handled_patch(action.fault_id, iso(dt.datetime.now(dt.UTC)))
    raw = await fx.api.patch(node_path(action.node), body)
    fx.caches.put_node(decode_node(raw))
    return "marked"


async def request_repair(
    fx: EffectContext, action: RequestRepair, _state: NodeState, _outcome: PassOutcome
) -> str:
    """The repair request on the node: one attempt, written once (a request already
    there is the same attempt: a restarted pass does not ask again)."""
    node = fx.caches.node(action.node)
    if node is not None and node.annotations.get(REPAIR_REQUEST) == action.value:
        return "present"
    raw = await fx.api.patch(node_path(action.node), writes.repair_request(action.value))
    fx.caches.put_node(decode_node(raw))
    return "requested"


async def guard_disruption(
    fx: EffectContext, action: GuardDisruption, state: NodeState, _outcome: PassOutcome
) -> str:
    """Set or take back the autoscalers' annotations (policy/disruption.py), under the
    node's resourceVersion; a conflict is a fresh read and a new plan."""
    node = fx.caches.node(action.node) or state.node
    ours = guarded_by(node)
    if action.add and ours:
        return "present"
    if not action.add and not ours:
        return "absent"
    body = writes.disruption_guard(node, action.add, action.remove)
    try:
        raw = await fx.api.patch(node_path(action.node), body)
    except ApiError as err:
        if err.code != 409:
            raise
        fx.caches.put_node(decode_node(await fx.api.get(node_path(action.node))))
        raise Replan(f"node {action.node}: written meanwhile") from err
    fx.caches.put_node(decode_node(raw))
    return "guarded" if action.add else "unguarded"


async def mark_devices(
    fx: EffectContext, action: MarkDevices, _state: NodeState, _outcome: PassOutcome
) -> str:
    body = writes.device_marks(action.quarantined, action.suspect, action.unknown)
    raw = await fx.api.patch(node_path(action.node), body)
    fx.caches.put_node(decode_node(raw))
    return "marked"


HANDLERS: dict[type, Handler] = {
    AddTaint: add_taint,
    RemoveTaint: remove_taint,
    MarkHandled: mark_handled,
    RequestRepair: request_repair,
    MarkDevices: mark_devices,
    GuardDisruption: guard_disruption,
}
