"""What the agent's NVML code reports over one NVML library, as plain data: run in-process
over FakeNvml and, as `python -m tests.unit.nvml_report`, over the real pynvml loading the
NVML stand-in (testenv/nvml) through LD_LIBRARY_PATH, so tests/unit/test_nvml_library.py
can compare the two on one spec."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import pynvml

from gpuheal.agent.degradation import Readings
from gpuheal.agent.nvml import NvmlProbe, Thresholds, loaded_library
from gpuheal.agent.repair import holders


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _events(lib: Any) -> list[list[Any]]:
    """Every Xid event the library hands an event set registered on all GPUs, in order."""
    try:
        lib.nvmlInit()
        events = lib.nvmlEventSetCreate()
        mask = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeGpuUnavailableError
        for index in range(int(lib.nvmlDeviceGetCount())):
            try:
                lib.nvmlDeviceRegisterEvents(lib.nvmlDeviceGetHandleByIndex(index), mask, events)
            except pynvml.NVMLError:
                continue  # a lost GPU: no events from it
        seen = []
        while True:
            try:
                data = lib.nvmlEventSetWait(events, 100)
            except pynvml.NVMLError as err:
                if int(err.value) != pynvml.NVML_ERROR_TIMEOUT:
                    seen.append(["error", int(err.value)])
                return seen
            seen.append(
                [
                    _text(lib.nvmlDeviceGetUUID(data.device)),
                    int(data.eventType),
                    int(data.eventData),
                ]
            )
    except pynvml.NVMLError as err:
        return [["error", int(err.value)]]


def report(lib: Any, expected: int | None = 8) -> dict[str, Any]:
    probe = NvmlProbe(
        lib,
        expected_gpus=lambda: expected,
        thresholds=Thresholds(85, 95),
        processes_due=lambda: True,
    )
    result = probe.run()
    uuids = []
    if result.ran:
        uuids = sorted(probe.devices.by_pci.values())
    return {
        "ran": result.ran,
        "error": result.error,
        "findings": [
            [f.reason, f.severity.value, f.message, list(f.devices)] for f in result.findings
        ],
        "warnings": list(result.warnings),
        "state": probe.state,
        "nvml_error": probe.error,
        "by_pci": probe.devices.by_pci,
        "count": probe.devices.count,
        "ecc": probe.ecc_uncorrected,
        "pids": list(probe.pids) if probe.pids is not None else None,
        "mig": probe.mig,
        "versions": [probe.versions.driver, probe.versions.cuda, probe.versions.nvml],
        "holders": {u: list(p) for u, p in holders(lib, uuids).items()} if result.ran else {},
        "events": _events(lib) if result.ran else [],
        "readings": {u: _plain(r) for u, r in sorted(probe.last_readings.items())},
    }


def _plain(readings: Readings) -> dict[str, Any]:
    """The readings as JSON would carry them (tuples as lists)."""
    plain: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(readings)))
    return plain


if __name__ == "__main__":
    out = report(pynvml)
    out["library"] = loaded_library()  # which libnvidia-ml the dynamic loader mapped
    json.dump(out, sys.stdout)
