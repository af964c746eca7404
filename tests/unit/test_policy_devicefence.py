"""The device fence's decisions (policy/devicefence.py) and the device plan around
them: one DeviceTaintRule per open fault of a DRA GPU, created after its record,
named on the record once seen, removed after the record closes; nothing for a
device plugin's GPU, another driver's device, or where the API is not served."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import replace

import pytest

from gpuheal.clock import iso
from gpuheal.config import Config, DeviceHealthConfig
from gpuheal.model import (
    ActionEntry,
    CanaryView,
    Condition,
    DeviceHealth,
    DeviceKey,
    DeviceReport,
    DeviceTaint,
    DraDevice,
    FaultRecord,
    FenceView,
    NodeView,
    Phase,
    PodView,
    fault_record_name,
)
from gpuheal.policy.actions import Evict, UpdateRecord
from gpuheal.policy.devicefence import FenceDevice, Fences, Unfence, fence_problem, plan_fences
from gpuheal.policy.devices import (
    CreateCanary,
    CreateDeviceRecord,
    DeleteCanary,
    DeviceEntry,
    DeviceState,
    MarkDevices,
    canary_name,
    plan_devices,
)
from gpuheal.policy.drivertaints import reports as driver_reports
from gpuheal.policy.fence import FENCE, PROBATION, SUSPECT, probation_name, rule_name, suspect_name
from gpuheal.vocabulary import Entry
from gpuheal.xid import classify

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 12, 7, 8, 0, tzinfo=dt.UTC)
NODE = "ip-10-0-12-34.us-west-2.compute.internal"
DRIVER = "gpu.nvidia.com"
GPU3 = DeviceKey(DRIVER, NODE, "gpu-3")
DEVICE_ID = f"{DRIVER}/{NODE}/gpu-3"
UUID3 = "GPU-5c1e0f27-0000-4000-8000-000000000003"
DRIVERS = (DRIVER,)
CFG = Config(
    device_health=DeviceHealthConfig(
        quarantine_seconds=600,
        canary_timeout_seconds=120,
        observation_seconds=300,
        probation_seconds=0,
    )
)


def record(
    phase: Phase = Phase.DRAINED,
    *,
    resource: str = DRIVER,
    device: str = DEVICE_ID,
    actions: tuple[ActionEntry, ...] = (),
) -> FaultRecord:
    fault_id = f"{device}#1"
    return FaultRecord(
        name=fault_record_name(NODE, fault_id, resource),
        node=NODE,
        fault_id=fault_id,
        phase=phase,
        reason="DeviceUnhealthy",
        scope="device",
        resource=resource,
        device=device,
        expiry=iso(NOW + dt.timedelta(seconds=600)),
        actions=(ActionEntry(iso(NOW), Entry.DETECT, "ok", "pod-status"), *actions),
        created_at=iso(NOW),
        resource_version="7",
    )


def rule(of: FaultRecord, effect: str = "NoSchedule") -> FenceView:
    return FenceView(rule_name(of.name), NODE, of.name, GPU3, effect)


def plan(
    *records: FaultRecord,
    rules: tuple[FenceView, ...] = (),
    available: bool = True,
    effect: str = "NoSchedule",
    phases: dict[str, Phase] | None = None,
    probation_s: float = 0,
    now: dt.datetime = NOW,
) -> list[object]:
    fences = Fences({r.name: r for r in rules}, "v1beta2" if available else "")
    done = plan_fences(
        NODE,
        records,
        fences,
        effect=effect,
        probation_s=probation_s,
        drivers=DRIVERS,
        phases=phases or {},
        now=now,
    )
    return list(done.actions)


def test_an_open_fault_of_a_dra_gpu_gets_its_rule_of_the_configured_effect() -> None:
    bad = record()
    assert plan(bad) == [
        FenceDevice(
            NODE, bad.name, bad.fault_id, "DeviceUnhealthy", GPU3, "NoSchedule",
            NOW + dt.timedelta(seconds=600),
        )
    ]  # fmt: skip
    (made,) = plan(bad, effect="NoExecute")
    assert isinstance(made, FenceDevice) and made.effect == "NoExecute"


def test_the_record_names_its_rule_once_it_is_seen_in_the_phase_the_pass_leaves() -> None:
    bad = record(Phase.DRAINING)
    (named,) = plan(bad, rules=(rule(bad),), phases={bad.name: Phase.DRAINED})
    assert isinstance(named, UpdateRecord)
    assert named.phase is Phase.DRAINED  # not the phase read: the pass moved it on
    assert (named.entry.action, named.entry.detail) == (
        Entry.FENCE,
        f"{rule_name(bad.name)} (NoSchedule)",
    )
    fenced = record(actions=(named.entry,))
    assert plan(fenced, rules=(rule(fenced),)) == []


def test_the_rule_goes_once_its_record_closes_or_is_gone() -> None:
    bad = record()
    for closed in (Phase.RESOLVED, Phase.FAILED):
        assert plan(dataclasses.replace(bad, phase=closed), rules=(rule(bad),)) == [
            Unfence(NODE, rule_name(bad.name), bad.name)
        ]
    # Released in this very pass: after the record's news, the rule goes.
    assert plan(bad, rules=(rule(bad),), phases={bad.name: Phase.RESOLVED}) == [
        Unfence(NODE, rule_name(bad.name), bad.name)
    ]
    # The record deleted (by hand, or retention): its rule fences nothing any more.
    assert plan(rules=(rule(bad),)) == [Unfence(NODE, rule_name(bad.name), bad.name)]


def test_no_fence_for_a_device_plugin_gpu_another_driver_or_when_not_served() -> None:
    plugin = record(resource="nvidia.com/gpu", device="GPU-5c1e0f27")
    nic = record(resource="net.example.com", device="net.example.com/rack-4/eth1")
    assert plan(plugin, nic) == []
    assert plan(record(), available=False) == []
    # Turned off: none made, and those made before go.
    bad = record()
    assert plan(bad, effect="off") == []
    assert plan(bad, rules=(rule(bad),), effect="off") == [
        Unfence(NODE, rule_name(bad.name), bad.name)
    ]


# -- the device plan around it ----------------------------------------------------

READY = Condition(type="Ready", status="True")
DEVICES = tuple(
    DraDevice(DeviceKey(DRIVER, NODE, f"gpu-{i}"), NODE, f"{UUID3[:-1]}{i}", "gpu")
    for i in range(8)
)


def dra_state(
    health: DeviceHealth,
    *records: FaultRecord,
    rules: tuple[FenceView, ...] = (),
    canaries: dict[str, CanaryView] | None = None,
) -> DeviceState:
    node = NodeView(NODE, "1", conditions=(READY,), devices=DEVICES)
    holder = PodView("training", "train-3", "uid-3", NODE, "Running", gpu=True, gpu_count=1)
    report = DeviceReport(DRIVER, DEVICE_ID, health)
    since = NOW - dt.timedelta(seconds=5)
    return DeviceState(
        node=node,
        entries=(DeviceEntry(holder, report, since, since),),
        records=records,
        canaries=canaries or {},
        fences=Fences({r.name: r for r in rules}, "v1"),
    )


def test_an_unhealthy_dra_gpu_is_recorded_then_fenced_and_its_pod_evicted() -> None:
    done = plan_devices(dra_state(DeviceHealth.UNHEALTHY), CFG, NOW)
    kinds = [type(a).__name__ for a in done.actions if type(a).__name__ != "Emit"]
    # The record (the lock) before its rule: a crash between leaves a record whose
    # next pass makes the rule, never a rule without a record.
    assert kinds.index("CreateDeviceRecord") < kinds.index("FenceDevice")
    # And the card out of allocation before its pod leaves (a pass killed after the
    # eviction has fenced already).
    assert kinds.index("FenceDevice") < kinds.index("Evict")
    (created,) = [a for a in done.actions if isinstance(a, CreateDeviceRecord)]
    (fence,) = [a for a in done.actions if isinstance(a, FenceDevice)]
    assert fence.record == created.record.name and fence.device == GPU3
    assert fence.api_version == "v1"  # the version the API server serves the rules at
    assert [a.pod.name for a in done.actions if isinstance(a, Evict)] == ["train-3"]
    assert done.requeue_after == CFG.eviction_retry_base_seconds  # to name the rule


def test_the_canary_of_a_dra_gpu_claims_that_very_gpu_and_its_claim_goes_with_it() -> None:
    quarantined = record(Phase.DRAINED)
    healthy = dra_state(DeviceHealth.HEALTHY, quarantined, rules=(rule(quarantined),))
    (canary,) = [a for a in plan_devices(healthy, CFG, NOW).actions if isinstance(a, CreateCanary)]
    assert canary.dra and canary.device == DEVICES[3]
    assert canary.device.uuid == UUID3
    started = record(
        Phase.CANARY,
        actions=(ActionEntry(iso(NOW), Entry.CANARY_START, "ok", canary.name),),
    )
    name = canary_name(started.name, 1)
    recovering = dataclasses.replace(started, phase=Phase.RECOVERING, recovering_since=iso(NOW))
    passed = dra_state(
        DeviceHealth.HEALTHY,
        recovering,
        rules=(rule(recovering),),
        canaries={name: CanaryView(name, NODE, "Succeeded")},
    )
    (deleted,) = [a for a in plan_devices(passed, CFG, NOW).actions if isinstance(a, DeleteCanary)]
    assert deleted == DeleteCanary(name, dra=True)


def test_a_dra_gpu_no_slice_publishes_gets_no_device_to_claim() -> None:
    quarantined = record(Phase.DRAINED)
    state = dra_state(DeviceHealth.HEALTHY, quarantined, rules=(rule(quarantined),))
    gone = dataclasses.replace(state, node=dataclasses.replace(state.node, devices=()))
    (canary,) = [a for a in plan_devices(gone, CFG, NOW).actions if isinstance(a, CreateCanary)]
    assert canary.dra and canary.device is None


# -- the DRA driver's own taints as a source ----------------------------------------


def tainted_state(*taints: DeviceTaint, holder: bool = True) -> DeviceState:
    """gpu-3 tainted by the driver, held by train-3 (through its claim), no kubelet
    report at all (NVIDIA's driver reports no health to the kubelet)."""
    devices = tuple(replace(d, taints=taints) if d.key == GPU3 else d for d in DEVICES)
    node = NodeView(NODE, "1", conditions=(READY,), devices=devices)
    pod = PodView("training", "train-3", "uid-3", NODE, "Running", gpu=True, gpu_count=1,
                  held=(devices[3],))  # fmt: skip
    return DeviceState(
        node=node,
        fences=Fences({}, "v1"),
        driver=driver_reports(devices, (pod,) if holder else ()),
    )


def xid(code: int, effect: str = "NoSchedule") -> DeviceTaint:
    return DeviceTaint(f"{DRIVER}/xid", str(code), effect, iso(NOW - dt.timedelta(seconds=3)))


def test_an_application_xid_taint_is_nothing_whatever_its_effect() -> None:
    for effect in ("None", "NoSchedule"):
        done = plan_devices(tainted_state(xid(13, effect)), CFG, NOW)
        assert not [a for a in done.actions if isinstance(a, CreateDeviceRecord | FenceDevice)]
        assert not [a for a in done.actions if isinstance(a, Evict)]


def test_a_gpu_xid_taint_fences_the_card_and_moves_its_pod_the_node_stays() -> None:
    done = plan_devices(tainted_state(xid(48)), CFG, NOW)
    (created,) = [a for a in done.actions if isinstance(a, CreateDeviceRecord)]
    assert created.record.device == DEVICE_ID and created.record.resource == DRIVER
    assert created.message == f"{DRIVER}/xid=48: {classify(48).description}"
    assert not [e for e in created.record.actions if e.action == Entry.ESCALATE]
    assert [a.device for a in done.actions if isinstance(a, FenceDevice)] == [GPU3]
    assert [a.pod.name for a in done.actions if isinstance(a, Evict)] == ["train-3"]


def test_xid_79_or_a_lost_gpu_fences_the_card_and_takes_the_node() -> None:
    for taint in (xid(79), DeviceTaint(f"{DRIVER}/gpu-lost", "", "NoSchedule")):
        done = plan_devices(tainted_state(taint), CFG, NOW)
        (created,) = [a for a in done.actions if isinstance(a, CreateDeviceRecord)]
        (escalated,) = [e for e in created.record.actions if e.action == Entry.ESCALATE]
        assert escalated.detail.startswith(taint.key)
        assert [a.device for a in done.actions if isinstance(a, FenceDevice)] == [GPU3]


def test_an_unmonitored_gpu_is_unknown_then_suspect_never_a_fault() -> None:
    unmonitored = DeviceTaint(f"{DRIVER}/unmonitored", "", "None", iso(NOW))
    done = plan_devices(tainted_state(unmonitored, holder=False), CFG, NOW)
    assert not [a for a in done.actions if isinstance(a, CreateDeviceRecord | FenceDevice)]
    (marked,) = [a for a in done.actions if isinstance(a, MarkDevices)]
    assert marked.unknown == (DEVICE_ID,)


# -- probation ------------------------------------------------------------------------


def released(at: dt.datetime) -> FaultRecord:
    return record(Phase.RESOLVED, actions=(ActionEntry(iso(at), Entry.RELEASE, "ok", ""),))


def test_a_released_card_is_on_probation_then_free() -> None:
    """Released: its fence goes and its probation rule comes (NoSchedule, its own key:
    tolerating workloads only); at the probation's end that goes too."""
    back = released(NOW)
    fence = rule(back)
    done = plan(back, rules=(fence,), probation_s=600)
    (made,) = [a for a in done if isinstance(a, FenceDevice)]
    assert made.kind == PROBATION and made.effect == "NoSchedule" and made.device == GPU3
    assert made.expires == NOW + dt.timedelta(seconds=600)
    assert Unfence(NODE, fence.name, back.name) in done
    # Released in this very pass: on probation at once.
    (same_pass,) = [
        a
        for a in plan(record(), rules=(fence,), phases={record().name: Phase.RESOLVED},
                      probation_s=600)
        if isinstance(a, FenceDevice)
    ]  # fmt: skip
    assert same_pass.kind == PROBATION
    on = FenceView(probation_name(back.name), NODE, back.name, GPU3, "NoSchedule")
    assert plan(back, rules=(on,), probation_s=600, now=NOW + dt.timedelta(seconds=599)) == []
    assert plan(back, rules=(on,), probation_s=600, now=NOW + dt.timedelta(seconds=600)) == [
        Unfence(NODE, on.name, back.name)
    ]


def test_a_fault_on_probation_goes_straight_back_to_quarantine() -> None:
    back = released(NOW)
    on = FenceView(probation_name(back.name), NODE, back.name, GPU3, "NoSchedule")
    again = dataclasses.replace(record(Phase.QUARANTINED), name="again", fault_id=f"{DEVICE_ID}#2")
    done = plan(back, again, rules=(on,), probation_s=600)
    assert Unfence(NODE, on.name, back.name) in done
    (fence,) = [a for a in done if isinstance(a, FenceDevice)]
    assert fence.record == "again" and fence.kind == FENCE


def test_a_dra_gpu_unknown_past_the_tolerance_is_kept_from_new_claims_not_moved() -> None:
    """Unknown within the tolerance: Events only. Past it: suspect, and a NoSchedule rule
    of its own keeps new claims off the card; its pod stays (suspect is no fault), and
    the rule goes once the card reports again."""
    holder = PodView("training", "train-3", "uid-3", NODE, "Running", gpu=True, gpu_count=1)
    node = NodeView(NODE, "1", conditions=(READY,), devices=DEVICES)

    def state(
        health: DeviceHealth, unknown_for: float, rules: tuple[FenceView, ...] = ()
    ) -> DeviceState:
        since = NOW - dt.timedelta(seconds=unknown_for)
        report = DeviceReport(DRIVER, DEVICE_ID, health)
        fences = Fences({r.name: r for r in rules}, "v1")
        return DeviceState(node, (DeviceEntry(holder, report, since, since),), fences=fences)

    tolerance = CFG.device_health.unknown_tolerance_seconds
    within = plan_devices(state(DeviceHealth.UNKNOWN, tolerance - 1), CFG, NOW)
    assert not [a for a in within.actions if isinstance(a, FenceDevice)]
    past = plan_devices(state(DeviceHealth.UNKNOWN, tolerance + 1), CFG, NOW)
    (made,) = [a for a in past.actions if isinstance(a, FenceDevice)]
    assert (made.kind, made.device, made.effect) == (SUSPECT, GPU3, "NoSchedule")
    assert made.record == suspect_name(NODE, DEVICE_ID)
    assert not [a for a in past.actions if isinstance(a, Evict | CreateDeviceRecord)]
    rule_there = FenceView(made.record, NODE, made.record, GPU3, "NoSchedule")
    again = plan_devices(state(DeviceHealth.HEALTHY, 0, (rule_there,)), CFG, NOW)
    assert [a for a in again.actions if isinstance(a, Unfence)] == [
        Unfence(NODE, made.record, made.record, "v1")
    ]


def test_readyz_says_when_dra_gpus_have_no_fence_and_only_then() -> None:
    assert fence_problem(0, "", True, "NoSchedule") is None  # no DRA GPU: nothing to say
    assert fence_problem(8, "v1beta2", True, "NoSchedule") is None
    assert fence_problem(8, "", False, "NoSchedule") is None  # not looked yet
    missing = fence_problem(8, "", True, "NoSchedule")
    assert missing is not None and "no DeviceTaintRules" in missing and "8 DRA GPUs" in missing
    off = fence_problem(8, "v1", True, "off")
    assert off is not None and off.startswith("device fence off")
