"""The fault lifecycle's declared table (gpuheal/policy/plan/phases.py), and every
plan held to it: whatever the configuration (full, quarantine and observe mode,
approval, the P1 watch and its taint, the breaker), severities, answers, releases,
untaints and pods arriving on a drained node, no record moves in a way the table
does not declare."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.config import ApprovalConfig, Config
from gpuheal.model import (
    APPROVED,
    FAULT_ID,
    FAULT_SEVERITY,
    REJECTED,
    STATUS,
    FaultRecord,
    Mode,
    Phase,
    PodView,
    fault_record_name,
)
from gpuheal.policy.actions import CreateRecord, RemoveTaint, UpdateRecord
from gpuheal.policy.plan import plan
from gpuheal.policy.plan.phases import CLOSED, FIRST, TRANSITIONS, allowed, violations
from tests.unit.test_policy_properties import NODES, World, apply, new_world, node_state

BASE = Config(
    breaker_max_nodes=2,
    breaker_max_percent=100,
    cooldown_seconds=0,
    recovery_window_seconds=5,
    p1_escalation_seconds=30,
)
# A real-shaped record: an EKS node's, for a fault id as its agent mints them.
FAULT = f"{NODES[0]}-20261208T000000Z-a1b2c3"
RECORD = fault_record_name(NODES[0], FAULT)
CONFIGS = {
    "full": BASE,
    "quarantine": replace(BASE, mode=Mode.QUARANTINE),
    "observe": replace(BASE, mode=Mode.OBSERVE),
    "approval": replace(BASE, approval=ApprovalConfig(required=True, expiry_seconds=60)),
    "p1-taint": replace(BASE, p1_taint=True),
}


def test_the_table_names_every_phase_and_only_resolved_and_failed_end_a_fault() -> None:
    assert set(TRANSITIONS) == set(Phase)
    assert {Phase.RESOLVED, Phase.FAILED} == CLOSED


def test_every_phase_is_reached_from_a_first_one_and_every_open_one_can_end() -> None:
    reached, frontier = set(FIRST), list(FIRST)
    while frontier:
        for onward in TRANSITIONS[frontier.pop()]:
            if onward not in reached:
                reached.add(onward)
                frontier.append(onward)
    assert reached == set(Phase)
    for phase in set(Phase) - CLOSED:
        assert (
            Phase.RESOLVED in TRANSITIONS[phase]
            or Phase.FAILED in TRANSITIONS[phase]
            or any(Phase.RESOLVED in TRANSITIONS[o] for o in TRANSITIONS[phase])
        ), phase


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (Phase.RESOLVED, Phase.QUARANTINED),  # a closed record never opens again
        (Phase.RESOLVED, Phase.RESOLVED),
        (Phase.FAILED, Phase.DETECTED),
        (Phase.DETECTED, Phase.DRAINED),  # never drained without the fence
        (Phase.AWAITING_APPROVAL, Phase.QUARANTINED),  # never fenced unanswered
        (Phase.HELD, Phase.DRAINING),
        (None, Phase.DRAINING),
    ],
)
def test_moves_the_table_does_not_declare_are_named(before: Phase | None, after: Phase) -> None:
    assert not allowed(before, after)
    records = [] if before is None else [FaultRecord(RECORD, NODES[0], FAULT, before)]
    move = UpdateRecord(RECORD, after, entry=None)  # type: ignore[arg-type]
    assert violations(records, [move]) == [f"{RECORD}: {before} -> {after}"]


def test_a_create_of_a_record_that_exists_is_no_move() -> None:
    record = FaultRecord(RECORD, NODES[0], FAULT, Phase.DRAINED)
    create = CreateRecord(RECORD, None, Phase.DETECTED, Mode.FULL, ())  # type: ignore[arg-type]
    assert violations([record], [create]) == []


def _reconcile(world: World, node: str, config: Config) -> set[tuple[Phase, Phase]]:
    """One pass over the node, its plan held to the table; the moves it makes."""
    state = node_state(world, node)
    decided = plan(state, config, world.now)
    assert violations(state.records, decided.actions) == [], decided
    for action in decided.actions:
        if not apply(world, action):
            break
    return _moves(state.records, decided.actions)


def _answer(world: World, node: str, decision: str) -> None:
    for name, record in world.records.items():
        if record.node == node and record.phase is Phase.AWAITING_APPROVAL:
            world.records[name] = replace(
                record, decision=decision, decided_by="oncall@example.com", decided_at="now"
            )


def _release(world: World, node: str) -> None:
    for name, record in world.records.items():
        if record.node == node and record.phase is Phase.HELD:
            world.records[name] = replace(
                record, released_by="oncall@example.com", released_at="now"
            )


def _report(world: World, node: str, arg: str) -> None:
    fault, severity = arg.split("/")
    view = world.nodes[node]
    annotations = view.annotations | {
        STATUS: "faulty",
        FAULT_ID: f"{node}-{fault}",
        FAULT_SEVERITY: severity,
    }
    world.nodes[node] = replace(view, annotations=annotations)


def _clear(world: World, node: str) -> None:
    view = world.nodes[node]
    annotations = {
        k: v for k, v in view.annotations.items() if k not in (STATUS, FAULT_ID, FAULT_SEVERITY)
    }
    world.nodes[node] = replace(view, annotations=annotations)


def _pod_arrives(world: World, node: str) -> None:
    """A GPU pod that tolerates our taint lands on the node (a drained node drains again)."""
    n = sum(1 for p in world.pods.values() if p.node == node)
    pod = PodView("ml", f"{node}-late{n}", f"uid-{node}-late{n}", node, "Running", gpu=True)
    world.pods[pod.key] = pod


def _clear_(world: World, node: str, _: str) -> None:
    _clear(world, node)


def _release_(world: World, node: str, _: str) -> None:
    _release(world, node)


def _pod_(world: World, node: str, _: str) -> None:
    _pod_arrives(world, node)


def _untaint(world: World, node: str, _: str) -> None:
    apply(world, RemoveTaint(node))


# What happens to the world between passes, by step kind.
ACTS: dict[str, Callable[[World, str, str], None]] = {
    "report": _report,
    "clear": _clear_,
    "answer": _answer,
    "release": _release_,
    "pod": _pod_,
    "untaint": _untaint,
}


def _walk(config: Config, steps: list[tuple[str, str, str]]) -> set[tuple[Phase, Phase]]:
    """The moves a walk makes, each plan held to the table on the way."""
    world, moves = new_world(), set()
    for kind, node, arg in steps:
        if kind == "reconcile":
            for _ in range(int(arg or "1")):
                moves |= _reconcile(world, node, config)
        elif kind == "tick":
            world.now += dt.timedelta(seconds=int(arg))
        elif kind == "config":
            config = CONFIGS[arg]
        else:
            ACTS[kind](world, node, arg)
    return moves


# Three nodes, the breaker's limit two: the walk meets the breaker, and comes back
# to one node often enough to take it the whole way.
WALK = NODES[:3]
step = st.one_of(
    st.tuples(
        st.just("report"),
        st.sampled_from(WALK),
        st.sampled_from(["a/P0", "a/P1", "b/P0", "b/P1", "c/P2"]),
    ),
    st.tuples(st.just("clear"), st.sampled_from(WALK), st.just("")),
    st.tuples(st.just("untaint"), st.sampled_from(WALK), st.just("")),
    st.tuples(st.just("reconcile"), st.sampled_from(WALK), st.sampled_from(["1", "3"])),
    st.tuples(st.just("answer"), st.sampled_from(WALK), st.sampled_from([APPROVED, REJECTED])),
    st.tuples(st.just("release"), st.sampled_from(WALK), st.just("")),
    st.tuples(st.just("pod"), st.sampled_from(WALK), st.just("")),
    st.tuples(st.just("tick"), st.just(""), st.sampled_from(["1", "10", "40", "90"])),
)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step, min_size=5, max_size=60))
def test_every_plan_keeps_to_the_declared_lifecycle(
    name: str, steps: list[tuple[str, str, str]]
) -> None:
    _walk(CONFIGS[name], steps)


def _moves(
    records: tuple[FaultRecord, ...], actions: tuple[object, ...]
) -> set[tuple[Phase, Phase]]:
    phases = {r.name: r.phase for r in records}
    seen: set[tuple[Phase, Phase]] = set()
    for a in actions:
        if isinstance(a, CreateRecord) and a.name not in phases:
            phases[a.name] = a.phase
        elif isinstance(a, UpdateRecord) and a.name in phases:
            if phases[a.name] is not a.phase:
                seen.add((phases[a.name], a.phase))
            phases[a.name] = a.phase
    return seen


A, B, C = WALK
R = ("reconcile", A, "")
SCRIPTS: dict[str, tuple[Config, list[tuple[str, str, str]]]] = {
    # Detected -> Quarantined -> Draining -> Drained -> Draining (a late pod) -> Drained
    # -> Recovering -> Quarantined (the fault returned) -> ... -> Resolved.
    "full": (
        BASE,
        [
            ("report", A, "a/P0"),
            R,
            R,
            R,
            ("pod", A, ""),
            R,
            R,
            ("clear", A, ""),
            R,
            ("report", A, "a/P0"),
            R,
            R,
            ("clear", A, ""),
            R,
            ("tick", "", "10"),
            R,
        ],
    ),
    # Quarantined -> Recovering before the drain's pass; Quarantined -> Drained.
    "quarantine": (
        replace(BASE, mode=Mode.QUARANTINE),
        [
            ("report", A, "a/P0"),
            R,
            R,
            ("clear", A, ""),
            R,
            ("report", B, "b/P0"),
            ("reconcile", B, ""),
            ("reconcile", B, ""),
        ],
    ),
    # Detected -> AwaitingApproval -> Detected (approved) | Resolved | Failed (expired).
    "approval": (
        CONFIGS["approval"],
        [
            ("report", A, "a/P0"),
            R,
            ("answer", A, APPROVED),
            R,
            ("report", B, "b/P0"),
            ("reconcile", B, ""),
            ("answer", B, REJECTED),
            ("reconcile", B, ""),
            ("report", C, "c/P0"),
            ("reconcile", C, ""),
            ("tick", "", "90"),
            ("reconcile", C, ""),
        ],
    ),
    # Past the breaker: Held; released: Quarantined; an escalated P1 meets it:
    # Detected -> Held; a cleared one: Held -> Resolved; approval while held.
    "breaker": (
        BASE,
        [
            ("report", A, "a/P0"),
            R,
            ("report", B, "b/P0"),
            ("reconcile", B, ""),
            ("report", C, "c/P0"),
            ("reconcile", C, ""),
            ("release", C, ""),
            ("reconcile", C, ""),
        ],
    ),
    "breaker-p1": (
        BASE,
        [
            ("report", A, "a/P0"),
            R,
            ("report", B, "b/P0"),
            ("reconcile", B, ""),
            ("report", C, "c/P1"),
            ("reconcile", C, ""),
            ("tick", "", "40"),
            ("reconcile", C, ""),
            ("clear", C, ""),
            ("reconcile", C, ""),
        ],
    ),
    "held-asks": (
        BASE,
        [
            ("report", A, "a/P0"),
            R,
            ("report", B, "b/P0"),
            ("reconcile", B, ""),
            ("report", C, "c/P0"),
            ("reconcile", C, ""),
            ("config", "", "approval"),  # approval turned on while the fault is held
            ("reconcile", C, ""),
        ],
    ),
    # A newer fault supersedes an older one wherever it stands: Draining, Drained,
    # Quarantined -> Resolved; one that clears mid-drain: Draining -> Recovering.
    "superseded": (
        BASE,
        [
            ("report", A, "a/P0"),
            R,
            ("report", A, "b/P0"),
            R,
            R,
            R,
            ("report", A, "d/P0"),
            R,
            ("report", B, "a/P0"),
            ("reconcile", B, ""),
            ("clear", B, ""),
            ("reconcile", B, ""),
        ],
    ),
    "superseded-fenced": (
        replace(BASE, mode=Mode.QUARANTINE),
        [("report", A, "a/P0"), R, R, ("report", A, "b/P0"), R],
    ),
    # A fault that clears before its node is fenced: Detected -> Resolved.
    "watched": (
        BASE,
        [("report", A, "a/P1"), R, ("clear", A, ""), R],
    ),
}


def test_every_declared_move_is_one_a_plan_makes() -> None:
    """The table is not looser than the plans: every move it declares for a node's
    record is made by one of these walks (Canary is a device record's)."""
    made: set[tuple[Phase, Phase]] = set()
    for config, script in SCRIPTS.values():
        made |= _walk(config, script)
    declared = {
        (before, after)
        for before, onward in TRANSITIONS.items()
        for after in onward
        if Phase.CANARY not in (before, after)
    }
    assert [f"{b} -> {a}" for b, a in sorted(declared - made)] == []
    assert made - declared == set()
