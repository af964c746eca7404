"""The pure device-health policy: rule by rule, then properties."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.clock import iso
from gpuheal.config import Config, DeviceHealthConfig
from gpuheal.model import (
    QUARANTINED_DEVICES,
    SUSPECT_DEVICES,
    UNKNOWN_DEVICES,
    ActionEntry,
    CanaryView,
    Condition,
    DeviceHealth,
    DeviceReport,
    FaultRecord,
    Mode,
    NodeView,
    Phase,
    PodView,
    Taint,
)
from gpuheal.policy.actions import Emit, Evict, UpdateRecord
from gpuheal.policy.devices import (
    CreateCanary,
    CreateDeviceRecord,
    DeleteCanary,
    DeviceEntry,
    DeviceReleased,
    DeviceState,
    MarkDevices,
    canary_name,
    plan_devices,
)
from gpuheal.sources.escalation import escalation_signal
from gpuheal.vocabulary import Reason

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)
GPU = "nvidia.com/gpu"
CFG = Config(
    device_health=DeviceHealthConfig(
        unknown_tolerance_seconds=60,
        quarantine_seconds=600,
        canary_timeout_seconds=120,
        observation_seconds=300,
    )
)
READY = Condition(type="Ready", status="True")


def node(name: str = "n1", gpus: int = 8, marks: dict[str, str] | None = None) -> NodeView:
    return NodeView(name, "1", annotations=marks or {}, gpus=gpus, conditions=(READY,))


def pod(index: int, node_name: str = "n1", **kwargs: object) -> PodView:
    return PodView("ns", f"p{index}", f"uid-{index}", node_name, "Running", gpu=True, **kwargs)  # type: ignore[arg-type]


def entry(
    index: int,
    health: DeviceHealth = DeviceHealth.HEALTHY,
    *,
    age: float = 0,
    since: float | None = None,
    message: str = "",
    holder: PodView | None = None,
) -> DeviceEntry:
    seen = NOW - dt.timedelta(seconds=age)
    changed = NOW - dt.timedelta(seconds=age if since is None else since)
    return DeviceEntry(
        pod=holder or pod(index),
        report=DeviceReport(GPU, f"GPU-{index}", health, message),
        since=changed,
        seen=seen,
    )


def healthy_node(*bad: int, gpus: int = 8) -> tuple[DeviceEntry, ...]:
    return tuple(
        entry(i, DeviceHealth.UNHEALTHY if i in bad else DeviceHealth.HEALTHY) for i in range(gpus)
    )


def of(actions: tuple[object, ...], kind: type) -> list:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, kind)]


def device_record(
    device: int,
    phase: Phase = Phase.DRAINED,
    *,
    opened: float = 10,
    actions: tuple[ActionEntry, ...] = (),
    expiry: float = 590,
    **kwargs: object,
) -> FaultRecord:
    when = iso(NOW - dt.timedelta(seconds=opened))
    return FaultRecord(
        name=f"n1-{device:012d}",
        node="n1",
        fault_id=f"GPU-{device}#1",
        phase=phase,
        reason="DeviceUnhealthy",
        scope="device",
        resource=GPU,
        device=f"GPU-{device}",
        created_at=when,
        expiry=iso(NOW + dt.timedelta(seconds=expiry)),
        actions=(ActionEntry(when, "detect", "ok"), *actions),
        **kwargs,  # type: ignore[arg-type]
    )


def test_one_unhealthy_device_makes_one_record_and_evicts_only_its_pod() -> None:
    decided = plan_devices(DeviceState(node(), healthy_node(3)), CFG, NOW)
    (created,) = of(decided.actions, CreateDeviceRecord)
    assert created.record.device == "GPU-3" and created.record.scope == "device"
    assert created.record.phase is Phase.QUARANTINED
    assert created.record.expiry == iso(NOW + dt.timedelta(seconds=600))
    assert [e.pod.name for e in of(decided.actions, Evict)] == ["p3"]
    (mark,) = of(decided.actions, MarkDevices)
    assert mark.quarantined == ("GPU-3",) and not mark.suspect
    assert escalation_signal([created.record]) is None
    # The record is written before the eviction it records, after the eviction.
    kinds = [type(a).__name__ for a in decided.actions]
    assert kinds.index("CreateDeviceRecord") < kinds.index("Evict") < kinds.index("UpdateRecord")


def test_an_open_record_is_not_created_again_and_a_leaving_pod_is_not_evicted_again() -> None:
    record = device_record(3, Phase.DRAINING)
    leaving = pod(3, deleting=True)
    entries = (*healthy_node(gpus=3), entry(3, DeviceHealth.UNHEALTHY, holder=leaving))
    state = DeviceState(node(marks={QUARANTINED_DEVICES: "GPU-3"}), entries, (record,))
    decided = plan_devices(state, CFG, NOW)
    assert not of(decided.actions, CreateDeviceRecord)
    assert not of(decided.actions, Evict)
    assert not of(decided.actions, UpdateRecord)  # nothing new to write while it leaves


def test_a_drained_device_is_marked_drained_once_its_pods_are_gone() -> None:
    record = device_record(3, Phase.DRAINING)
    state = DeviceState(node(marks={QUARANTINED_DEVICES: "GPU-3"}), healthy_node(gpus=3), (record,))
    (update,) = of(plan_devices(state, CFG, NOW).actions, UpdateRecord)
    assert update.phase is Phase.DRAINED


def test_evictions_respect_the_node_rate_limit() -> None:
    holders = tuple(entry(1, DeviceHealth.UNHEALTHY, holder=pod(i)) for i in range(5))
    decided = plan_devices(DeviceState(node(), holders, evictions_allowed=2), CFG, NOW)
    assert len(of(decided.actions, Evict)) == 2
    assert decided.requeue_after == 60 / CFG.device_health.evictions_per_minute


def test_unknown_within_the_tolerance_is_an_event_only() -> None:
    entries = (entry(1, DeviceHealth.UNKNOWN, since=30),)
    decided = plan_devices(DeviceState(node(), entries), CFG, NOW)
    assert not of(decided.actions, CreateDeviceRecord) and not of(decided.actions, Evict)
    (mark,) = of(decided.actions, MarkDevices)
    assert mark.unknown == ("GPU-1",) and not mark.suspect
    assert [e.reason for e in of(decided.actions, Emit)] == [Reason.DEVICE_UNKNOWN]
    assert decided.requeue_after == 30


def test_unknown_beyond_the_tolerance_is_suspect_never_a_fault() -> None:
    entries = (entry(1, DeviceHealth.UNKNOWN, since=61),)
    state = DeviceState(node(marks={UNKNOWN_DEVICES: "GPU-1"}), entries)
    decided = plan_devices(state, CFG, NOW)
    assert not of(decided.actions, CreateDeviceRecord) and not of(decided.actions, Evict)
    (mark,) = of(decided.actions, MarkDevices)
    assert mark.suspect == ("GPU-1",) and not mark.unknown
    assert [e.reason for e in of(decided.actions, Emit)] == [Reason.DEVICE_SUSPECT]
    # Marked already: nothing more to do.
    marked = DeviceState(node(marks={SUSPECT_DEVICES: "GPU-1"}), entries)
    assert plan_devices(marked, CFG, NOW).actions == ()


def test_a_stale_healthy_report_counts_as_unknown() -> None:
    config = replace(CFG, device_health=replace(CFG.device_health, heartbeat_seconds=30))
    fresh = plan_devices(DeviceState(node(), (entry(1, age=29),)), config, NOW)
    assert fresh.actions == () and fresh.requeue_after is not None
    assert abs(fresh.requeue_after - 1) < 1e-6
    stale = plan_devices(DeviceState(node(), (entry(1, age=31),)), config, NOW)
    (mark,) = of(stale.actions, MarkDevices)
    assert mark.unknown == ("GPU-1",)
    old = plan_devices(DeviceState(node(), (entry(1, age=100),)), config, NOW)
    (mark,) = of(old.actions, MarkDevices)
    assert mark.suspect == ("GPU-1",)
    # 0 disables the heartbeat: an old Healthy report stays Healthy.
    assert plan_devices(DeviceState(node(), (entry(1, age=10**6),)), CFG, NOW).actions == ()


def test_a_node_that_is_not_ready_or_unreachable_gets_no_device_faults() -> None:
    all_bad = tuple(entry(i, DeviceHealth.UNHEALTHY) for i in range(8))
    not_ready = replace(node(), conditions=(Condition("Ready", "Unknown"),))
    unreachable = replace(node(), taints=(Taint("node.kubernetes.io/unreachable", "NoExecute"),))
    for lost in (not_ready, unreachable):
        decided = plan_devices(DeviceState(lost, all_bad), CFG, NOW)
        assert decided.actions == () and decided.suppressed == "node-not-ready"


def test_three_device_faults_escalate_to_the_node() -> None:
    records = (device_record(1), device_record(2))
    state = DeviceState(node(marks={QUARANTINED_DEVICES: "GPU-1,GPU-2"}), healthy_node(3), records)
    decided = plan_devices(state, CFG, NOW)
    (created,) = of(decided.actions, CreateDeviceRecord)
    assert any(a.action == "escalate" for a in created.record.actions)
    assert Reason.DEVICE_ESCALATED in {e.reason for e in of(decided.actions, Emit)}
    signal = escalation_signal((*records, created.record))
    assert signal is not None and signal.node == "n1" and signal.reason == "DeviceEscalation"
    assert len(signal.fault_id) <= 63 and "#" not in signal.fault_id


def test_two_faults_do_not_escalate_and_old_faults_outside_the_window_do_not_count() -> None:
    old = device_record(1, Phase.RESOLVED, opened=2 * 86400)
    state = DeviceState(node(), healthy_node(3), (old, device_record(2)))
    (created,) = of(plan_devices(state, CFG, NOW).actions, CreateDeviceRecord)
    assert not any(a.action == "escalate" for a in created.record.actions)


def test_too_few_healthy_devices_left_escalates() -> None:
    health = replace(CFG.device_health, escalate_after_faults=99, min_healthy_fraction=0.6)
    config = replace(CFG, device_health=health)
    state = DeviceState(node(gpus=2), healthy_node(1, gpus=2))
    (created,) = of(plan_devices(state, config, NOW).actions, CreateDeviceRecord)
    assert "1 of 2 devices healthy" in created.record.actions[-1].detail


def test_a_shared_nodes_healthy_fraction_counts_gpus_not_replicas() -> None:
    """8 GPUs time-sliced 4 ways offer 32 nvidia.com/gpu: one bad GPU is 1 of 8."""
    health = replace(CFG.device_health, escalate_after_faults=99, min_healthy_fraction=0.9)
    config = replace(CFG, device_health=health)
    shared = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    state = DeviceState(replace(node(gpus=32), labels=shared), healthy_node(1, gpus=32))
    (created,) = of(plan_devices(state, config, NOW).actions, CreateDeviceRecord)
    assert "7 of 8 devices healthy" in created.record.actions[-1].detail


def test_a_whole_node_reason_escalates_at_once() -> None:
    entries = (entry(1, DeviceHealth.UNHEALTHY, message="GPU has fallen off the bus"),)
    (created,) = of(
        plan_devices(DeviceState(node(), entries), CFG, NOW).actions, CreateDeviceRecord
    )
    assert created.record.actions[-1].action == "escalate"


def test_the_same_device_failing_again_after_release_escalates() -> None:
    released = device_record(
        1,
        Phase.RESOLVED,
        opened=4000,
        actions=(ActionEntry(iso(NOW - dt.timedelta(seconds=100)), "release", "ok"),),
    )
    state = DeviceState(node(), healthy_node(1), (released,))
    (created,) = of(plan_devices(state, CFG, NOW).actions, CreateDeviceRecord)
    assert created.record.fault_id == "GPU-1#2"  # a new episode: a new lock
    assert created.record.name != released.name
    assert "failed again" in created.record.actions[-1].detail


def test_episodes_go_on_after_older_records_of_the_device_were_collected() -> None:
    """Retention deleted episodes 1 and 2 of GPU-1; episode 3 is still there. The
    next fault is episode 4: a count (1 record) would name episode 2... and a
    still-existing name would be refused (AlreadyExists) on every attempt."""
    config = replace(CFG, device_health=replace(CFG.device_health, repeat_window_seconds=0))
    kept = replace(device_record(1, Phase.RESOLVED, opened=4000), fault_id="GPU-1#3")
    state = DeviceState(node(), healthy_node(1), (kept,))
    (created,) = of(plan_devices(state, config, NOW).actions, CreateDeviceRecord)
    assert created.record.fault_id == "GPU-1#4"


def test_repeated_faults_of_a_node_flag_contact_support() -> None:
    history = tuple(device_record(i, Phase.RESOLVED, opened=3600 * i) for i in range(4, 6))
    config = replace(CFG, device_health=replace(CFG.device_health, escalate_after_faults=99))
    decided = plan_devices(DeviceState(node(), healthy_node(1), history), config, NOW)
    (created,) = of(decided.actions, CreateDeviceRecord)
    assert created.record.contact_support
    assert Reason.CONTACT_SUPPORT in {e.reason for e in of(decided.actions, Emit)}


def test_healthy_again_starts_a_canary_then_pass_observe_release() -> None:
    record = device_record(1, Phase.DRAINED)
    state = DeviceState(node(marks={QUARANTINED_DEVICES: "GPU-1"}), (entry(1),), (record,))
    decided = plan_devices(state, CFG, NOW)
    (canary,) = of(decided.actions, CreateCanary)
    assert canary.name == canary_name(record.name, 1) and canary.node == "n1"
    (update,) = of(decided.actions, UpdateRecord)
    assert update.phase is Phase.CANARY

    # A canary a killed predecessor made (and that may have ended already): read at once.
    made = {canary.name: CanaryView(canary.name, "n1", "Succeeded")}
    assert plan_devices(replace(state, canaries=made), CFG, NOW).requeue_after == 0.1

    started = ActionEntry(iso(NOW - dt.timedelta(seconds=5)), "canary-start", "ok", canary.name)
    running = replace(record, phase=Phase.CANARY, actions=(*record.actions, started))
    pods = {canary.name: CanaryView(canary.name, "n1", "Running")}
    waiting = plan_devices(replace(state, records=(running,), canaries=pods), CFG, NOW)
    assert waiting.actions == () and waiting.requeue_after == 115

    passed = {canary.name: CanaryView(canary.name, "n1", "Succeeded")}
    decided = plan_devices(replace(state, records=(running,), canaries=passed), CFG, NOW)
    # The result is written first; the canary goes in the next pass, at once (a
    # controller killed between the two must not run the canary again).
    assert not of(decided.actions, DeleteCanary) and decided.requeue_after == 0.1
    (update,) = of(decided.actions, UpdateRecord)
    assert update.phase is Phase.RECOVERING and update.recovering_since == iso(NOW)
    recovering = replace(
        running, phase=Phase.RECOVERING, actions=(*running.actions, update.entry),
        recovering_since=iso(NOW),
    )  # fmt: skip
    decided = plan_devices(replace(state, records=(recovering,), canaries=passed), CFG, NOW)
    assert of(decided.actions, DeleteCanary) == [DeleteCanary(canary.name)]
    assert not of(decided.actions, UpdateRecord)

    observed = replace(recovering, recovering_since=iso(NOW - dt.timedelta(seconds=301)))
    decided = plan_devices(replace(state, records=(observed,)), CFG, NOW)
    (update,) = of(decided.actions, UpdateRecord)
    assert update.phase is Phase.RESOLVED
    (released,) = of(decided.actions, DeviceReleased)
    assert released.false_quarantine  # 10 s in quarantine, no canary failure
    (mark,) = of(decided.actions, MarkDevices)
    assert mark.quarantined == ()


def test_a_failed_or_timed_out_canary_extends_the_quarantine() -> None:
    name = canary_name("n1-000000000001", 1)
    started = ActionEntry(iso(NOW - dt.timedelta(seconds=5)), "canary-start", "ok", name)
    record = device_record(1, Phase.CANARY, actions=(started,))
    state = DeviceState(node(marks={QUARANTINED_DEVICES: "GPU-1"}), (entry(1),), (record,))
    for canaries, now in (
        ({name: CanaryView(name, "n1", "Failed")}, NOW),
        ({name: CanaryView(name, "n1", "Running")}, NOW + dt.timedelta(seconds=200)),
    ):
        decided = plan_devices(replace(state, canaries=canaries), CFG, now)
        assert not of(decided.actions, DeleteCanary)  # in the next pass
        (update,) = of(decided.actions, UpdateRecord)
        assert update.phase is Phase.QUARANTINED and update.entry.action == "canary-failed"
        assert update.expiry == iso(now + dt.timedelta(seconds=600))
        assert Reason.GATE_FAILED in {e.reason for e in of(decided.actions, Emit)}
        assert not of(decided.actions, MarkDevices)  # still quarantined on the node
        # Healthy still, but the next canary waits for the extended expiry.
        failed = replace(
            record,
            phase=Phase.QUARANTINED,
            actions=(*record.actions, update.entry),
            expiry=update.expiry or "",
        )
        leftover = plan_devices(replace(state, records=(failed,), canaries=canaries), CFG, now)
        assert of(leftover.actions, DeleteCanary) == [DeleteCanary(name)]
        waiting = plan_devices(replace(state, records=(failed,)), CFG, now)
        assert waiting.actions == () and waiting.requeue_after == 600
        after = now + dt.timedelta(seconds=601)
        assert of(plan_devices(replace(state, records=(failed,)), CFG, after).actions, CreateCanary)


def test_a_quarantine_waits_for_its_expiry_without_a_healthy_report() -> None:
    record = device_record(1, Phase.DRAINED, expiry=100)
    state = DeviceState(node(marks={QUARANTINED_DEVICES: "GPU-1"}), (), (record,))
    waiting = plan_devices(state, CFG, NOW)
    assert waiting.actions == () and waiting.requeue_after == 100
    expired = plan_devices(state, CFG, NOW + dt.timedelta(seconds=101))
    assert of(expired.actions, CreateCanary)


def test_a_released_device_is_not_a_false_quarantine_after_a_canary_failure() -> None:
    failed = ActionEntry(iso(NOW - dt.timedelta(seconds=500)), "canary-failed", "failed")
    record = device_record(
        1, Phase.RECOVERING, actions=(failed,), recovering_since=iso(NOW - dt.timedelta(hours=1))
    )
    decided = plan_devices(DeviceState(node(), (), (record,)), CFG, NOW)
    (released,) = of(decided.actions, DeviceReleased)
    assert not released.false_quarantine


def test_observe_mode_records_but_never_evicts_nor_runs_canaries() -> None:
    config = replace(CFG, mode=Mode.OBSERVE)
    decided = plan_devices(DeviceState(node(), healthy_node(2)), config, NOW)
    assert of(decided.actions, CreateDeviceRecord) and not of(decided.actions, Evict)
    record = device_record(2, Phase.QUARANTINED)
    decided = plan_devices(DeviceState(node(), healthy_node(), (record,)), config, NOW)
    assert not of(decided.actions, CreateCanary)
    (update,) = of(decided.actions, UpdateRecord)
    assert update.phase is Phase.RECOVERING


# -- properties ---------------------------------------------------------------------

HEALTH = st.sampled_from(list(DeviceHealth))


@st.composite
def device_states(draw: st.DrawFn) -> DeviceState:
    count = draw(st.integers(1, 8))
    entries = []
    for i in range(count):
        holders = draw(st.integers(1, 3))
        for h in range(holders):
            holder = pod(
                10 * i + h,
                deleting=draw(st.booleans()),
                daemonset=draw(st.booleans()),
            )
            entries.append(entry(i, draw(HEALTH), age=draw(st.integers(0, 500)), holder=holder))
    ready = draw(st.booleans())
    conditions = (READY,) if ready else (Condition("Ready", "False"),)
    records = tuple(
        device_record(i, draw(st.sampled_from(list(Phase))))
        for i in range(count)
        if draw(st.booleans())
    )
    return DeviceState(
        replace(node(), conditions=conditions),
        tuple(entries),
        records,
        evictions_allowed=draw(st.integers(0, 10)),
    )


@settings(max_examples=300, deadline=None)
@given(device_states())
def test_evictions_only_of_pods_holding_a_bad_device_within_the_limit(state: DeviceState) -> None:
    decided = plan_devices(state, CFG, NOW)
    evicted = [a.pod.key for a in of(decided.actions, Evict)]
    bad = {e.report.device_id for e in state.entries if e.report.health is DeviceHealth.UNHEALTHY}
    bad |= {r.device for r in state.records if r.open}
    bad_holders = {
        e.pod.key
        for e in state.entries
        if e.report.device_id in bad and not e.pod.daemonset and not e.pod.deleting
    }
    assert len(evicted) == len(set(evicted))
    assert set(evicted) <= bad_holders
    assert len(evicted) <= state.evictions_allowed


@settings(max_examples=300, deadline=None)
@given(device_states())
def test_never_a_fault_from_a_lost_node_nor_from_unknown(state: DeviceState) -> None:
    decided = plan_devices(state, CFG, NOW)
    created = of(decided.actions, CreateDeviceRecord)
    if state.node.conditions[0].status != "True":
        assert decided.actions == ()
    unhealthy = {
        e.report.device_id for e in state.entries if e.report.health is DeviceHealth.UNHEALTHY
    }
    assert {c.record.device for c in created} <= unhealthy
    open_devices = {r.device for r in state.records if r.open}
    assert not {c.record.device for c in created} & open_devices  # one open record per device


@settings(max_examples=200, deadline=None)
@given(device_states())
def test_planning_again_after_the_records_exist_creates_nothing_new(state: DeviceState) -> None:
    first = plan_devices(state, CFG, NOW)
    made = tuple(c.record for c in of(first.actions, CreateDeviceRecord))
    again = plan_devices(replace(state, records=(*state.records, *made)), CFG, NOW)
    assert not of(again.actions, CreateDeviceRecord)
