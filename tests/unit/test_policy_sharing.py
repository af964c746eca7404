"""GPU sharing in the health gate: time-slicing and MPS replicas, the MIG strategies and
the MIG layout asked for, with GPU Feature Discovery's labels as its labeler writes them
(NVIDIA/k8s-device-plugin internal/lm/mig-strategy_test.go: gpu.count is the physical
GPUs, gpu.replicas the replicas per GPU, 0 for MIG devices)."""

from __future__ import annotations

import datetime as dt

import pytest

from gpuheal.config import Config
from gpuheal.model import MIG_LAYOUT
from gpuheal.policy.gate import GPU_COUNT, CheckResult, GateFacts, evaluate
from gpuheal.policy.sharing import layout, physical_gpus

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
TIME_SLICED = {
    **H100,
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
}


def gpu_count(
    labels: dict[str, str], allocatable: dict[str, int], **annotations: str
) -> tuple[CheckResult, str]:
    facts = GateFacts("n1", True, labels, annotations, allocatable)
    found = next(c for c in evaluate(facts, Config(), NOW, None).checks if c.name == GPU_COUNT)
    return found.result, found.reason


def test_a_time_sliced_node_offers_each_gpu_replicas_times() -> None:
    result, reason = gpu_count(TIME_SLICED, {"nvidia.com/gpu": 32})
    assert result is CheckResult.PASS and "8 GPUs x 4 time-slicing replicas" in reason
    result, reason = gpu_count(TIME_SLICED, {"nvidia.com/gpu": 28})  # a GPU's replicas gone
    assert result is CheckResult.FAIL and "28 nvidia.com/gpu allocatable, expected 32" in reason
    # Before: allocatable had to equal nvidia.com/gpu.count, and a healthy shared node
    # failed the gate forever.
    assert gpu_count(TIME_SLICED, {"nvidia.com/gpu": 8})[0] is CheckResult.FAIL


def test_renamed_shared_gpus_and_mps() -> None:
    assert gpu_count(TIME_SLICED, {"nvidia.com/gpu.shared": 32})[0] is CheckResult.PASS
    mps = {**TIME_SLICED, "nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "2"}
    assert gpu_count(mps, {"nvidia.com/gpu": 16})[0] is CheckResult.PASS
    assert physical_gpus("nvidia.com/gpu", 16, mps) == 8


def test_mig_single_counts_mig_devices_as_gfd_does() -> None:
    single = {
        "nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.count": "56",
        "nvidia.com/gpu.replicas": "0",
        "nvidia.com/mig.strategy": "single",
    }
    assert gpu_count(single, {"nvidia.com/gpu": 56})[0] is CheckResult.PASS
    assert gpu_count(single, {"nvidia.com/gpu": 49})[0] is CheckResult.FAIL


def test_mig_mixed_checks_every_profile() -> None:
    mixed = {
        **H100,
        "nvidia.com/gpu.count": "4",  # the GPUs without MIG
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-3g.40gb.count": "8",
        "nvidia.com/mig-1g.10gb.count": "14",
    }
    offered = {"nvidia.com/gpu": 4, "nvidia.com/mig-3g.40gb": 8, "nvidia.com/mig-1g.10gb": 14}
    assert gpu_count(mixed, offered)[0] is CheckResult.PASS
    result, reason = gpu_count(mixed, {**offered, "nvidia.com/mig-1g.10gb": 7})
    assert (
        result is CheckResult.FAIL and "7 nvidia.com/mig-1g.10gb allocatable, expected 14" in reason
    )


def test_a_mig_layout_lost_across_a_reboot_fails_naming_both() -> None:
    asked = {**H100, "nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.strategy": "single"}
    lost = {**asked, "nvidia.com/mig.config.state": "failed"}
    result, reason = gpu_count(lost, {"nvidia.com/gpu": 8}, **{MIG_LAYOUT: "disabled"})
    assert result is CheckResult.FAIL
    assert "nvidia.com/mig.config=all-1g.10gb" in reason and "state=failed" in reason
    assert "the agent sees disabled" in reason
    # The MIG manager says success, but the agent's NVML sees another layout.
    applied = {**asked, "nvidia.com/mig.config.state": "success", "nvidia.com/gpu.count": "56"}
    other = layout({"3g.40gb": 16})
    result, reason = gpu_count(applied, {"nvidia.com/gpu": 56}, **{MIG_LAYOUT: other})
    assert result is CheckResult.FAIL and "all-1g.10gb" in reason and "3g.40gb=16" in reason
    # As asked: passes.
    seen = layout({"1g.10gb": 56})
    assert gpu_count(applied, {"nvidia.com/gpu": 56}, **{MIG_LAYOUT: seen})[0] is CheckResult.PASS
    disabled = {
        **H100,
        "nvidia.com/mig.config": "all-disabled",
        "nvidia.com/mig.config.state": "success",
    }
    assert (
        gpu_count(disabled, {"nvidia.com/gpu": 8}, **{MIG_LAYOUT: "disabled"})[0]
        is CheckResult.PASS
    )
    assert gpu_count(disabled, {"nvidia.com/gpu": 8}, **{MIG_LAYOUT: seen})[0] is CheckResult.FAIL


def test_layout_is_sorted_and_says_disabled() -> None:
    assert layout({"3g.40gb": 2, "1g.10gb": 7}) == "1g.10gb=7,3g.40gb=2"
    assert layout({}) == "disabled" == layout({"1g.10gb": 0})
