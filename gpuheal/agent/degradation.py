"""Degradation: what a GPU's states and counters say when judged over time.

An Xid is an event and says what broke. A PCIe link trained at half width, a clock
held down by the board's slowdown line, NVLink errors climbing, a GPU the NVSwitch
fabric never registered: none of these is an event, and most of them are normal for a
moment (a GPU idles its PCIe link down, a power spike brakes the clocks once). So each
is judged here against time: a counter as a rate over a window, a state by how long it
has held. Pure: readings, the time and the limits in, findings out; the only state is
each GPU's recent past. The meaning and source of each signal: docs/agent.md,
"Degradation signals".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuheal.agent.findings import ProbeFinding
from gpuheal.agent.past import Past
from gpuheal.model import Severity
from gpuheal.xid.limits import (
    HARDWARE_SLOWDOWNS,
    NVLINK_CRC_PER_SECOND,
    NVLINK_CRC_REASON,
    NVLINK_ERRORS,
    NVLINK_RECOVERY_REASON,
    NVLINK_REPLAY_REASON,
    NVLINK_WINDOW_SECONDS,
    SLOWDOWN_SHARE,
    SLOWDOWN_WINDOW_SECONDS,
)

# nvmlClocksEventReason* bits (nvml.h); the hardware slowdowns are gpuheal/xid/limits.py's
# (the DCGM source reads them too). SwPowerCap and SwThermalSlowdown are the driver
# keeping the GPU inside its limits, normal under load; GpuIdle says nothing runs.
GPU_IDLE = 0x1
SW_THERMAL = 0x20

# nvmlGpuFabricState_t, and the degraded-bandwidth field of nvmlGpuFabricInfo_v2's
# healthMask (NVML_GPU_FABRIC_HEALTH_MASK_*_DEGRADED_BW).
FABRIC_NOT_SUPPORTED, FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED = 0, 1, 2, 3
_DEGRADED_BW_SHIFT, _DEGRADED_BW_WIDTH, _DEGRADED_BW_TRUE = 0, 0x3, 1

# The NVLink error counters read (NVML_FI_DEV_NVLINK_*_COUNT_TOTAL, all links summed).
NVLINK_CRC_FLIT, NVLINK_CRC_DATA, NVLINK_REPLAY, NVLINK_RECOVERY = (
    "crcFlit",
    "crcData",
    "replay",
    "recovery",
)


@dataclass(frozen=True)
class Fabric:
    """nvmlDeviceGetGpuFabricInfoV: where the GPU is in joining the NVSwitch fabric."""

    state: int
    status: int  # an nvmlReturn_t: the registration's result once COMPLETED
    health_mask: int = 0


@dataclass(frozen=True)
class Readings:
    """One GPU's degradation readings of one round; None: not supported or not read."""

    name: str = ""
    pcie_replays: int | None = None
    pcie_width: tuple[int, int] | None = None  # (current, the card's maximum)
    pcie_generation: tuple[int, int] | None = None  # (current, the card's maximum)
    clock_reasons: int | None = None
    power_mw: int | None = None
    power_limit_mw: int | None = None  # the enforced limit
    nvlink_errors: Mapping[str, int] = field(default_factory=dict)
    fabric: Fabric | None = None
    persistence: bool | None = None
    vbios: str = ""
    # Usage, for metrics and alerts only (never judged): nvmlDeviceGetUtilizationRates'
    # GPU percentage, nvmlDeviceGetMemoryInfo's bytes.
    utilization_percent: int | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class Limits:
    """Thresholds (the agent's config; the defaults and their sources: docs/agent.md)."""

    # PCIe replays a minute; 0: DCGM's limit for the link's generation and width.
    pcie_replays_per_minute: float = 0.0
    pcie_link_seconds: float = 60.0
    nvlink_crc_per_second: float = NVLINK_CRC_PER_SECOND
    nvlink_replay_errors: int = NVLINK_ERRORS
    nvlink_recovery_errors: int = NVLINK_ERRORS
    # How long NVLink replays and recoveries are counted (and a finding held).
    nvlink_window_seconds: float = NVLINK_WINDOW_SECONDS
    slowdown_window_seconds: float = SLOWDOWN_WINDOW_SECONDS
    slowdown_share: float = SLOWDOWN_SHARE
    fabric_grace_seconds: float = 300.0
    power_over_limit_ratio: float = 1.1
    expect_persistence_mode: bool = True


# DCGM's expected PCIe replays a minute per lane, by generation (a bit error rate of
# 1e-12 at the generation's speed): its limit is ceil(rate x lanes), a WARN above it.
_REPLAYS_PER_LANE = (0.15, 0.3, 0.48, 0.96, 1.92, 3.84)
_MINUTE = 60.0


