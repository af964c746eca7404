"""A person's release of a fault the breaker holds (the pure policy): that one fault
goes past the full breaker once; every other held fault stays held."""

from __future__ import annotations

from dataclasses import replace

from gpuheal.clock import iso
from gpuheal.model import TAINT_KEY, ActionEntry, FaultRecord, Phase, Taint
from gpuheal.policy.actions import AddTaint, Emit, NodeState, Plan, UpdateRecord
from gpuheal.policy.plan import plan
from gpuheal.policy.release import refusal, release_patch, released
from gpuheal.values import taint_value
from gpuheal.vocabulary import Entry, Reason
from tests.corpus import EKS_NODES
from tests.helpers import plan_entries
from tests.unit.test_policy_plan import CONFIG, F1, N1, NOW, faulty, gpu_pod, healthy, record

BY, AT = "alice@example.com", "2026-11-29T11:58:00Z"
# The breaker holds one node, and one other node is quarantined: it is full.
BREAKER = replace(CONFIG, breaker_max_nodes=1, breaker_max_percent=100)
FULL = frozenset({EKS_NODES[2]})


def held(released_by: str = "", released_at: str = "") -> FaultRecord:
    entry = ActionEntry(iso(NOW), "hold", "breaker")
    return record(
        Phase.HELD, actions=(entry,), resource_version="41",
        released_by=released_by, released_at=released_at,
    )  # fmt: skip


def looks(record: FaultRecord, node: str = N1, fault_id: str = F1) -> Plan:
    state = NodeState(
        faulty(node, fault_id), pods=(gpu_pod("trainer-0", node),), records=(record,),
        gpu_nodes=8, quarantined=FULL,
    )  # fmt: skip
    return plan(state, BREAKER, NOW)


def taints(p: Plan) -> list[AddTaint]:
    return [a for a in p.actions if isinstance(a, AddTaint)]


def test_a_held_fault_stays_held_while_the_breaker_is_full() -> None:
    p = looks(held())
    assert not taints(p) and p.suppressed == "held"


def test_a_released_held_fault_is_quarantined_past_the_full_breaker_once() -> None:
    p = looks(held(released_by=BY, released_at=AT))
    assert [t.node for t in taints(p)] == [N1] and p.new_quarantine
    assert [(e.action, e.detail) for e in plan_entries(p)][:2] == [
        (Entry.RELEASED, f"by {BY} at {AT}"),
        ("taint", ""),
    ]
    assert next(a.reason for a in p.actions if isinstance(a, Emit)) == Reason.RELEASED
    # Once tainted its record is Quarantined: the release is spent, nothing repeats.
    done = replace(held(released_by=BY, released_at=AT), phase=Phase.QUARANTINED)
    ours = Taint(TAINT_KEY, "NoSchedule", taint_value(F1))
    tainted = NodeState(
        replace(faulty(), taints=(ours,)), records=(done,), gpu_nodes=8, quarantined=FULL | {N1}
    )
    again = plan(tainted, BREAKER, NOW)
    assert not taints(again)
    assert Reason.RELEASED not in [a.reason for a in again.actions if isinstance(a, Emit)]


def test_the_release_is_said_once_even_when_the_taint_waits_a_pass() -> None:
    said = ActionEntry(iso(NOW), Entry.RELEASED, "ok", f"by {BY} at {AT}")
    rec = held(released_by=BY, released_at=AT)
    p = looks(replace(rec, actions=(*rec.actions, said)))
    assert taints(p)
    assert Reason.RELEASED not in [a.reason for a in p.actions if isinstance(a, Emit)]
    assert not plan_entries(p, Entry.RELEASED)


def test_only_the_released_fault_passes_every_other_held_fault_stays_held() -> None:
    other, other_fault = EKS_NODES[1], f"{EKS_NODES[1]}-20261129T115959Z-9a0b1c"
    mine = looks(held(released_by=BY, released_at=AT))
    theirs = looks(record(Phase.HELD, node=other, fault_id=other_fault), other, other_fault)
    assert taints(mine) and not taints(theirs) and theirs.suppressed == "held"


def test_a_release_of_a_fault_that_cleared_meanwhile_does_nothing() -> None:
    state = NodeState(healthy(), records=(held(released_by=BY, released_at=AT),), gpu_nodes=8,
                      quarantined=FULL)  # fmt: skip
    p = plan(state, BREAKER, NOW)
    assert not taints(p)
    assert [a.phase for a in p.actions if isinstance(a, UpdateRecord)] == [Phase.RESOLVED]
    assert Reason.RELEASED not in [a.reason for a in p.actions if isinstance(a, Emit)]


def test_a_release_is_taken_only_on_a_held_unreleased_record() -> None:
    assert refusal(held()) is None
    assert "already released by alice@example.com" in (
        refusal(held(released_by=BY, released_at=AT)) or ""
    )
    assert "not held by the breaker" in (refusal(record(Phase.QUARANTINED)) or "")
    assert released(held(released_by=BY)) and not released(held())
    assert not released(record(Phase.QUARANTINED, released_by=BY))


def test_the_release_patch_is_guarded_by_the_version_checked() -> None:
    body = release_patch(held(), "bob\x00", AT)
    assert body == {
        "metadata": {"resourceVersion": "41"},
        "status": {"release": {"by": "bob", "at": AT}},
    }
