"""Checkpoint before eviction on the fault path: the pure rule (pods' annotations,
config, now) and the drain stage it shapes."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from gpuheal.clock import iso
from gpuheal.config import CheckpointConfig, ConfigError, parse_config
from gpuheal.model import FAULT_REASON, FAULT_SEVERITY, ActionEntry, Phase, PodView, Severity
from gpuheal.policy.actions import Emit, Evict, NodeState, Plan, RequestCheckpoint
from gpuheal.policy.checkpoint import CheckpointStep, next_look, where
from gpuheal.policy.plan import plan
from gpuheal.vocabulary import Entry, Reason
from tests.helpers import plan_entries
from tests.unit.test_policy_plan import CONFIG, NOW, faulty, gpu_pod, kinds, record, tainted

WAIT = 300.0
ASKED = replace(CONFIG, checkpoint=CheckpointConfig(reasons=("XidCritical79",), wait_seconds=WAIT))
DEADLINE = NOW + dt.timedelta(seconds=WAIT)


def later(seconds: float) -> dt.datetime:
    return NOW + dt.timedelta(seconds=seconds)


def asked(pod: PodView, deadline: dt.datetime = DEADLINE, done: str = "") -> PodView:
    """The pod as the API serves it once asked (and, with `done`, once it said so)."""
    return replace(pod, checkpoint_requested=iso(deadline, "seconds"), checkpoint_done=done)


def draining(*pods: PodView, entries: tuple[ActionEntry, ...] = ()) -> NodeState:
    rec = record(Phase.DRAINING, actions=entries)
    return NodeState(tainted(faulty()), pods=pods, records=(rec,), gpu_nodes=10)


def said(p: Plan) -> list[tuple[str, str, str]]:
    """What the plan's record entries say, their times aside: (action, result, detail)."""
    return [(e.action, e.result, e.detail) for e in plan_entries(p)]


def evicted(p: Plan) -> list[str]:
    return [a.pod.name for a in p.actions if isinstance(a, Evict)]


REQUEST_ENTRY = ActionEntry(iso(NOW), Entry.CHECKPOINT_REQUESTED, "waiting", "asked")

# -- the rule ------------------------------------------------------------------------


def test_a_pod_not_yet_asked_is_asked_with_a_deadline_of_now_plus_the_wait() -> None:
    standing = where(gpu_pod("a"), ASKED.checkpoint, NOW)
    assert standing.step is CheckpointStep.REQUEST
    assert standing.deadline == "2026-11-29T12:05:00Z"
    assert not standing.evict_now


def test_an_asked_pod_waits_until_its_own_deadline_then_times_out() -> None:
    pod = asked(gpu_pod("a"))
    assert where(pod, ASKED.checkpoint, later(299)).step is CheckpointStep.WAITING
    assert where(pod, ASKED.checkpoint, later(300)).step is CheckpointStep.TIMED_OUT
    assert where(pod, ASKED.checkpoint, later(300)).evict_now


def test_the_deadline_is_the_pods_not_the_configs_nor_the_process() -> None:
    # A restarted controller (or a new leader, or one with a new waitSeconds) reads
    # the deadline from the pod: it neither asks again nor moves the deadline.
    pod = asked(gpu_pod("a"), deadline=later(120))
    longer = CheckpointConfig(reasons=("XidCritical79",), wait_seconds=3600)
    standing = where(pod, longer, later(60))
    assert standing.step is CheckpointStep.WAITING
    assert standing.deadline == iso(later(120), "seconds")
    assert standing.seconds_left(later(60)) == 60
    assert where(pod, longer, later(120)).step is CheckpointStep.TIMED_OUT


def test_a_pod_that_says_done_goes_at_once_even_before_its_deadline() -> None:
    pod = asked(gpu_pod("a"), done=iso(later(10), "seconds"))
    standing = where(pod, ASKED.checkpoint, later(10))
    assert standing.step is CheckpointStep.DONE and standing.evict_now


