"""The disruption guard (gpuheal/policy/disruption.py): the autoscalers' annotations
are set while a repair, the gate or a roll-out step is in progress on a node, in
one write, taken back in one write when the work ends, and never touch an
annotation a person set."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from gpuheal.clock import iso
from gpuheal.config import AutoscalersConfig, Config, ConfigError, parse_config
from gpuheal.model import (
    DISRUPTION_GUARD,
    DO_NOT_DISRUPT,
    MAINTENANCE_ROLLOUT,
    MANAGED_LABEL,
    REPAIR_REQUEST,
    REPAIR_RESULT,
    SCALE_DOWN_DISABLED,
    STATE_LABEL,
    STATE_MAINTENANCE,
    Mode,
    NodeView,
    Phase,
)
from gpuheal.policy.actions import Guard, NodeState, Plan
from gpuheal.policy.disruption import GuardDisruption, Work
from gpuheal.policy.plan import plan
from gpuheal.policy.repair import RequestRepair
from gpuheal.policy.repairwire import Outcome
from gpuheal.vocabulary import Entry
from gpuheal.xid import Action
from tests.unit import test_policy_plan as plans
from tests.unit import test_policy_repair as repairs

BOTH = (SCALE_DOWN_DISABLED, DO_NOT_DISRUPT)
HELD = {DISRUPTION_GUARD: ",".join(BOTH)} | dict.fromkeys(BOTH, "true")
REPAIRING = replace(repairs.CONFIG, autoscalers=AutoscalersConfig())
RETURNING = replace(plans.CONFIG, recovery_window_seconds=60, autoscalers=AutoscalersConfig())
NOW = repairs.NOW


def guards(p: Plan) -> list[GuardDisruption]:
    return [a for a in p.actions if isinstance(a, GuardDisruption)]


def test_both_annotations_are_on_by_default_and_the_keys_are_checked() -> None:
    assert Config().autoscalers.do_not_disrupt == BOTH
    assert parse_config({"autoscalers": {"doNotDisrupt": []}}).autoscalers.do_not_disrupt == ()
    with pytest.raises(ConfigError, match=r"autoscalers.doNotDisrupt.*karpenter.sh/do-not-disrupt"):
        parse_config({"autoscalers": {"doNotDisrupt": ["example.com/keep"]}})


def test_the_guard_is_set_before_the_first_repair_request_under_the_repair_budget() -> None:
    p = plan(repairs.state(repairs.node(), repairs.drained()), REPAIRING, NOW)
    assert p.new_repair
    (step,) = p.steps
    assert step.guard is Guard.REPAIR_BUDGET
    kinds = [type(a).__name__ for a in p.repair]
    assert kinds[:2] == ["GuardDisruption", "RequestRepair"]
    (guard,) = guards(p)
    assert (guard.add, guard.remove, guard.work) == (BOTH, (), Work.REPAIR)


def test_a_held_guard_is_not_written_again_through_the_repair_and_the_gate() -> None:
    """Request, result, the next attempt, then the fault clears: not one more write."""
    asked = repairs.entry(Entry.REPAIR_REQUESTED, "reset-gpu attempt 1: x", "waiting")
    waiting = repairs.node(**{REPAIR_REQUEST: repairs.asked(Action.RESET_GPU, 1)}, **HELD)
    p = plan(repairs.state(waiting, repairs.drained(asked)), REPAIRING, NOW)
    assert not guards(p) and p.suppressed == "repairing"
    answered = replace(
        waiting,
        annotations=waiting.annotations
        | {REPAIR_RESULT: repairs.answered(Action.RESET_GPU, 1, Outcome.FAILED)},
    )
    p = plan(repairs.state(answered, repairs.drained(asked)), REPAIRING, NOW)
    assert any(isinstance(a, RequestRepair) for a in p.actions) and not guards(p)
    # The fault cleared: Recovering, the window, then the gate.
    recovering = plans.record(Phase.RECOVERING, recovering_since=iso(NOW), actions=(asked,))
    node = plans.tainted(plans.healthy(**HELD))
    p = plan(NodeState(node, records=(recovering,)), RETURNING, plans.NOW)
    assert not guards(p)


def test_the_node_returned_takes_the_guard_back_after_the_untaint() -> None:
    recovering = plans.record(Phase.RECOVERING, recovering_since=iso(plans.NOW))
    node = plans.tainted(plans.healthy(**HELD))
    later = plans.NOW + dt.timedelta(seconds=60)
    p = plan(NodeState(node, records=(recovering,)), RETURNING, later)
    kinds = [type(a).__name__ for a in p.release]
    assert kinds[0] == "RemoveTaint" and kinds[-1] == "GuardDisruption"
    (guard,) = guards(p)
    assert (guard.add, guard.remove) == ((), BOTH)


def test_the_gate_alone_guards_a_node_whose_fault_cleared_without_a_repair() -> None:
    """Drained, the fault cleared: the pass that starts Recovering sets the guard."""
    node = plans.tainted(plans.healthy())
    p = plan(NodeState(node, records=(plans.record(Phase.DRAINED),)), RETURNING, plans.NOW)
    (guard,) = guards(p)
    assert guard.work is Work.GATE and guard.add == BOTH


def test_an_annotation_a_person_set_is_neither_claimed_nor_removed() -> None:
    theirs = plans.tainted(plans.healthy(**{SCALE_DOWN_DISABLED: "true"}))
    drained = NodeState(theirs, records=(plans.record(Phase.DRAINED),))
    (guard,) = guards(plan(drained, RETURNING, plans.NOW))
    assert guard.add == (DO_NOT_DISRUPT,)
    # Only karpenter's is ours: the guard names it alone and takes back it alone.
    ours = replace(
        theirs,
        annotations=theirs.annotations | {DO_NOT_DISRUPT: "true", DISRUPTION_GUARD: DO_NOT_DISRUPT},
    )
    recovering = plans.record(Phase.RECOVERING, recovering_since=iso(plans.NOW))
    later = plans.NOW + dt.timedelta(seconds=60)
    (back,) = guards(plan(NodeState(ours, records=(recovering,)), RETURNING, later))
    assert back.remove == (DO_NOT_DISRUPT,)
    # Every key set already by someone else: nothing to write, nothing owned.
    all_theirs = replace(theirs, annotations=dict.fromkeys(BOTH, "true"))
    assert not guards(plan(replace(drained, node=all_theirs), RETURNING, plans.NOW))


def test_the_end_of_the_ladder_takes_the_guard_back_for_the_autoscaler() -> None:
    """A person's turn (contact support): removing the node is the fleet's choice again."""
    tried = (Action.RESET_GPU, Action.RESET_GPU, Action.REBOOT)
    on_node, recorded = repairs._after_failures(*tried)
    held = replace(on_node, annotations=on_node.annotations | HELD)
    p = plan(repairs.state(held, recorded), REPAIRING, NOW)
    assert len(repairs.entries(p, Entry.REPAIR_EXHAUSTED)) == 1
    (guard,) = guards(p)
    assert guard.remove == BOTH
    assert type(p.release[-1]).__name__ == "GuardDisruption"


def test_no_guard_before_a_request_is_made() -> None:
    """Held by the budget or waiting for a person's approval: nothing is asked of the node."""
    full = repairs.state(repairs.node(), repairs.drained(), repairing=frozenset({"a", "b"}))
    p = plan(full, REPAIRING, NOW)
    assert not any(isinstance(a, RequestRepair) for a in p.actions) and not guards(p)


