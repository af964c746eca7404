"""The degradation signals (agent/degradation.py): what must be found, and, as much,
what must not (a PCIe link idling down, one power spike, a slow replay count).

Each test walks one GPU's readings through time, round by round, as the agent's probe
does every `intervalSeconds` (10 s by default)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pytest

from gpuheal.agent.degradation import (
    FABRIC_COMPLETED,
    FABRIC_IN_PROGRESS,
    FABRIC_NOT_STARTED,
    FABRIC_NOT_SUPPORTED,
    GPU_IDLE,
    DegradationJudge,
    Fabric,
    Limits,
    Readings,
    dcgm_replay_limit,
    vbios_mismatch,
)
from gpuheal.agent.findings import ProbeFinding
from gpuheal.model import Severity
from gpuheal.xid.limits import HW_POWER_BRAKE, HW_SLOWDOWN

GPU = "GPU-3f1ee7a4-6f0e-9d3c-5e7b-8d4c2a1b0c9e"
ROUND_S = 10.0
HEALTHY = Readings(
    name="NVIDIA H100 80GB HBM3",
    pcie_replays=0,
    pcie_width=(16, 16),
    pcie_generation=(5, 5),
    clock_reasons=0,
    power_mw=350_000,
    power_limit_mw=700_000,
    nvlink_errors={"crcFlit": 0, "crcData": 0, "replay": 0, "recovery": 0},
    fabric=Fabric(FABRIC_COMPLETED, 0),
    persistence=True,
    vbios="96.00.89.00.01",
)


def walk(rounds: Iterable[Readings], limits: Limits | None = None) -> list[list[ProbeFinding]]:
    """Each round's findings, one round every ROUND_S seconds."""
    judge = DegradationJudge(limits or Limits())
    return [judge.judge(GPU, seen, i * ROUND_S) for i, seen in enumerate(rounds)]


def minutes(n: float) -> int:
    return int(n * 60 / ROUND_S)


def reasons(found: list[ProbeFinding], severity: Severity | None = None) -> set[str]:
    return {f.reason for f in found if severity is None or f.severity is severity}


def changed(**fields: object) -> Readings:
    return dataclasses.replace(HEALTHY, **fields)  # type: ignore[arg-type]


def test_a_healthy_gpu_is_never_judged_anything() -> None:
    assert all(found == [] for found in walk([HEALTHY] * minutes(30)))


def test_a_gpu_that_supports_none_of_the_reads_is_judged_nothing() -> None:
    assert all(found == [] for found in walk([Readings()] * minutes(30)))


# -- PCIe ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("generation", "lanes", "limit"), [(4, 16, 16), (5, 16, 31), (3, 8, 4), (9, 16, 62)]
)
def test_dcgm_s_replay_limit_follows_the_link(generation: int, lanes: int, limit: int) -> None:
    assert dcgm_replay_limit(generation, lanes) == limit