def dcgm_replay_limit(generation: int, lanes: int) -> int:
    rate = _REPLAYS_PER_LANE[min(max(generation, 1), len(_REPLAYS_PER_LANE)) - 1]
    return math.ceil(rate * lanes)


class DegradationJudge:
    """Judges each GPU's readings against its recent past and the limits."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._past: dict[str, Past] = {}

    def judge(self, uuid: str, seen: Readings, now: float) -> list[ProbeFinding]:
        past = self._past.setdefault(uuid, Past())
        found: list[ProbeFinding] = []
        for check in (_pcie, _clocks, _power, _nvlink, _fabric, _persistence):
            found += check(past, seen, now, self.limits, uuid)
        return found

    def forget_except(self, uuids: set[str]) -> None:
        """Drop the past of GPUs no longer seen (replaced, or renumbered by a reload)."""
        for gone in self._past.keys() - uuids:
            del self._past[gone]


def _finding(reason: str, severity: Severity, uuid: str, what: str) -> ProbeFinding:
    return ProbeFinding(reason, severity, f"GPU {uuid}: {what}", (uuid,))


def _per_minute(increase: int, span_s: float) -> float:
    # Over at least a minute: a burst in the first seconds is not extrapolated.
    return increase * 60.0 / max(span_s, 60.0)


def _pcie(past: Past, seen: Readings, now: float, lim: Limits, uuid: str) -> list[ProbeFinding]:
    found = []
    if seen.pcie_replays is not None:
        # As DCGM's health watch: the last minute's replays against the limit, a warning.
        grew, span = past.increase("pcieReplays", seen.pcie_replays, now, _MINUTE)
        rate = _per_minute(grew, span)
        limit = lim.pcie_replays_per_minute or _link_replay_limit(seen)
        if limit and rate > limit:
            what = f"{rate:.0f} PCIe replays a minute (limit {limit:g})"
            found.append(_finding("PcieReplayRate", Severity.P2, uuid, what))
    if seen.pcie_width is not None:
        current, most = seen.pcie_width
        held = past.held("pcieWidth", 0 < current < most, now)
        if held is not None and held >= lim.pcie_link_seconds:
            what = f"PCIe link at x{current}, the card's maximum is x{most}"
            found.append(_finding("PcieLinkDegraded", Severity.P1, uuid, what))
    if seen.pcie_generation is not None:
        current, most = seen.pcie_generation
        # An idle GPU trains its link down to save power: only a busy one is judged.
        busy = seen.clock_reasons is not None and not seen.clock_reasons & GPU_IDLE
        held = past.held("pcieGeneration", busy and 0 < current < most, now)
        if held is not None and held >= lim.pcie_link_seconds:
            what = f"PCIe Gen{current} while busy, the card's maximum is Gen{most}"
            found.append(_finding("PcieGenerationLow", Severity.P2, uuid, what))
    return found


def _link_replay_limit(seen: Readings) -> float:
    """DCGM's limit for the link as trained now (0: the link is not read)."""
    if seen.pcie_generation is None or seen.pcie_width is None:
        return 0.0
    return float(dcgm_replay_limit(seen.pcie_generation[0], seen.pcie_width[0]))


def _clocks(past: Past, seen: Readings, now: float, lim: Limits, uuid: str) -> list[ProbeFinding]:
    reasons = seen.clock_reasons or 0
    found = []
    for bit, reason in HARDWARE_SLOWDOWNS.items():
        active = bool(reasons & bit)
        share = past.share(reason, active, now, lim.slowdown_window_seconds)
        # Held most of the window, the GPU runs at half its clocks or less and slows every
        # rank of a synchronous job; a moment of it (a power spike) is only a warning.
        if share is not None and share >= lim.slowdown_share:
            minutes = lim.slowdown_window_seconds / _MINUTE
            what = f"clocks held down by {reason} {share:.0%} of the last {minutes:g} minutes"
            found.append(_finding(reason, Severity.P1, uuid, what))
        elif active:
            found.append(_finding(reason, Severity.P2, uuid, f"clocks held down by {reason}"))
    if reasons & SW_THERMAL:
        found.append(_finding("SwThermalSlowdown", Severity.P2, uuid, "clocks lowered: too hot"))
    return found


def _power(past: Past, seen: Readings, now: float, lim: Limits, uuid: str) -> list[ProbeFinding]:
    if seen.power_mw is None or not seen.power_limit_mw:
        return []
    over = seen.power_mw > seen.power_limit_mw * lim.power_over_limit_ratio
    held = past.held("powerOverLimit", over, now)
    if held is None or held < _MINUTE:
        return []
    draw_w, limit_w = seen.power_mw / 1000, seen.power_limit_mw / 1000
    what = f"drawing {draw_w:.0f} W, enforced limit {limit_w:.0f} W"
    return [_finding("PowerOverLimit", Severity.P2, uuid, what)]