def test_a_deadline_that_is_not_a_time_does_not_hold_the_drain() -> None:
    pod = replace(gpu_pod("a"), checkpoint_requested="soon")
    standing = where(pod, ASKED.checkpoint, NOW)
    assert standing.step is CheckpointStep.TIMED_OUT and standing.deadline == ""


def test_the_next_look_is_the_first_deadline_of_the_pods_still_waiting() -> None:
    standing = [
        where(asked(gpu_pod("a"), later(100)), ASKED.checkpoint, NOW),
        where(asked(gpu_pod("b"), later(40)), ASKED.checkpoint, NOW),
        where(asked(gpu_pod("c"), later(10), done="yes"), ASKED.checkpoint, NOW),
    ]
    assert next_look(standing, NOW) == 40
    assert next_look(standing[2:], NOW) is None


@pytest.mark.parametrize(
    ("reason", "severity", "config", "waits"),
    [
        ("XidCritical79", Severity.P0, CheckpointConfig(), False),  # off by default
        ("XidCritical79", Severity.P0, CheckpointConfig(reasons=("XidCritical79",)), True),
        ("XidCritical48", Severity.P0, CheckpointConfig(reasons=("XidCritical79",)), False),
        ("EccDbe", Severity.P1, CheckpointConfig(severities=(Severity.P1,)), True),
        ("EccDbe", Severity.P0, CheckpointConfig(severities=(Severity.P1,)), False),
        (
            "XidCritical79",
            Severity.P0,
            CheckpointConfig(severities=(Severity.P0,), immediate_reasons=("XidCritical79",)),
            False,
        ),
    ],
)
def test_which_faults_wait_for_a_checkpoint(
    reason: str, severity: Severity, config: CheckpointConfig, waits: bool
) -> None:
    assert config.applies(reason, severity) is waits


def test_the_config_keys_and_their_checks() -> None:
    config = parse_config(
        {
            "checkpoint": {
                "reasons": ["XidCritical79"],
                "severities": ["P1"],
                "immediateReasons": ["XidCritical48"],
                "waitSeconds": 120,
            }
        }
    )
    assert config.checkpoint == CheckpointConfig(
        reasons=("XidCritical79",),
        severities=(Severity.P1,),
        immediate_reasons=("XidCritical48",),
        wait_seconds=120,
    )
    with pytest.raises(ConfigError, match=r"checkpoint\.severities: P2 faults are only observed"):
        parse_config({"checkpoint": {"severities": ["P2"]}})
    with pytest.raises(ConfigError, match=r"checkpoint\.immediateReasons: XidCritical79 also in"):
        parse_config(
            {"checkpoint": {"reasons": ["XidCritical79"], "immediateReasons": ["XidCritical79"]}}
        )


# -- the drain stage -----------------------------------------------------------------


def test_a_matching_faults_first_drain_asks_every_gpu_pod_records_it_and_evicts_none() -> None:
    p = plan(NodeState(faulty(), pods=(gpu_pod("a"), gpu_pod("b")), gpu_nodes=10), ASKED, NOW)
    assert p.new_quarantine
    assert not p.moves_pods
    asks = [a for a in p.drain if isinstance(a, RequestCheckpoint)]
    assert [(a.pod.name, a.deadline) for a in asks] == [
        ("a", "2026-11-29T12:05:00Z"),
        ("b", "2026-11-29T12:05:00Z"),
    ]
    assert kinds(Plan(drain=p.drain)) == [
        *("RequestCheckpoint", "RequestCheckpoint", "UpdateRecord", "Emit"),
    ]
    (entry,) = said(Plan(drain=p.drain))
    assert entry == (
        Entry.CHECKPOINT_REQUESTED,
        "waiting",
        "2 GPU pod(s) asked to checkpoint by 2026-11-29T12:05:00Z: ml/a, ml/b",
    )
    (told,) = [a for a in p.drain if isinstance(a, Emit)]
    assert told.reason == Reason.CHECKPOINT_REQUESTED
    assert p.requeue_after == WAIT  # at the deadline, not a poll


