"""Which nodes gpuheal manages (gpuheal/policy/nodes.py: managed, why_unmanaged),
one rule for faults, maintenance requests and roll-outs (issue 41: a request on a
node without GPUs was carried out), and what a roll-out does with a node of its
order that is no longer managed (gpuheal/policy/rollout.py: unmanaged_step)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuheal.config import Config
from gpuheal.model import MANAGED_LABEL
from gpuheal.policy.nodes import gpu_node, managed, opted_out, why_unmanaged
from gpuheal.policy.rollout import (
    DETAIL_MAX,
    Budget,
    NodeProgress,
    RolloutStep,
    next_to_start,
    unmanaged_step,
)

GPU_LABELS = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8"}
INFRA_LABELS = {"kubernetes.io/os": "linux", "node-role.kubernetes.io/control-plane": ""}
DEFAULT = Config()  # nodeSelector {nvidia.com/gpu.present: "true"} (the gpu-operator preset)
BY_CAPACITY = Config(node_selector={})  # every other platform's preset: GPU capacity
STAMP = "2026-12-06T12:00:00Z"


@pytest.mark.parametrize("config", [DEFAULT, BY_CAPACITY], ids=["selector", "capacity"])
def test_a_node_without_gpus_or_gpu_labels_is_not_managed_and_says_why(config: Config) -> None:
    """The issue's node: an infrastructure node (no GPU capacity, no GPU labels)."""
    assert not managed(INFRA_LABELS, 0, config)
    why = why_unmanaged(INFRA_LABELS, 0, config)
    if config.node_selector:
        assert why == (
            "the controller's nodeSelector does not match it (it lacks nvidia.com/gpu.present=true)"
        )
    else:
        assert why == (
            "it has no GPU capacity (nvidia.com/gpu, nvidia.com/mig-*) and the controller's "
            "nodeSelector is empty"
        )


@pytest.mark.parametrize("config", [DEFAULT, BY_CAPACITY], ids=["selector", "capacity"])
def test_a_gpu_node_is_managed_until_it_is_opted_out(config: Config) -> None:
    assert managed(GPU_LABELS, 8, config)
    assert why_unmanaged(GPU_LABELS, 8, config) is None
    opted = {**GPU_LABELS, MANAGED_LABEL: "false"}
    assert not managed(opted, 8, config)
    assert why_unmanaged(opted, 8, config) == f"it is opted out ({MANAGED_LABEL}=false)"
    # Only "false" opts out.
    assert managed({**GPU_LABELS, MANAGED_LABEL: "true"}, 8, config)


def test_a_selector_names_what_the_node_lacks_and_nothing_it_has() -> None:
    config = Config(node_selector={"pool": "a", "nvidia.com/gpu.present": "true"})
    why = why_unmanaged({"pool": "b", "nvidia.com/gpu.present": "true"}, 8, config)
    assert why == "the controller's nodeSelector does not match it (it lacks pool=a)"


LABELS = st.dictionaries(
    st.sampled_from(["nvidia.com/gpu.present", "pool", MANAGED_LABEL]),
    st.sampled_from(["true", "false", "a"]),
)
SELECTORS = st.dictionaries(
    st.sampled_from(["nvidia.com/gpu.present", "pool"]), st.sampled_from(["true", "a"])
)


@given(labels=LABELS, capacity=st.integers(0, 8), selector=SELECTORS)
def test_managed_is_a_gpu_node_not_opted_out_and_a_reason_exactly_when_not(
    labels: dict[str, str], capacity: int, selector: dict[str, str]
) -> None:
    config = Config(node_selector=selector)
    is_managed = managed(labels, capacity, config)
    assert is_managed == (gpu_node(labels, capacity, config) and not opted_out(labels))
    assert (why_unmanaged(labels, capacity, config) is None) == is_managed


def progress(step: RolloutStep, detail: str = "") -> NodeProgress:
    return NodeProgress("n1", 1, step, since="2026-12-06T11:00:00Z", detail=detail)


WHY = f"it is opted out ({MANAGED_LABEL}=false)"


def test_a_pending_node_no_longer_managed_waits_saying_why_and_is_not_started() -> None:
    waiting = unmanaged_step(progress(RolloutStep.PENDING), WHY, STAMP)
    assert waiting.step is RolloutStep.PENDING
    assert waiting.detail == f"waits: not managed by gpuheal: {WHY}"
    # Said once: the next pass finds nothing to change (no second Event).
    assert unmanaged_step(waiting, WHY, STAMP) == waiting
    # The driver leaves it out of the nodes it may start (controller/rollouts.py).
    room = Budget(frozenset(), 3, 0, 100)
    assert next_to_start([waiting], room, {waiting.name}) == []


@pytest.mark.parametrize("step", [RolloutStep.DRAINING, RolloutStep.WAITING, RolloutStep.GATING])
def test_a_node_in_flight_no_longer_managed_is_held_for_a_person(step: RolloutStep) -> None:
    held = unmanaged_step(progress(step), WHY, STAMP)
    assert held == replace(
        progress(step),
        step=RolloutStep.FAILED_HELD,
        since=STAMP,
        detail=f"not managed by gpuheal: {WHY}",
    )
    assert unmanaged_step(held, WHY, STAMP) == held  # held once, told once


@pytest.mark.parametrize("step", [RolloutStep.DONE, RolloutStep.FAILED_HELD])
def test_a_done_or_held_node_stays_as_it_is(step: RolloutStep) -> None:
    assert unmanaged_step(progress(step, "gate passed"), WHY, STAMP) == progress(
        step, "gate passed"
    )


def test_a_long_reason_is_cut_as_the_status_write_cuts_it() -> None:
    long = "x" * 2000
    for step in (RolloutStep.PENDING, RolloutStep.DRAINING):
        once = unmanaged_step(progress(step), long, STAMP)
        assert len(once.detail) == DETAIL_MAX
        assert unmanaged_step(once, long, STAMP) == once
