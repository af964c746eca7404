"""NVIDIA's thresholds for the counter signals, and their reasons: one classification
for every source that reads the counter (the agent over NVML, the controller's DCGM
source over dcgm-exporter's series). The agent's judge (agent/degradation.py) and the
DCGM source's queries (sources/dcgm.py) both read them from here.

DCGM's NVLink health watch (modules/health/DcgmHealthWatch.cpp,
common/DcgmGPUHardwareLimits.h): "Replay and recovery errors are failures, not
warnings" (DCGM_LIMIT_MAX_NVLINK_ERROR, 1); CRC errors "only matter at rates of 100+
per second" (DCGM_LIMIT_MAX_NVLINK_CRC_ERROR).
"""

from __future__ import annotations

NVLINK_REPLAY_REASON = "NvlinkReplayErrors"
NVLINK_RECOVERY_REASON = "NvlinkRecoveryErrors"
NVLINK_CRC_REASON = "NvlinkCrcErrors"

NVLINK_ERRORS = 1  # replays or recoveries within the window that are a fault
NVLINK_CRC_PER_SECOND = 100.0
# How long replays and recoveries are counted (and a finding held): DCGM compares a
# minute's growth; gpuheal holds it for ten, so a burst outlives the debounce.
NVLINK_WINDOW_SECONDS = 600.0

# nvmlClocksEventReason* bits (nvml.h), as NVML returns them and dcgm-exporter exports
# them (DCGM_FI_DEV_CLOCKS_EVENT_REASONS). The hardware ones mean the board itself
# pulls the clocks down by half or more: HwSlowdown (temperature, an external power
# brake, or power draw too high for the supply), HwThermalSlowdown,
# HwPowerBrakeSlowdown (the system's power supply asserted the brake).
HW_SLOWDOWN = 0x8
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
HARDWARE_SLOWDOWNS = {
    HW_SLOWDOWN: "HwSlowdown",
    HW_THERMAL: "HwThermalSlowdown",
    HW_POWER_BRAKE: "HwPowerBrakeSlowdown",
}
# GPUd's rule: a hardware slowdown held this share of this window is a fault (one
# slow rank slows a whole synchronous job); a moment of it is not.
SLOWDOWN_WINDOW_SECONDS = 600.0
SLOWDOWN_SHARE = 0.6