def _nvlink(past: Past, seen: Readings, now: float, lim: Limits, uuid: str) -> list[ProbeFinding]:
    """DCGM's NVLink health watch: replays and recoveries should be 0 (a failure
    each); CRC errors matter at 100 a second or more (a warning below)."""
    errors, found = seen.nvlink_errors, []
    if NVLINK_CRC_FLIT in errors or NVLINK_CRC_DATA in errors:
        crc = errors.get(NVLINK_CRC_FLIT, 0) + errors.get(NVLINK_CRC_DATA, 0)
        grew, span = past.increase("nvlinkCrc", crc, now, _MINUTE)
        per_second = grew / max(span, _MINUTE)
        if grew and per_second >= lim.nvlink_crc_per_second:
            what = (
                f"{per_second:.0f} NVLink CRC errors a second (limit {lim.nvlink_crc_per_second:g})"
            )
            found.append(_finding(NVLINK_CRC_REASON, Severity.P1, uuid, what))
        elif grew:
            what = f"{grew} NVLink CRC errors in the last minute"
            found.append(_finding(NVLINK_CRC_REASON, Severity.P2, uuid, what))
    for key, reason, limit in (
        (NVLINK_REPLAY, NVLINK_REPLAY_REASON, lim.nvlink_replay_errors),
        (NVLINK_RECOVERY, NVLINK_RECOVERY_REASON, lim.nvlink_recovery_errors),
    ):
        if key not in errors:
            continue
        window = lim.nvlink_window_seconds
        grew, _ = past.increase(key, errors[key], now, window)
        if limit and grew >= limit:
            what = f"{grew} NVLink {key} errors within {window:g}s (should be 0)"
            found.append(_finding(reason, Severity.P1, uuid, what))
    return found


def _fabric(past: Past, seen: Readings, now: float, lim: Limits, uuid: str) -> list[ProbeFinding]:
    fabric = seen.fabric
    if fabric is None or fabric.state == FABRIC_NOT_SUPPORTED:
        return []
    if fabric.state == FABRIC_COMPLETED:
        past.held("fabricPending", False, now)
        if fabric.status != 0:
            what = (
                f"NVSwitch fabric registration failed (NVML error {fabric.status}):"
                " no CUDA work can run"
            )
            return [_finding("FabricRegistrationFailed", Severity.P1, uuid, what)]
        degraded = (fabric.health_mask >> _DEGRADED_BW_SHIFT) & _DEGRADED_BW_WIDTH
        if degraded == _DEGRADED_BW_TRUE:
            what = "fabric bandwidth degraded"
            return [_finding("FabricDegradedBandwidth", Severity.P2, uuid, what)]
        return []
    # Not yet registered: normal for a while after boot, while Fabric Manager starts.
    held = past.held("fabricPending", True, now) or 0.0
    if held < lim.fabric_grace_seconds:
        return []
    state = "never started" if fabric.state == FABRIC_NOT_STARTED else "still in progress"
    what = (
        f"NVSwitch fabric registration {state} after {held:.0f}s: no CUDA work can run"
        " (is Fabric Manager running?)"
    )
    return [_finding("FabricNotReady", Severity.P1, uuid, what)]


def _persistence(
    past: Past, seen: Readings, now: float, lim: Limits, uuid: str
) -> list[ProbeFinding]:
    if seen.persistence is False and lim.expect_persistence_mode:
        return [_finding("PersistenceModeOff", Severity.P2, uuid, "persistence mode is off")]
    return []


def vbios_mismatch(seen: Mapping[str, Readings]) -> list[ProbeFinding]:
    """GPUs of one model on one node whose VBIOS differs from the others': a board
    flashed apart from its siblings (a warning: the pool's owner decides)."""
    found = []
    by_model: dict[str, dict[str, list[str]]] = {}
    for uuid, readings in seen.items():
        if readings.vbios and readings.name:
            by_model.setdefault(readings.name, {}).setdefault(readings.vbios, []).append(uuid)
    for model, versions in by_model.items():
        if len(versions) < 2:
            continue
        common = max(versions, key=lambda v: (len(versions[v]), v))
        for version, uuids in sorted(versions.items()):
            if version == common:
                continue
            for uuid in uuids:
                what = f"VBIOS {version}, other {model} GPUs here run {common}"
                found.append(_finding("VbiosMismatch", Severity.P2, uuid, what))
    return found
