"""`gpuheal doctor` on a DRA node: the GPUs its driver publishes, the usable ones, and
which device fence the cluster serves (from hand-built objects, no server)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

import msgspec
import pytest

from gpuheal.config import Config, DeviceHealthConfig, PoolConfig, PoolsConfig
from gpuheal.kube.details import Node
from gpuheal.kube.snapshot import NodeDra
from gpuheal.model import DeviceKey, DeviceTaint, DraDevice
from gpuheal.ops.findings import Facts
from gpuheal.ops.visibility import question_gpus
from gpuheal.sim.dra import dra_node

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 12, 7, 8, 0, tzinfo=dt.UTC)
NAME = "aks-gpu-12345678-vmss000003"
DRIVER = "gpu.nvidia.com"
DEVICES = tuple(
    DraDevice(
        DeviceKey(DRIVER, NAME, f"gpu-{i}"),
        NAME,
        f"GPU-7d1c4e2a-9b3f-4a5c-8e6d-1f2a3b4c5d{i:02x}",
        "gpu",
    )
    for i in range(8)
)
CONFIG = Config(pools=PoolsConfig(by_name={"a100": PoolConfig(gpus_per_node=8)}))


def facts(devices: tuple[DraDevice, ...] = DEVICES, fence_api: str | None = "v1beta2") -> Facts:
    node = msgspec.json.decode(
        json.dumps(dra_node(NAME, labels={"gpuheal.io/pool": "a100"})), type=Node
    )
    return Facts(name=NAME, node=node, now=NOW, dra=NodeDra(devices, fence_api))


def said(found: Facts, config: Config = CONFIG) -> dict[str, tuple[str, str]]:
    assert found.node is not None
    return {f.kind: (f.severity, f.text) for f in question_gpus(found.node, found, config)}


def test_a_healthy_dra_node_counts_its_published_gpus_and_names_its_fence() -> None:
    answer = said(facts())
    assert answer["gpus-visible"] == (
        "ok",
        f"The DRA driver ({DRIVER}) publishes 8 GPUs, all usable, as expected "
        "(gpusPerNode of pool a100).",
    )
    assert answer["device-fence"][0] == "ok"
    assert "resource.k8s.io/v1beta2, NoSchedule" in answer["device-fence"][1]
    assert "not-gpu-node" not in answer and "zero-allocatable" not in answer


def test_a_tainted_card_is_named_and_a_missing_one_is_bad() -> None:
    fenced = replace(DEVICES[3], taints=(DeviceTaint("gpuheal.io/gpu-fault", "f1"),))
    tainted = said(facts((*DEVICES[:3], fenced, *DEVICES[4:])))
    assert tainted["gpus-tainted"] == (
        "warn",
        f"The DRA driver ({DRIVER}) publishes 8 GPUs; 7 usable: taints keep new claims off "
        "gpu-3 (gpuheal.io/gpu-fault).",
    )
    # A taint of effect None keeps nobody off: no finding.
    noted = replace(DEVICES[3], taints=(DeviceTaint(f"{DRIVER}/xid", "13", "None"),))
    assert "gpus-visible" in said(facts((*DEVICES[:3], noted, *DEVICES[4:])))
    missing = said(facts(DEVICES[:7]))
    assert missing["gpus-missing"][0] == "bad"
    assert "should have 8 (gpusPerNode of pool a100): 1 missing" in missing["gpus-missing"][1]


def test_without_a_device_fence_it_says_the_node_is_quarantined_instead() -> None:
    none = said(facts(fence_api=""))
    assert none["no-device-fence"][0] == "warn"
    assert "gpuheal quarantines the whole node instead" in none["no-device-fence"][1]
    assert "--runtime-config=resource.k8s.io/v1beta2=true" in none["no-device-fence"][1]
    off = replace(CONFIG, device_health=DeviceHealthConfig(fence="off"))
    assert said(facts(), off)["device-fence"][0] == "info"
    assert said(facts(fence_api=None))["device-fence"][0] == "info"  # could not read the rules
