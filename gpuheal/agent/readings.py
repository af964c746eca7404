"""The NVML reads behind degradation.py's Readings, one GPU at a time.

Every read is optional: a query the GPU or driver does not support (an A10 has no
NVLink, a PCIe card no fabric) reads None and is not judged. Any other NVML error
propagates, as the probe's other reads do: a lost GPU is the probe's finding.
"""

from __future__ import annotations

from collections.abc import Callable
from ctypes import byref
from typing import Any

import pynvml

from gpuheal.agent.degradation import (
    NVLINK_CRC_DATA,
    NVLINK_CRC_FLIT,
    NVLINK_RECOVERY,
    NVLINK_REPLAY,
    Fabric,
    Readings,
)

# Not supported by this GPU or driver; an older driver lacks a newer call (pynvml:
# FUNCTION_NOT_FOUND) or struct version.
SKIP = (
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
)

NVLINK_FIELDS = {
    NVLINK_CRC_FLIT: pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    NVLINK_CRC_DATA: pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    NVLINK_REPLAY: pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    NVLINK_RECOVERY: pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
}


def code(err: pynvml.NVMLError) -> int:
    return int(getattr(err, "value", -1))


def supported(call: Callable[..., Any], *args: Any) -> Any:
    """call(*args), or None when the GPU or driver does not support the query."""
    try:
        return call(*args)
    except pynvml.NVMLError as err:
        if code(err) not in SKIP:
            raise
        return None


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read(lib: Any, handle: Any, name: str) -> Readings:
    width = _pair(lib.nvmlDeviceGetCurrPcieLinkWidth, lib.nvmlDeviceGetMaxPcieLinkWidth, handle)
    generation = _pair(
        lib.nvmlDeviceGetCurrPcieLinkGeneration, lib.nvmlDeviceGetGpuMaxPcieLinkGeneration, handle
    )
    persistence = supported(lib.nvmlDeviceGetPersistenceMode, handle)
    vbios = supported(lib.nvmlDeviceGetVbiosVersion, handle)
    use = supported(lib.nvmlDeviceGetUtilizationRates, handle)
    memory = supported(lib.nvmlDeviceGetMemoryInfo, handle)
    return Readings(
        name=name,
        pcie_replays=_int(supported(lib.nvmlDeviceGetPcieReplayCounter, handle)),
        pcie_width=width,
        pcie_generation=generation,
        clock_reasons=_int(supported(lib.nvmlDeviceGetCurrentClocksEventReasons, handle)),
        power_mw=_int(supported(lib.nvmlDeviceGetPowerUsage, handle)),
        power_limit_mw=_int(supported(lib.nvmlDeviceGetEnforcedPowerLimit, handle)),
        nvlink_errors=nvlink_errors(lib, handle),
        fabric=fabric(lib, handle),
        persistence=None if persistence is None else persistence == pynvml.NVML_FEATURE_ENABLED,
        vbios=text(vbios) if vbios is not None else "",
        utilization_percent=None if use is None else int(use.gpu),
        memory_used_bytes=None if memory is None else int(memory.used),
        memory_total_bytes=None if memory is None else int(memory.total),
    )


def nvlink_errors(lib: Any, handle: Any) -> dict[str, int]:
    """The NVLink error totals (all links) the GPU supports; {} without NVLink."""
    values = supported(lib.nvmlDeviceGetFieldValues, handle, list(NVLINK_FIELDS.values()))
    if values is None:
        return {}
    return {
        name: int(value.value.ullVal)
        for name, value in zip(NVLINK_FIELDS, values, strict=True)
        if getattr(value, "nvmlReturn", -1) == pynvml.NVML_SUCCESS
    }


def fabric(lib: Any, handle: Any) -> Fabric | None:
    """The GPU's fabric registration; None on a GPU that joins no NVSwitch fabric."""
    info = pynvml.c_nvmlGpuFabricInfo_v2_t()
    if supported(lib.nvmlDeviceGetGpuFabricInfoV, handle, byref(info)) is None:
        return None
    return Fabric(state=int(info.state), status=int(info.status), health_mask=int(info.healthMask))


def _pair(
    current: Callable[..., Any], most: Callable[..., Any], handle: Any
) -> tuple[int, int] | None:
    now, top = supported(current, handle), supported(most, handle)
    return None if now is None or top is None else (int(now), int(top))


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