def test_while_pods_wait_nothing_is_written_and_the_node_is_looked_at_at_the_deadline() -> None:
    state = draining(asked(gpu_pod("a")), asked(gpu_pod("b")), entries=(REQUEST_ENTRY,))
    p = plan(state, ASKED, later(100))
    assert p.actions == ()
    assert p.requeue_after == 200


def test_a_pod_saying_done_is_evicted_at_once_and_the_record_says_checkpointed() -> None:
    state = draining(
        asked(gpu_pod("a"), done=iso(later(30), "seconds")),
        asked(gpu_pod("b")),
        entries=(REQUEST_ENTRY,),
    )
    p = plan(state, ASKED, later(30))
    assert evicted(p) == ["a"]
    assert (Entry.CHECKPOINTED, "ok", "ml/a: said done") in said(p)
    assert p.requeue_after is not None and p.requeue_after <= 270  # b's deadline, or sooner


def test_at_the_deadline_the_rest_are_evicted_and_the_record_says_timed_out() -> None:
    state = draining(asked(gpu_pod("b")), entries=(REQUEST_ENTRY,))
    p = plan(state, ASKED, later(300))
    assert evicted(p) == ["b"]
    assert (
        Entry.CHECKPOINT_TIMEOUT,
        "timed-out",
        "ml/b: not done by 2026-11-29T12:05:00Z",
    ) in said(p)


def test_a_restart_mid_wait_neither_asks_again_nor_moves_the_deadline() -> None:
    # The new process has no memory: only the pods (asked at NOW) and the record.
    state = draining(asked(gpu_pod("a")), entries=(REQUEST_ENTRY,))
    after_restart = plan(state, ASKED, later(250))
    assert not [a for a in after_restart.actions if isinstance(a, RequestCheckpoint)]
    assert after_restart.requeue_after == 50
    assert evicted(plan(state, ASKED, later(300))) == ["a"]


def test_a_request_the_record_lost_is_recorded_without_asking_again() -> None:
    # Stopped between the pods' annotations and the record's write.
    p = plan(draining(asked(gpu_pod("a"))), ASKED, later(5))
    assert kinds(p) == ["UpdateRecord", "Emit"]
    assert said(p)[0][0] == Entry.CHECKPOINT_REQUESTED


def test_a_blocked_eviction_tried_again_does_not_repeat_the_checkpoint_outcome() -> None:
    told = ActionEntry(iso(later(300)), Entry.CHECKPOINT_TIMEOUT, "timed-out", "ml/b: not done")
    state = draining(asked(gpu_pod("b")), entries=(REQUEST_ENTRY, told))
    p = plan(state, ASKED, later(400))
    assert evicted(p) == ["b"]
    assert [e[0] for e in said(p)] == ["evict"]


def test_a_pod_that_leaves_on_its_own_needs_no_eviction() -> None:
    state = draining(replace(asked(gpu_pod("a")), deleting=True), entries=(REQUEST_ENTRY,))
    p = plan(state, ASKED, later(10))
    assert evicted(p) == []
    assert not [a for a in p.actions if isinstance(a, RequestCheckpoint)]


def test_a_fault_that_does_not_match_evicts_at_once_as_before() -> None:
    other = faulty(**{FAULT_REASON: "XidCritical48"})
    p = plan(NodeState(other, pods=(gpu_pod("a"), gpu_pod("b")), gpu_nodes=10), ASKED, NOW)
    assert evicted(p) == ["a", "b"]
    assert not [a for a in p.actions if isinstance(a, RequestCheckpoint)]


def test_an_immediate_reason_moves_at_once_even_when_its_severity_waits() -> None:
    config = replace(
        CONFIG,
        checkpoint=CheckpointConfig(
            severities=(Severity.P0,), immediate_reasons=("XidCritical79",)
        ),
    )
    p = plan(NodeState(faulty(), pods=(gpu_pod("a"),), gpu_nodes=10), config, NOW)
    assert evicted(p) == ["a"]
    p1 = faulty(**{FAULT_REASON: "EccDbe", FAULT_SEVERITY: "P0"})
    waits = plan(NodeState(p1, pods=(gpu_pod("a"),), gpu_nodes=10), config, NOW)
    assert evicted(waits) == []
