"""The agent's finding on one GPU of a DRA node: the card's fault, not the node's,
exactly where NVIDIA's catalogue keeps the fault on that GPU and the card can be
fenced alone; the node's in every other case."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from gpuheal.clock import iso
from gpuheal.config import Config, DeviceHealthConfig
from gpuheal.model import (
    FAULT_DEVICES,
    FAULT_ID,
    FAULT_REASON,
    FAULT_TIME,
    STATUS,
    Condition,
    DeviceHealth,
    DeviceKey,
    DraDevice,
    FaultRecord,
    NodeView,
    Phase,
    PodView,
    fault_record_name,
)
from gpuheal.policy import agentdevice
from gpuheal.policy.actions import AddTaint, Evict, NodeState
from gpuheal.policy.devicefence import FenceDevice, Fences
from gpuheal.policy.devices import CreateDeviceRecord, DeviceState, plan_devices
from gpuheal.policy.plan import current_signal, plan
from gpuheal.sources import Seen
from tests.corpus import GKE_NODE

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 12, 7, 8, 0, tzinfo=dt.UTC)
NODE = GKE_NODE  # a GKE node name as long as GKE makes them
DRIVER = "gpu.nvidia.com"
READY = Condition(type="Ready", status="True")
UUIDS = tuple(f"GPU-8d2f4c1a-7b3e-4f0a-9c6d-5e1b2a3c4d{i:02d}" for i in range(8))
DEVICES = tuple(
    DraDevice(DeviceKey(DRIVER, NODE, f"gpu-{i}"), NODE, UUIDS[i], "gpu") for i in range(8)
)
CFG = Config(device_health=DeviceHealthConfig(quarantine_seconds=600))
FAULT = "kmsg-1733561000-48"


def node(
    reason: str = "EccDoubleBit48",
    devices: tuple[str, ...] = (UUIDS[3],),
    dra: tuple[DraDevice, ...] = DEVICES,
) -> NodeView:
    annotations = {
        STATUS: "faulty",
        FAULT_ID: FAULT,
        FAULT_TIME: iso(NOW - dt.timedelta(seconds=4)),
        FAULT_REASON: reason,
        FAULT_DEVICES: ",".join(devices),
    }
    return NodeView(NODE, "1", conditions=(READY,), annotations=annotations, devices=dra)


def seen(
    view: NodeView,
    *,
    fence: bool = True,
    config: Config = CFG,
    records: tuple[FaultRecord, ...] = (),
) -> Seen:
    return Seen(view, config, records=records, device_fence=fence)


def card(
    view: NodeView,
    *,
    fence: bool = True,
    config: Config = CFG,
    records: tuple[FaultRecord, ...] = (),
) -> DraDevice | None:
    s = seen(view, fence=fence, config=config, records=records)
    signal = current_signal(replace(s, device_fence=False))
    assert signal is not None
    return agentdevice.card_of(s, signal)


@pytest.mark.parametrize(
    "reason", ["EccDoubleBit48", "EccUncontained95", "GspTimeout119", "RowRemapFailure64"]
)
def test_a_fault_of_the_gpu_itself_on_one_card_is_that_card_s(reason: str) -> None:
    assert card(node(reason)) == DEVICES[3]


@pytest.mark.parametrize(
    "reason",
    [
        "XidCritical79",  # fallen off the bus: NVIDIA says reboot
        "NvlinkError74",  # the NVLink fabric, which on NVSwitch systems every GPU crosses
        "NetirError149",  # an NVLink5 error (NVL72 racks)
        "AliTrainingFail136",  # an NVLink's training at bring-up
        "GpuLost",  # no Xid names it
        "EccUncorrectable",  # NVML's level probe: no Xid code
        "Foo48",  # a code at the end is not an Xid's reason
    ],
)
def test_a_reboot_a_link_or_a_finding_no_xid_names_stays_the_node_s(reason: str) -> None:
    assert card(node(reason)) is None


def test_two_gpus_an_unknown_gpu_or_a_partitioned_one_stay_the_node_s() -> None:
    assert card(node(devices=(UUIDS[3], UUIDS[4]))) is None
    assert card(node(devices=("GPU-00000000-0000-0000-0000-000000000000",))) is None
    assert card(node(devices=("0000:3b:00.0",))) is None  # NVML was not there to name it
    mig = tuple(
        replace(d, uuid=f"MIG-{i}", kind="mig", parent_uuid=d.uuid) for i, d in enumerate(DEVICES)
    )
    assert card(node(dra=mig)) is None
    assert card(node(dra=())) is None  # a device-plugin node


def test_without_a_fence_to_place_the_node_path_holds() -> None:
    assert card(node(), fence=False) is None
    off = Config(device_health=DeviceHealthConfig(fence="off"))
    assert card(node(), config=off) is None
    disabled = Config(device_health=DeviceHealthConfig(enabled=False))
    assert card(node(), config=disabled) is None


def test_a_fault_the_node_s_plan_began_stays_the_node_s() -> None:
    begun = FaultRecord(
        name=fault_record_name(NODE, FAULT),
        node=NODE,
        fault_id=FAULT,
        phase=Phase.QUARANTINED,
        reason="EccDoubleBit48",
        created_at=iso(NOW),
    )
    assert card(node(), records=(begun,)) is None


def test_the_node_plan_leaves_it_and_the_device_plan_fences_the_card() -> None:
    view = node()
    fenced = plan(NodeState(node=view, device_fence=True), CFG, NOW)
    assert not [a for a in fenced.actions if isinstance(a, AddTaint)]
    assert fenced.fault_id == ""
    unfenced = plan(NodeState(node=view, device_fence=False), CFG, NOW)
    assert [a for a in unfenced.actions if isinstance(a, AddTaint)]

    holder = PodView("training", "train-3", "u3", NODE, "Running", gpu=True, gpu_count=1,
                     held=(DEVICES[3],))  # fmt: skip
    other = PodView("training", "train-4", "u4", NODE, "Running", gpu=True, gpu_count=1,
                    held=(DEVICES[4],))  # fmt: skip
    (report,) = agentdevice.reports(seen(view), (holder, other))
    assert report.health is DeviceHealth.UNHEALTHY and report.holders == (holder,)
    state = DeviceState(node=view, fences=Fences({}, "v1beta2"), driver=(report,))
    done = plan_devices(state, CFG, NOW)
    (created,) = [a for a in done.actions if isinstance(a, CreateDeviceRecord)]
    assert created.record.device == f"{DRIVER}/{NODE}/gpu-3"
    assert created.message == f"agent: EccDoubleBit48 on {UUIDS[3]}"
    assert [a.device for a in done.actions if isinstance(a, FenceDevice)] == [DEVICES[3].key]
    assert [a.pod.name for a in done.actions if isinstance(a, Evict)] == ["train-3"]
