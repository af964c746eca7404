"""The repair step of the pure policy: after the drain, one request per attempt,
within the budget, escalating reset -> reboot -> a person; and the two
annotations' format."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.clock import iso
from gpuheal.config import Config, ConfigError, RepairConfig, parse_config
from gpuheal.model import (
    FAULT_DEVICES,
    FAULT_ID,
    FAULT_REASON,
    FAULT_SEVERITY,
    HANDLED_FAULT_ID,
    REPAIR_REQUEST,
    REPAIR_RESULT,
    STATUS,
    TAINT_KEY,
    ActionEntry,
    Condition,
    FaultRecord,
    FaultSignal,
    NodeView,
    Phase,
    PodView,
    Severity,
    Taint,
    fault_record_name,
)
from gpuheal.policy.actions import Emit, NodeState, Plan, UpdateRecord
from gpuheal.policy.breaker import repair_capacity
from gpuheal.policy.plan import plan
from gpuheal.policy.repair import RequestRepair, recommended, repair_metric
from gpuheal.policy.repairwire import (
    Outcome,
    RepairRequest,
    RepairResult,
    decode_request,
    decode_result,
    fault_digest,
)
from gpuheal.values import taint_value
from gpuheal.vocabulary import Entry, Reason
from gpuheal.xid import Action
from tests.corpus import EKS_NODES, GPU_UUIDS
from tests.helpers import NO_GUARD, plan_entries

NOW = dt.datetime(2026, 12, 1, 9, 30, 0, tzinfo=dt.UTC)
N1 = EKS_NODES[0]
F1 = f"{N1}-20261201T092500Z-4f1c2a"
DIGEST = fault_digest(F1)
GPU = GPU_UUIDS[0]
ACT = RepairConfig(enabled=True, mode="act")
# The disruption guard's actions are tests/unit/test_policy_disruption.py's: off
# here, so that these plans are this module's rules alone.
CONFIG = Config(breaker_max_nodes=100, breaker_max_percent=100, repair=ACT, autoscalers=NO_GUARD)


def node(reason: str = "EccUncontained95", devices: str = GPU, **annotations: str) -> NodeView:
    """A quarantined, handled node still reporting its fault (P0, as escalated)."""
    return NodeView(
        name=N1,
        resource_version="7",
        labels={"nvidia.com/gpu.present": "true"},
        annotations={
            STATUS: "faulty",
            FAULT_ID: F1,
            FAULT_REASON: reason,
            FAULT_DEVICES: devices,
            FAULT_SEVERITY: "P0",
            HANDLED_FAULT_ID: F1,
        }
        | annotations,
        taints=(Taint(TAINT_KEY, "NoExecute", taint_value(F1)),),
        gpus=8,
        conditions=(Condition("Ready", "True"),),
    )


def drained(*entries: ActionEntry, reason: str = "EccUncontained95") -> FaultRecord:
    return FaultRecord(
        name=fault_record_name(N1, F1),
        node=N1,
        fault_id=F1,
        phase=Phase.DRAINED,
        reason=reason,
        source="node-annotation",
        actions=(ActionEntry(iso(NOW - dt.timedelta(minutes=5)), "drain", "ok"), *entries),
    )


def state(n: NodeView, r: FaultRecord, **kw: object) -> NodeState:
    return NodeState(node=n, records=(r,), gpu_nodes=10, **kw)  # type: ignore[arg-type]


def requests(p: Plan) -> list[RequestRepair]:
    return [a for a in p.actions if isinstance(a, RequestRepair)]


# tests/unit/test_policy_repair_approval.py imports it by this name.
entries = plan_entries


def events(p: Plan, reason: str) -> list[Emit]:
    return [a for a in p.actions if isinstance(a, Emit) and a.reason == reason]


def asked(action: Action, attempt: int, at: dt.datetime = NOW) -> str:
    return RepairRequest(action, DIGEST, attempt, iso(at, "seconds")).encode()


def answered(action: Action, attempt: int, outcome: Outcome, at: dt.datetime = NOW) -> str:
    return RepairResult(action, DIGEST, attempt, outcome, iso(at, "seconds"), "nvidia-smi").encode()


def entry(action: str, detail: str, result: str = "ok", at: dt.datetime = NOW) -> ActionEntry:
    return ActionEntry(iso(at), action, result, detail)


def test_off_by_default_nothing_is_asked() -> None:
    p = plan(state(node(), drained()), replace(CONFIG, repair=RepairConfig()), NOW)
    assert not requests(p) and not p.repair


def test_a_drained_reset_fault_asks_the_agent_once_for_its_gpus() -> None:
    p = plan(state(node(), drained()), CONFIG, NOW)
    (request,) = requests(p)
    assert request.node == N1
    assert decode_request(request.value) == RepairRequest(
        Action.RESET_GPU, DIGEST, 1, iso(NOW, "seconds")
    )
    assert p.new_repair
    (said,) = plan_entries(p, Entry.REPAIR_REQUESTED)
    assert said.detail == f"reset-gpu attempt 1: reset {GPU}"
    assert len(events(p, Reason.REPAIR_REQUESTED)) == 1
    # The request comes before its record entry (the durable note follows the act).
    kinds = [type(a).__name__ for a in p.repair]
    assert kinds == ["RequestRepair", "UpdateRecord", "Emit"]


def test_a_request_on_the_node_is_never_made_again() -> None:
    recorded = drained(
        entry(Entry.REPAIR_REQUESTED, f"reset-gpu attempt 1: reset {GPU}", "waiting")
    )
    on_node = node(**{REPAIR_REQUEST: asked(Action.RESET_GPU, 1)})
    p = plan(state(on_node, recorded), CONFIG, NOW + dt.timedelta(seconds=30))
    assert not requests(p) and not p.actions
    assert p.suppressed == "repairing"
    assert p.requeue_after == pytest.approx(CONFIG.repair.result_timeout_seconds - 30)


def test_a_request_the_record_does_not_show_is_recorded_not_repeated() -> None:
    """The controller was killed between the request and its record entry."""
    on_node = node(**{REPAIR_REQUEST: asked(Action.RESET_GPU, 1)})
    p = plan(state(on_node, drained()), CONFIG, NOW)
    assert not requests(p)
    assert len(plan_entries(p, Entry.REPAIR_REQUESTED)) == 1
    assert not events(p, Reason.REPAIR_REQUESTED)


def test_a_done_result_is_recorded_once_and_given_time_to_clear() -> None:
    on_node = node(
        **{
            REPAIR_REQUEST: asked(Action.RESET_GPU, 1),
            REPAIR_RESULT: answered(Action.RESET_GPU, 1, Outcome.DONE),
        }
    )
    recorded = drained(entry(Entry.REPAIR_REQUESTED, "reset-gpu attempt 1: x", "waiting"))
    p = plan(state(on_node, recorded), CONFIG, NOW)
    assert len(plan_entries(p, Entry.REPAIRED)) == 1 and len(events(p, Reason.REPAIRED)) == 1
    assert not requests(p)
    again = replace(recorded, actions=(*recorded.actions, plan_entries(p, Entry.REPAIRED)[0]))
    p = plan(state(on_node, again), CONFIG, NOW + dt.timedelta(seconds=10))
    assert not p.actions and p.suppressed == "settling"
    # Still reported after settleSeconds: ineffective, and the next attempt.
    late = NOW + dt.timedelta(seconds=CONFIG.repair.settle_seconds + 1)
    p = plan(state(on_node, again), CONFIG, late)
    assert [e.result for e in plan_entries(p, Entry.REPAIR_FAILED)] == ["ineffective"]
    (request,) = requests(p)
    assert decode_request(request.value) == RepairRequest(
        Action.RESET_GPU, DIGEST, 2, iso(late, "seconds")
    )


def _after_failures(*attempts: Action) -> tuple[NodeView, FaultRecord]:
    """The node and record after `attempts` that each failed (recorded)."""
    said = []
    for i, action in enumerate(attempts, 1):
        said += [
            entry(Entry.REPAIR_REQUESTED, f"{action.value} attempt {i}: x", "waiting"),
            entry(Entry.REPAIR_FAILED, f"{action.value} attempt {i}: x", "failed"),
        ]
    last = len(attempts)
    on_node = node(
        **{
            REPAIR_REQUEST: asked(attempts[-1], last),
            REPAIR_RESULT: answered(attempts[-1], last, Outcome.FAILED),
        }
    )
    return on_node, drained(*said)


def test_a_failed_reset_is_retried_then_escalates_to_reboot_then_to_a_person() -> None:
    on_node, recorded = _after_failures(Action.RESET_GPU)
    assert decode_request(requests(plan(state(on_node, recorded), CONFIG, NOW))[0].value) == (
        RepairRequest(Action.RESET_GPU, DIGEST, 2, iso(NOW, "seconds"))
    )
    on_node, recorded = _after_failures(Action.RESET_GPU, Action.RESET_GPU)
    (request,) = requests(plan(state(on_node, recorded), CONFIG, NOW))
    assert decode_request(request.value) == RepairRequest(
        Action.REBOOT, DIGEST, 3, iso(NOW, "seconds")
    )
    on_node, recorded = _after_failures(Action.RESET_GPU, Action.RESET_GPU, Action.REBOOT)
    p = plan(state(on_node, recorded), CONFIG, NOW)
    assert not requests(p)
    (held,) = plan_entries(p, Entry.REPAIR_EXHAUSTED)
    assert held.result == "contact-support"
    assert all(a.contact_support for a in p.repair if isinstance(a, UpdateRecord))
    assert len(events(p, Reason.CONTACT_SUPPORT)) == 1
    # Said once; the node stays quarantined (no untaint, no new request).
    told = replace(recorded, actions=(*recorded.actions, held))
    p = plan(state(on_node, told), CONFIG, NOW)
    assert not p.actions and p.suppressed == "contact-support"


def test_a_failure_is_recorded_once_with_its_event() -> None:
    on_node, recorded = _after_failures(Action.RESET_GPU)
    fresh = replace(recorded, actions=recorded.actions[:-1])  # the failure not yet recorded
    p = plan(state(on_node, fresh), CONFIG, NOW)
    assert [e.result for e in plan_entries(p, Entry.REPAIR_FAILED)] == ["failed"]
    assert len(events(p, Reason.REPAIR_FAILED)) == 1
    p = plan(state(on_node, recorded), CONFIG, NOW)
    assert not plan_entries(p, Entry.REPAIR_FAILED) and not events(p, Reason.REPAIR_FAILED)


def test_no_result_within_the_timeout_is_a_failed_attempt() -> None:
    long_ago = NOW - dt.timedelta(seconds=CONFIG.repair.result_timeout_seconds + 5)
    on_node = node(**{REPAIR_REQUEST: asked(Action.RESET_GPU, 1, long_ago)})
    recorded = drained(entry(Entry.REPAIR_REQUESTED, "reset-gpu attempt 1: x", "waiting", long_ago))
    p = plan(state(on_node, recorded), CONFIG, NOW)
    assert [e.result for e in plan_entries(p, Entry.REPAIR_FAILED)] == ["timed-out"]
    assert decode_request(requests(p)[0].value).attempt == 2  # type: ignore[union-attr]


def test_a_reboot_waits_for_its_result_as_long_as_the_reboot_daemon_takes_to_look() -> None:
    """kured looks for its sentinel every hour: a reboot answered 40 minutes later is
    in time; one unanswered past the period and the result timeout has failed."""
    cfg = CONFIG.repair
    period = cfg.reboot_period_seconds
    assert period == 3600 and cfg.result_timeout("reboot") == cfg.result_timeout_seconds + period
    for waited, failed in ((2400, False), (cfg.result_timeout_seconds + period + 5, True)):
        asked_at = NOW - dt.timedelta(seconds=waited)
        on_node = node("XidCritical79", **{REPAIR_REQUEST: asked(Action.REBOOT, 1, asked_at)})
        recorded = drained(
            entry(Entry.REPAIR_REQUESTED, "reboot attempt 1: x", "waiting", asked_at),
            reason="XidCritical79",
        )
        p = plan(state(on_node, recorded), CONFIG, NOW)
        assert bool(plan_entries(p, Entry.REPAIR_FAILED)) is failed, waited
        if not failed:
            assert p.requeue_after == pytest.approx(cfg.result_timeout("reboot") - waited)


def test_xid_79_is_repaired_by_a_reboot() -> None:
    p = plan(state(node("XidCritical79"), drained(reason="XidCritical79")), CONFIG, NOW)
    (request,) = requests(p)
    assert decode_request(request.value).action is Action.REBOOT  # type: ignore[union-attr]


def test_a_reset_without_named_gpus_starts_at_the_reboot() -> None:
    p = plan(state(node(devices=""), drained()), CONFIG, NOW)
    assert decode_request(requests(p)[0].value).action is Action.REBOOT  # type: ignore[union-attr]


def test_what_is_not_repairable_is_left_alone() -> None:
    assert recommended("RowRemapFailure", CONFIG) is Action.CONTACT_SUPPORT
    p = plan(state(node("RowRemapFailure"), drained(reason="RowRemapFailure")), CONFIG, NOW)
    assert not p.repair
    overridden = replace(CONFIG, repair=replace(ACT, action_by_reason={"EccUncontained95": "none"}))
    assert not plan(state(node(), drained()), overridden, NOW).repair


def test_the_budget_is_cluster_wide_and_within_the_breaker() -> None:
    busy = frozenset({"other-1", "other-2"})  # maxConcurrent: 2
    p = plan(state(node(), drained(), repairing=busy), CONFIG, NOW)
    assert not requests(p) and p.suppressed == "repair-budget"
    (held,) = plan_entries(p, Entry.REPAIR_HELD)
    assert "2 repairs in flight (budget 2)" in held.detail
    told = drained(held)
    assert not plan(state(node(), told, repairing=busy), CONFIG, NOW).actions  # said once
    # One of them done: room for this node.
    assert requests(plan(state(node(), told, repairing=busy - {"other-1"}), CONFIG, NOW))
    # The breaker's budget bounds it too.
    narrow = replace(CONFIG, breaker_max_nodes=1)
    assert repair_capacity(10, narrow) == 1
    assert not requests(plan(state(node(), drained(), repairing=busy - {"other-1"}), narrow, NOW))


def test_a_node_that_keeps_needing_repairs_goes_to_a_person() -> None:
    cfg = replace(CONFIG, repair=replace(ACT, max_attempts_per_node=2))
    earlier = FaultRecord(
        name="old",
        node=N1,
        fault_id="old",
        phase=Phase.RESOLVED,
        actions=(
            entry(Entry.REPAIR_REQUESTED, "reset-gpu attempt 1: x", "waiting"),
            entry(Entry.REPAIR_REQUESTED, "reset-gpu attempt 2: x", "waiting"),
        ),
    )
    p = plan(NodeState(node=node(), records=(drained(), earlier), gpu_nodes=10), cfg, NOW)
    assert not requests(p)
    assert "maxAttemptsPerNode 2" in plan_entries(p, Entry.REPAIR_EXHAUSTED)[0].detail
    # Outside the window they do not count.
    later = NOW + dt.timedelta(seconds=cfg.repair.window_seconds + 1)
    assert requests(
        plan(NodeState(node=node(), records=(drained(), earlier), gpu_nodes=10), cfg, later)
    )


def test_propose_mode_writes_nothing_to_the_node() -> None:
    cfg = replace(CONFIG, repair=RepairConfig(enabled=True))
    p = plan(state(node(), drained()), cfg, NOW)
    assert not requests(p) and not p.new_repair
    (said,) = plan_entries(p, Entry.WOULD_REPAIR)
    assert said.detail == f"reset-gpu attempt 1: reset {GPU}"
    assert len(events(p, Reason.REPAIR_PROPOSED)) == 1
    told = drained(said)
    assert not plan(state(node(), told), cfg, NOW).actions


def test_no_repair_before_the_drain_has_finished() -> None:
    pod = PodView("ml", "train-0", "uid-0", N1, "Running", gpu=True)
    draining = replace(drained(), phase=Phase.DRAINING)
    p = plan(NodeState(node=node(), pods=(pod,), records=(draining,), gpu_nodes=10), CONFIG, NOW)
    assert not requests(p)
    # Drained in this very pass: the repair waits for the node's next turn.
    p = plan(state(node(), draining), CONFIG, NOW)
    assert not requests(p) and p.requeue_after is not None and p.requeue_after < 1


def test_only_the_agents_own_report_is_repaired() -> None:
    alert = FaultSignal(N1, F1, "EccUncontained95", "alertmanager", Severity.P0, devices=(GPU,))
    bare = replace(node(), annotations={HANDLED_FAULT_ID: F1})
    p = plan(state(bare, drained(), external=(alert,)), CONFIG, NOW)
    assert not requests(p)


def test_a_result_that_comes_as_the_fault_clears_is_recorded() -> None:
    cleared = replace(
        node(),
        annotations={
            HANDLED_FAULT_ID: F1,
            REPAIR_REQUEST: asked(Action.RESET_GPU, 1),
            REPAIR_RESULT: answered(Action.RESET_GPU, 1, Outcome.DONE),
        },
    )
    recorded = drained(entry(Entry.REPAIR_REQUESTED, "reset-gpu attempt 1: x", "waiting"))
    p = plan(state(cleared, recorded), CONFIG, NOW)
    assert len(plan_entries(p, Entry.REPAIRED)) == 1
    assert plan_entries(p, "recovering")  # and recovery begins, as for any cleared fault
    assert not requests(p)


def test_a_result_for_another_attempt_or_fault_answers_nothing() -> None:
    request = RepairRequest(Action.RESET_GPU, DIGEST, 2, "2026-12-01T09:30:00Z")
    old = RepairResult(Action.RESET_GPU, DIGEST, 1, Outcome.DONE, "2026-12-01T09:29:00Z")
    other = RepairResult(
        Action.RESET_GPU, fault_digest("x"), 2, Outcome.DONE, "2026-12-01T09:31:00Z"
    )
    assert not old.answers(request) and not other.answers(request)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "reset-gpu;abc;1;2026-12-01T09:30:00Z",  # not a digest
        f"reboot;{DIGEST};0;2026-12-01T09:30:00Z",  # attempts count from 1
        f"contact-support;{DIGEST};1;2026-12-01T09:30:00Z",  # a person's, not the agent's
        f"reset-gpu;{DIGEST};1;2026-12-01T09:30:00Z;extra",
        f"reset-gpu;{DIGEST};x;2026-12-01T09:30:00Z",
        f"reset-gpu;{DIGEST};1;now please",
    ],
)
def test_a_request_that_does_not_decode_is_no_request(value: str) -> None:
    assert decode_request(value) is None


def test_the_annotations_round_trip_and_the_detail_may_hold_anything() -> None:
    request = RepairRequest(Action.REBOOT, DIGEST, 3, "2026-12-01T09:30:00Z")
    assert decode_request(request.encode()) == request
    result = RepairResult(
        Action.RESET_GPU, DIGEST, 1, Outcome.REFUSED, "2026-12-01T09:30:05Z", "pid 4242; held\n"
    )
    decoded = decode_result(result.encode())
    assert decoded is not None and decoded.detail == "pid 4242; held"
    assert decode_result(result.encode().replace("refused", "maybe")) is None
    assert fault_digest(F1) == fault_digest(f"  {F1} ")  # as gpuheal carries the id


def test_each_repair_entry_counts_once_by_action_and_step() -> None:
    assert repair_metric(entry(Entry.REPAIR_REQUESTED, "reboot attempt 3: x")) == (
        "reboot",
        "requested",
    )
    assert repair_metric(entry(Entry.REPAIR_FAILED, "reset-gpu attempt 1: x", "refused")) == (
        "reset-gpu",
        "refused",
    )
    assert repair_metric(entry("drain", "")) is None


def test_the_config_keys() -> None:
    cfg = parse_config({"repair": {"enabled": True, "mode": "act", "maxConcurrent": 5}})
    assert cfg.repair.acts and cfg.repair.max_concurrent == 5
    with pytest.raises(ConfigError, match=r"repair\.mode"):
        parse_config({"repair": {"mode": "yolo"}})
    with pytest.raises(ConfigError, match=r"repair\.actionByReason"):
        parse_config({"repair": {"actionByReason": {"XidCritical79": "rma"}}})
    # `replace` only with a hook to call.
    with pytest.raises(ConfigError, match=r"repair\.actionByReason: XidCritical79 mapped"):
        parse_config({"repair": {"actionByReason": {"XidCritical79": "replace"}}})


# -- any sequence of answers, delays and budgets ---------------------------------------

Event = tuple[str, int]
event = st.one_of(
    st.tuples(st.just("tick"), st.integers(0, 2000)),
    st.tuples(st.just("answer"), st.integers(0, 2)),
    st.tuples(st.just("budget"), st.integers(0, 3)),
)
OUTCOMES = (Outcome.DONE, Outcome.FAILED, Outcome.REFUSED)


@settings(max_examples=300, deadline=None)
@given(st.lists(event, min_size=1, max_size=60))
def test_any_sequence_asks_each_attempt_once_within_the_budget_and_the_ladder(
    events: list[Event],
) -> None:
    now = NOW
    on_node = node()
    record = drained()
    busy: frozenset[str] = frozenset()
    last_attempt = 0
    exhausted = 0
    for kind, value in events:
        if kind == "tick":
            now += dt.timedelta(seconds=value)
        elif kind == "budget":
            busy = frozenset(f"other-{i}" for i in range(value))
        else:
            request = decode_request(on_node.annotations.get(REPAIR_REQUEST))
            if request is not None:
                answer = RepairResult(
                    request.action, request.fault, request.attempt, OUTCOMES[value],
                    iso(now, "seconds"), "test",
                )  # fmt: skip
                on_node = replace(
                    on_node, annotations=on_node.annotations | {REPAIR_RESULT: answer.encode()}
                )
        before = decode_request(on_node.annotations.get(REPAIR_REQUEST))
        answered = decode_result(on_node.annotations.get(REPAIR_RESULT))
        p = plan(state(on_node, record, repairing=busy), CONFIG, now)
        asked = requests(p)
        assert len(asked) <= 1
        if asked:
            request = decode_request(asked[0].value)
            assert request is not None
            assert request.attempt == last_attempt + 1 <= 3  # 2 resets, 1 reboot
            assert len(busy) < repair_capacity(10, CONFIG)
            if before is not None:  # the one before was answered, or timed out
                timed_out = (now - dt.datetime.fromisoformat(before.time)).total_seconds()
                assert (answered is not None and answered.answers(before)) or (
                    timed_out >= CONFIG.repair.result_timeout_seconds
                )
            last_attempt = request.attempt
            on_node = replace(
                on_node, annotations=on_node.annotations | {REPAIR_REQUEST: asked[0].value}
            )
        assert not (exhausted and asked)  # a person's turn: nothing more is asked
        new = [a.entry for a in p.repair if isinstance(a, UpdateRecord)]
        exhausted += sum(1 for e in new if e.action == Entry.REPAIR_EXHAUSTED)
        assert exhausted <= 1
        record = replace(record, actions=(*record.actions, *new))
