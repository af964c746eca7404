"""The pure core of `gpuheal rollout`: the order, the budget, the next nodes, and
the health gate's driver rule during a roll-out."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpuheal.config import Config, PoolConfig, PoolsConfig
from gpuheal.model import DRIVER_VERSION
from gpuheal.policy.gate import CheckResult, GateFacts, evaluate
from gpuheal.policy.rollout import (
    Budget,
    NodeProgress,
    RolloutDriver,
    RolloutStep,
    Target,
    allowed_unavailable,
    batch_of,
    driver_rollout_view,
    next_to_start,
    plan_order,
    rollout_name,
)
from gpuheal.values import is_subdomain
from tests.corpus import eks_node_names

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)
NODES = sorted(eks_node_names(12))
OLD, NEW = "550.54.15", "560.35.03"
CONFIG = Config()


def budget(out: int = 0, allowed: int = 3, fleet_out: int = 0, fleet_allowed: int = 100) -> Budget:
    return Budget(frozenset(f"busy-{i}" for i in range(out)), allowed, fleet_out, fleet_allowed)


def with_steps(progress: list[NodeProgress], steps: dict[str, RolloutStep]) -> list[NodeProgress]:
    return [replace(p, step=steps.get(p.name, p.step)) for p in progress]


def test_the_canary_is_batch_0_then_batches_of_the_batch_size_in_name_order() -> None:
    order = plan_order(reversed(NODES), canary=1, batch_size=3)
    assert [p.name for p in order] == NODES
    assert [p.batch for p in order] == [0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4]
    assert [batch_of(i, 0, 5) for i in range(7)] == [0, 0, 0, 0, 0, 1, 1]


def test_only_the_canary_starts_first_and_nothing_else_until_it_is_done() -> None:
    order = plan_order(NODES, canary=1, batch_size=3)
    assert next_to_start(order, budget()) == NODES[:1]
    waiting = with_steps(order, {NODES[0]: RolloutStep.WAITING})
    assert next_to_start(waiting, budget(out=1)) == []
    done = with_steps(order, {NODES[0]: RolloutStep.DONE})
    assert next_to_start(done, budget()) == NODES[1:4]


def test_a_batch_takes_only_as_many_nodes_as_the_budget_has_room_for() -> None:
    done = with_steps(plan_order(NODES, canary=1, batch_size=3), {NODES[0]: RolloutStep.DONE})
    # One node of the pool quarantined by a fault: two of the batch now, the third later.
    assert next_to_start(done, budget(out=1)) == NODES[1:3]
    assert next_to_start(done, budget(out=3)) == []
    # The breaker's budget, fleet-wide, binds too.
    assert next_to_start(done, budget(fleet_out=99)) == NODES[1:2]
    assert next_to_start(done, budget(fleet_out=100)) == []


def test_the_first_held_node_stops_every_start() -> None:
    done = with_steps(
        plan_order(NODES, canary=1, batch_size=3),
        {NODES[0]: RolloutStep.DONE, NODES[1]: RolloutStep.FAILED_HELD, NODES[2]: RolloutStep.DONE},
    )
    assert next_to_start(done, budget(allowed=12)) == []


def test_the_budget_is_the_count_and_the_share_of_the_pool_at_least_one() -> None:
    assert allowed_unavailable(12, 3, None) == 3
    assert allowed_unavailable(12, 3, 10) == 1  # 10% of 12 rounds down to 1
    assert allowed_unavailable(5, 3, 10) == 1  # 0 rounds up: something must move
    assert allowed_unavailable(100, 3, 50) == 3
    assert budget(out=2, allowed=3, fleet_out=5, fleet_allowed=6).room == 1
    assert budget(out=5, allowed=3).room == 0


@given(
    st.integers(1, 40),
    st.integers(0, 5),
    st.integers(1, 8),
    st.integers(1, 10),
    st.data(),
)
def test_starts_never_exceed_the_room_nor_leave_the_current_batch(
    size: int, canary: int, batch_size: int, allowed: int, data: st.DataObject
) -> None:
    names = [f"n{i:02d}" for i in range(size)]
    order = plan_order(names, canary, batch_size)
    steps = data.draw(st.lists(st.sampled_from(list(RolloutStep)), min_size=size, max_size=size))
    progress = [replace(p, step=s) for p, s in zip(order, steps, strict=True)]
    out = data.draw(st.integers(0, allowed + 2))
    started = next_to_start(progress, budget(out=out, allowed=allowed))
    assert len(started) <= max(0, allowed - out)
    by_name = {p.name: p for p in progress}
    assert all(by_name[n].step is RolloutStep.PENDING for n in started)
    if started:
        batch = by_name[started[0]].batch
        assert {by_name[n].batch for n in started} == {batch}
        assert all(p.step is RolloutStep.DONE for p in progress if p.batch < batch)
        assert not any(p.step is RolloutStep.FAILED_HELD for p in progress)


def test_the_roll_out_is_named_after_its_pool_validly_and_distinctly() -> None:
    names = {rollout_name(p) for p in ("a100-80g", "A100_80G", "x" * 63, "h100.sxm", "-odd-")}
    assert len(names) == 5
    assert all(is_subdomain(n) for n in names)
    assert rollout_name("a100-80g") == rollout_name("a100-80g")
    assert rollout_name("a100-80g").startswith("rollout-a100-80g.")


def test_the_target_says_what_is_missing() -> None:
    target = Target(driver_version=NEW, labels={"nvidia.com/cuda.runtime.major": "12"})
    assert target.missing({}, {DRIVER_VERSION: OLD}) == [
        f"driver {OLD}, not {NEW}",
        "label nvidia.com/cuda.runtime.major=12",
    ]
    assert target.missing({"nvidia.com/cuda.runtime.major": "12"}, {DRIVER_VERSION: NEW}) == []


# -- the gate's driver rule ------------------------------------------------------------


def gate(
    have: str, peers: dict[str, int], rollout: RolloutDriver | None, config: Config = CONFIG
) -> tuple[CheckResult, str]:
    facts = GateFacts(
        node="n1",
        ready=True,
        labels={"nvidia.com/gpu.product": "H100"},
        annotations={DRIVER_VERSION: have},
        pool_drivers=peers,
        rollout=rollout,
    )
    check = next(c for c in evaluate(facts, config, NOW, None).checks if c.name == "driver")
    return check.result, check.reason


def test_a_rolled_node_must_run_the_target_not_the_pools_majority() -> None:
    rolled = RolloutDriver(NEW, rolled=True)
    assert gate(NEW, {OLD: 11}, None)[0] is CheckResult.FAIL  # the rule before roll-outs
    assert gate(NEW, {OLD: 11}, rolled) == (
        CheckResult.PASS,
        f"driver {NEW}, as pool H100 (rolled to {NEW})",
    )
    assert gate(OLD, {OLD: 11}, rolled)[0] is CheckResult.FAIL


def test_a_node_not_rolled_yet_runs_what_the_pool_ran_before_even_once_outnumbered() -> None:
    waiting = RolloutDriver(NEW, rolled=False)
    assert gate(OLD, {NEW: 9, OLD: 2}, waiting)[0] is CheckResult.PASS
    assert gate(NEW, {NEW: 9, OLD: 2}, waiting)[0] is CheckResult.FAIL
    assert gate(OLD, {NEW: 11}, waiting)[0] is CheckResult.FAIL  # everyone else moved on
    config = Config(pools=PoolsConfig(by_name={"H100": PoolConfig(driver_version=OLD)}))
    assert gate(OLD, {NEW: 11}, waiting, config)[0] is CheckResult.PASS  # configured wins


def test_the_gates_view_of_a_roll_out_per_node() -> None:
    progress = [
        NodeProgress("a", 0, RolloutStep.DONE),
        NodeProgress("b", 1, RolloutStep.GATING),
        NodeProgress("c", 1, RolloutStep.DRAINING),
        NodeProgress("d", 2, RolloutStep.PENDING),
    ]
    views = {n: driver_rollout_view(NEW, progress, n) for n in "abcde"}
    assert {n: v.rolled for n, v in views.items() if v} == {
        "a": True,
        "b": True,
        "c": False,
        "d": False,
        "e": False,
    }
    assert driver_rollout_view("", progress, "a") is None  # a roll-out of labels only
