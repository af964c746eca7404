"""The recently-handled rule, decided by the policy with the signal, once: a fault
this controller marked handled a moment ago is skipped while its taint is ours."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gpuheal.config import Config
from gpuheal.model import (
    HANDLED_FAULT_ID,
    MANAGED_LABEL,
    STATE_LABEL,
    STATE_MAINTENANCE,
    FaultSignal,
    Mode,
    Phase,
    Severity,
)
from gpuheal.policy.actions import NodeState
from gpuheal.policy.plan import plan
from gpuheal.policy.recent import HandledFaults, handled_lately
from gpuheal.sources import Seen
from gpuheal.sources import annotations as contract
from tests.unit.test_controller_echoes import _reconciler
from tests.unit.test_policy_plan import CONFIG, F1, N1, NOW, faulty, record, tainted

OTHER = "ip-192-168-12-34.us-west-2.compute.internal-20261129T120000Z-77aa01"


def _signal(fault_id: str = F1) -> FaultSignal:
    return FaultSignal(N1, fault_id, "XidCritical79", "node-annotation", Severity.P0)


def test_a_fault_handled_lately_is_skipped_while_our_taint_for_it_is_on_the_node() -> None:
    ours = tainted(faulty())
    assert handled_lately(ours, _signal(), frozenset({F1}), CONFIG)
    assert not handled_lately(ours, _signal(), frozenset(), CONFIG)  # not remembered
    assert not handled_lately(ours, _signal(), frozenset({OTHER}), CONFIG)
    # A person removed the taint: the policy must see it, to note and respect it.
    assert not handled_lately(faulty(), _signal(), frozenset({F1}), CONFIG)
    # Our taint, but for another fault of the node: this one is news.
    assert not handled_lately(tainted(faulty(), OTHER), _signal(), frozenset({F1}), CONFIG)


def test_an_observed_fault_handled_lately_is_skipped_without_a_taint() -> None:
    observe = Config(mode=Mode.OBSERVE)
    assert handled_lately(faulty(), _signal(), frozenset({F1}), observe)


def test_the_plan_skips_a_fault_handled_lately_before_any_other_rule() -> None:
    state = NodeState(tainted(faulty()), records=(record(Phase.DRAINED),))
    skipped = plan(replace(state, handled_lately=frozenset({F1})), CONFIG, NOW)
    assert skipped.actions == () and skipped.suppressed == "memory"
    assert skipped.fault_id == F1 and skipped.requeue_after is None
    # The same state without the memory (after a restart) is planned as ever.
    assert plan(state, CONFIG, NOW).suppressed != "memory"
    for labels in ({MANAGED_LABEL: "false"}, {STATE_LABEL: STATE_MAINTENANCE}):
        node = replace(state.node, labels=state.node.labels | labels)
        remembered = NodeState(node, handled_lately=frozenset({F1}))
        assert plan(remembered, CONFIG, NOW).suppressed == "memory"


def test_the_memory_keeps_each_fault_for_the_ttl_in_force_when_it_was_marked() -> None:
    handled = HandledFaults()
    handled.add(N1, F1, now=0.0, ttl=60.0)
    handled.add(N1, OTHER, now=10.0, ttl=5.0)  # a reload shortened dedupeTtlSeconds
    assert handled.of(N1, now=12.0) == {F1, OTHER}
    assert handled.of(N1, now=20.0) == {F1}
    assert handled.of("ip-10-0-0-1.ec2.internal", now=20.0) == frozenset()
    assert handled.of(N1, now=60.0) == frozenset()
    assert len(handled) == 0
    handled.add(N1, F1, now=100.0, ttl=60.0)
    handled.forget(N1)  # the node was deleted
    assert handled.of(N1, now=101.0) == frozenset()


def test_one_look_at_a_node_decides_its_signal_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: the reconciler computed the node's signal for the recently-handled
    # rule, then the plan computed it again (two reads of the annotations per look).
    reads: list[str] = []

    def counted(seen: Seen) -> tuple[FaultSignal, ...]:
        reads.append(seen.node.name)
        return real(seen)

    real = contract.signals
    monkeypatch.setattr(contract, "signals", counted)

    async def run() -> None:
        loop, _records, _pods = _reconciler()
        # Handled already (by an earlier process): planned, and nothing to do.
        node = replace(faulty(), annotations=faulty().annotations | {HANDLED_FAULT_ID: F1})
        loop.nodes.upsert(node, "1")
        result = await loop.reconciler.reconcile(N1)
        assert result.requeue_after is None and not result.rate_limited

    asyncio.run(run())
    assert reads == [N1]