def test_a_slowly_growing_pcie_replay_count_is_no_finding() -> None:
    """A healthy link replays now and then: 2 a minute for an hour is below any limit."""
    rounds = [changed(pcie_replays=i // 3) for i in range(minutes(60))]
    assert all(found == [] for found in walk(rounds))


def test_a_pcie_replay_burst_above_dcgm_s_limit_is_a_warning_never_a_fault() -> None:
    # Gen5 x16: DCGM's limit is 31 a minute; 60 a round is 360 a minute.
    rounds = [changed(pcie_replays=60 * i) for i in range(minutes(30))]
    found = walk(rounds)
    assert "PcieReplayRate" in reasons(found[minutes(1) + 1], Severity.P2)
    assert not any(f.severity is not Severity.P2 for r in found for f in r)


def test_the_replay_limit_can_be_set_and_a_counter_reset_starts_over() -> None:
    limits = Limits(pcie_replays_per_minute=3)
    rounds = [changed(pcie_replays=i) for i in range(minutes(2))]  # 6 a minute
    assert "PcieReplayRate" in reasons(walk(rounds, limits)[-1])
    # A GPU reset zeroes the counter: the drop is not a negative rate, nor a burst.
    after_reset = [changed(pcie_replays=10_000)] * 3 + [changed(pcie_replays=0)] * 3
    assert all(found == [] for found in walk(after_reset, limits))


def test_a_pcie_link_narrower_than_the_card_is_a_fault_once_it_holds() -> None:
    narrow = changed(pcie_width=(8, 16))
    found = walk([narrow] * minutes(2) + [HEALTHY])
    assert found[minutes(1) - 1] == []  # 50 s: a link may retrain
    assert reasons(found[minutes(1)], Severity.P1) == {"PcieLinkDegraded"}
    assert found[-1] == []  # retrained to x16: nothing left


def test_an_idle_gpu_s_link_at_a_lower_generation_is_normal() -> None:
    """GPUs train their link down when idle to save power (nvidia-smi shows Gen1)."""
    idle = changed(pcie_generation=(1, 5), clock_reasons=GPU_IDLE)
    assert all(found == [] for found in walk([idle] * minutes(30)))


def test_a_busy_gpu_s_link_below_its_generation_is_a_warning() -> None:
    busy = changed(pcie_generation=(3, 5))
    found = walk([busy] * minutes(2))
    assert reasons(found[-1]) == {"PcieGenerationLow"}
    assert all(f.severity is Severity.P2 for r in found for f in r)


# -- clocks and power ------------------------------------------------------------


def test_one_hardware_slowdown_is_a_warning_and_never_a_fault() -> None:
    spike = changed(clock_reasons=HW_SLOWDOWN)
    found = walk([HEALTHY] * minutes(10) + [spike] + [HEALTHY] * minutes(20))
    assert reasons(found[minutes(10)]) == {"HwSlowdown"}
    assert found[minutes(10)][0].severity is Severity.P2
    assert not any(f.severity is Severity.P1 for r in found for f in r)


def test_a_slowdown_held_most_of_the_window_is_a_fault() -> None:
    # On 7 rounds of every 10: 70 % of the last 10 minutes, above GPUd's 60 %.
    rounds = [changed(clock_reasons=HW_SLOWDOWN if i % 10 < 7 else 0) for i in range(minutes(15))]
    found = walk(rounds)
    assert not any(f.severity is Severity.P1 for r in found[: minutes(10)] for f in r)
    faults = [i for i, r in enumerate(found) if "HwSlowdown" in reasons(r, Severity.P1)]
    assert faults and faults[0] >= minutes(10)


def test_a_slowdown_held_half_the_window_is_no_fault() -> None:
    rounds = [changed(clock_reasons=HW_SLOWDOWN if i % 2 else 0) for i in range(minutes(30))]
    assert not any(f.severity is Severity.P1 for r in walk(rounds) for f in r)


def test_the_power_supply_s_brake_held_is_its_own_fault() -> None:
    found = walk([changed(clock_reasons=HW_POWER_BRAKE)] * minutes(11))
    assert reasons(found[-1], Severity.P1) == {"HwPowerBrakeSlowdown"}


def test_the_driver_keeping_the_gpu_in_its_power_limit_is_normal() -> None:
    capped = changed(clock_reasons=0x4 | 0x10, power_mw=700_000)  # SwPowerCap, SyncBoost
    assert all(found == [] for found in walk([capped] * minutes(30)))


def test_power_drawn_far_above_the_enforced_limit_for_a_minute_is_a_warning() -> None:
    over = changed(power_mw=800_000, power_limit_mw=700_000)
    found = walk([over] * minutes(1) + [over, HEALTHY])
    assert found[minutes(1) - 1] == []
    assert reasons(found[minutes(1)], Severity.P2) == {"PowerOverLimit"}
    assert found[-1] == []


# -- NVLink ----------------------------------------------------------------------


def nvlink(**errors: int) -> Readings:
    return changed(nvlink_errors={**HEALTHY.nvlink_errors, **errors})


def test_nvlink_crc_errors_below_dcgm_s_rate_are_a_warning() -> None:
    # 1,000 a round is 100 a second over a minute: the limit; 500 a round is half.
    rounds = [nvlink(crcFlit=500 * i) for i in range(minutes(10))]
    found = walk(rounds)
    assert reasons(found[-1]) == {"NvlinkCrcErrors"}
    assert not any(f.severity is Severity.P1 for r in found for f in r)


def test_nvlink_crc_errors_at_dcgm_s_rate_are_a_fault() -> None:
    rounds = [nvlink(crcData=1_000 * i) for i in range(minutes(2))]
    assert reasons(walk(rounds)[-1], Severity.P1) == {"NvlinkCrcErrors"}


@pytest.mark.parametrize(
    ("key", "reason"), [("replay", "NvlinkReplayErrors"), ("recovery", "NvlinkRecoveryErrors")]
)
def test_one_nvlink_replay_or_recovery_is_a_fault_held_for_the_window(
    key: str, reason: str
) -> None:
    rounds = [nvlink()] * 3 + [nvlink(**{key: 1})] * minutes(12)
    found = walk(rounds)
    assert reasons(found[3], Severity.P1) == {reason}
    assert reasons(found[3 + minutes(10) - 1], Severity.P1) == {reason}
    assert found[-1] == []  # no more since: gone after the window


def test_nvlink_errors_from_before_the_agent_watched_are_not_new() -> None:
    old = nvlink(crcFlit=10**9, replay=40, recovery=3)
    assert all(found == [] for found in walk([old] * minutes(20)))


def test_nvlink_thresholds_can_be_raised_or_turned_off() -> None:
    rounds = [nvlink()] + [nvlink(replay=2, recovery=5)] * 3
    found = walk(rounds, Limits(nvlink_replay_errors=3, nvlink_recovery_errors=0))
    assert all(r == [] for r in found)


# -- fabric, persistence, VBIOS ------------------------------------------------


def test_a_fabric_still_registering_after_boot_is_given_its_grace() -> None:
    pending = changed(fabric=Fabric(FABRIC_IN_PROGRESS, 0))
    found = walk([pending] * minutes(6) + [HEALTHY])
    assert all(r == [] for r in found[: minutes(5)])
    assert reasons(found[minutes(5)], Severity.P1) == {"FabricNotReady"}
    assert found[-1] == []


def test_a_fabric_never_started_says_to_look_at_fabric_manager() -> None:
    found = walk([changed(fabric=Fabric(FABRIC_NOT_STARTED, 0))] * minutes(6))
    assert "Fabric Manager" in found[-1][0].message


def test_a_failed_fabric_registration_is_a_fault_at_once() -> None:
    (found,) = walk([changed(fabric=Fabric(FABRIC_COMPLETED, 999))])
    assert reasons(found, Severity.P1) == {"FabricRegistrationFailed"}


def test_fabric_health_bits() -> None:
    degraded = changed(fabric=Fabric(FABRIC_COMPLETED, 0, health_mask=1))
    fine = changed(fabric=Fabric(FABRIC_COMPLETED, 0, health_mask=2))  # DEGRADED_BW_FALSE
    assert reasons(walk([degraded])[0], Severity.P2) == {"FabricDegradedBandwidth"}
    assert walk([fine])[0] == []
    assert walk([changed(fabric=Fabric(FABRIC_NOT_SUPPORTED, 0))] * minutes(10))[-1] == []


def test_persistence_mode_off_is_a_warning_where_it_is_expected() -> None:
    off = changed(persistence=False)
    assert reasons(walk([off])[0], Severity.P2) == {"PersistenceModeOff"}
    assert walk([off], Limits(expect_persistence_mode=False))[0] == []


def test_a_vbios_unlike_its_siblings_is_named() -> None:
    node = {f"GPU-{i}": HEALTHY for i in range(8)}
    node["GPU-5"] = changed(vbios="96.00.61.00.01")
    (found,) = vbios_mismatch(node)
    assert (found.reason, found.severity, found.devices) == (
        "VbiosMismatch",
        Severity.P2,
        ("GPU-5",),
    )
    assert "96.00.89.00.01" in found.message
    # Two models on one node may run different VBIOS: that is no mismatch.
    node["GPU-5"] = changed(vbios="92.00.19.00.01", name="NVIDIA A100-SXM4-80GB")
    assert vbios_mismatch(node) == []


def test_a_gpu_no_longer_seen_is_forgotten() -> None:
    judge = DegradationJudge(Limits())
    narrow = changed(pcie_width=(8, 16))
    judge.judge(GPU, narrow, 0.0)
    judge.forget_except(set())
    # Its past is gone: the narrow link must hold a minute again before it counts.
    assert judge.judge(GPU, narrow, 61.0) == []