def test_a_person_untainting_a_recovering_node_returns_it_to_the_autoscaler() -> None:
    node = plans.healthy(**HELD)
    recovering = plans.record(Phase.RECOVERING, recovering_since=iso(plans.NOW))
    (guard,) = guards(plan(NodeState(node, records=(recovering,)), RETURNING, plans.NOW))
    assert guard.remove == BOTH


def rolled(node: NodeView) -> NodeView:
    """Taken out by a roll-out (ops/maintenance.py::take_out)."""
    return replace(
        node,
        labels=node.labels | {STATE_LABEL: STATE_MAINTENANCE},
        annotations=node.annotations | {MAINTENANCE_ROLLOUT: "pool-a-1b2c3d"},
    )


def test_a_roll_out_step_is_guarded_and_its_end_unguarded() -> None:
    p = plan(NodeState(rolled(plans.healthy())), RETURNING, plans.NOW)
    assert p.suppressed == "maintenance"
    (guard,) = guards(p)
    assert guard.work is Work.ROLLOUT and guard.add == BOTH
    returned = plans.healthy(**HELD)
    (back,) = guards(plan(NodeState(returned), RETURNING, plans.NOW))
    assert back.remove == BOTH
    # Observe mode writes nothing on a node.
    observing = replace(RETURNING, mode=Mode.OBSERVE)
    assert not guards(plan(NodeState(rolled(plans.healthy())), observing, plans.NOW))


def test_a_maintenance_drain_pauses_the_guard_and_an_opt_out_takes_it_back() -> None:
    maintained = replace(plans.healthy(**HELD), labels={STATE_LABEL: STATE_MAINTENANCE})
    recovering = plans.record(Phase.RECOVERING, recovering_since=iso(plans.NOW))
    p = plan(NodeState(maintained, records=(recovering,)), RETURNING, plans.NOW)
    assert p.suppressed == "maintenance" and not guards(p)
    opted_out = replace(plans.healthy(**HELD), labels={MANAGED_LABEL: "false"})
    (back,) = guards(plan(NodeState(opted_out), RETURNING, plans.NOW))
    assert back.remove == BOTH


def test_turned_off_nothing_is_set_and_a_guard_set_before_is_still_taken_back() -> None:
    off = replace(RETURNING, autoscalers=AutoscalersConfig(do_not_disrupt=()))
    drained = NodeState(plans.tainted(plans.healthy()), records=(plans.record(Phase.DRAINED),))
    assert not guards(plan(drained, off, plans.NOW))
    returned = plans.healthy(**HELD)
    (back,) = guards(plan(NodeState(returned), off, plans.NOW))
    assert back.remove == BOTH
