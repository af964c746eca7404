"""NVIDIA's DRA driver's own device taints as a fault source: what each means."""

from __future__ import annotations

import copy

import pytest

from gpuheal.model import Severity
from gpuheal.policy.drivertaints import (
    LOST_KEY,
    UNMONITORED_KEY,
    XID_KEY,
    DriverTaint,
    Scope,
    driver_taints,
    meaning,
)
from gpuheal.sim.agent import gpu_spec
from gpuheal.sim.dra import resource_slice, with_taint
from gpuheal.xid import Action, Kind, XidRow

pytestmark = pytest.mark.unit

NODE = "aks-gpu-12345678-vmss000003"


def taints_of(item: dict[str, object]) -> tuple[DriverTaint, ...]:
    stored = copy.deepcopy(item)
    stored["metadata"] = {"name": "00000-gpu.nvidia.com-x"}
    return driver_taints([stored])


def one(key: str, value: str = "", effect: str = "NoSchedule") -> DriverTaint:
    (taint,) = taints_of(
        with_taint(resource_slice(NODE, gpu_spec(NODE)), "gpu-3", key, value, effect)
    )
    return taint


@pytest.mark.parametrize("effect", ["None", "NoSchedule"])
@pytest.mark.parametrize("xid", [13, 31, 43, 45, 94])
def test_an_application_xid_is_nothing_whatever_effect_the_driver_chose(
    xid: int, effect: str
) -> None:
    said = meaning(one(XID_KEY, str(xid), effect))
    assert said is not None and said.scope is Scope.NOTHING and said.severity is None


def test_xid_79_is_the_nodes_fault_and_a_double_bit_ecc_error_stays_on_the_gpu() -> None:
    off_the_bus = meaning(one(XID_KEY, "79"))
    assert off_the_bus is not None
    assert (off_the_bus.scope, off_the_bus.reason, off_the_bus.severity) == (
        Scope.NODE,
        "XidCritical79",
        Severity.P0,
    )
    ecc = meaning(one(XID_KEY, "48"))
    assert ecc is not None and (ecc.scope, ecc.reason) == (Scope.DEVICE, "EccDoubleBit48")


def test_an_nvlink_error_takes_the_node_its_fabric_serves() -> None:
    said = meaning(one(XID_KEY, "74"))
    assert said is not None and said.scope is Scope.NODE


def test_lost_unmonitored_foreign_and_unreadable_taints() -> None:
    lost = meaning(one(LOST_KEY))
    assert lost is not None and lost.scope is Scope.NODE and lost.severity is Severity.P0
    unmonitored = meaning(one(UNMONITORED_KEY, effect="None"))
    assert unmonitored is not None and unmonitored.scope is Scope.UNKNOWN
    assert unmonitored.severity is None
    assert meaning(one("example.com/maintenance", "x")) is None
    garbled = meaning(one(XID_KEY, "seventy-nine"))
    assert garbled is not None and garbled.scope is Scope.UNKNOWN and garbled.severity is None


def test_a_configured_override_decides_as_for_every_other_source() -> None:
    row = XidRow("XidWatched13", Severity.P1, Action.RESET_GPU, "site rule", kind=Kind.NODE)
    said = meaning(one(XID_KEY, "13"), {13: row})
    assert said is not None and (said.scope, said.reason) == (Scope.DEVICE, "XidWatched13")


def test_taints_are_read_with_their_device_and_other_drivers_are_left_out() -> None:
    spec = gpu_spec(NODE)
    item = with_taint(resource_slice(NODE, spec), "gpu-3", XID_KEY, "79")
    nic = with_taint(copy.deepcopy(item), "gpu-3", XID_KEY, "48")
    nic["spec"]["driver"] = "sriovnetwork.k8s.io"
    nic["spec"]["pool"]["name"] = "nic-pool"
    found = driver_taints([item, nic])
    assert [(t.device.uuid, t.key, t.value) for t in found] == [
        (spec["devices"][3]["uuid"], XID_KEY, "79")
    ]
