"""A fake NVML library driven by a spec file, for the unit tests.

It offers the pynvml functions the probe calls and raises pynvml's own
NVMLError, so the probe code runs unchanged. The integration tests and the demo
run the real pynvml over the NVML stand-in in C instead (testenv/nvml, `make
nvml`), which reads the same spec; tests/unit/test_nvml_library.py compares the
two. The spec is read again whenever the file changes, so a test injects a fault
by rewriting it:

    driverVersion: "550.54.15"
    cudaDriverVersion: 12040   # nvmlSystemGetCudaDriverVersion ("12.4")
    visible: 7                 # optional: fewer devices than listed ("fell off")
    devices:
      - uuid: GPU-0a1b...
        pciBusId: "00000000:3B:00.0"
        name: NVIDIA H100 80GB HBM3  # nvmlDeviceGetName (a MIG device's adds " MIG <profile>")
        temperature: 45
        eccUncorrectedVolatile: 0
        remappedRows: {pending: false, failure: false}  # absent or null: not supported
        retiredPagesPending: false  # pre-Ampere page retirement (without remappedRows)
        nvlinks: 0             # number of NVLinks (all up), or a list of booleans
        recoveryAction: 0      # NVML_GPU_RECOVERY_ACTION_*
        lost: false            # every call: NVML_ERROR_GPU_IS_LOST
        hangSeconds: 0         # every call blocks this long (a hung driver)
        processes:             # compute processes (nvmlDeviceGetComputeRunningProcesses)
          - {pid: 4242, usedMemoryMiB: 1024}
        resetFailures: 0       # the first N resets of this GPU fail (reset_gpu)
        mig: [1g.10gb, 1g.10gb]  # MIG enabled, these MIG devices ([]: enabled, none);
                                 # absent: MIG disabled; `migSupported: false`: no MIG
        # The degradation readings (agent/degradation.py); absent: a healthy card's.
        pcie: {replays: 0, width: 16, maxWidth: 16, generation: 5, maxGeneration: 5}
        clocksEventReasons: 0  # nvmlClocksEventReason* bits (0x8 HwSlowdown, 0x1 GpuIdle)
        power: {drawW: 350, limitW: 700}  # usage and the enforced limit
        nvlinkErrors: {crcFlit: 0, crcData: 0, replay: 0, recovery: 0}  # totals, all
                               # links (NVML_FI_DEV_NVLINK_*_TOTAL); only with nvlinks
        fabric: {state: 3, status: 0, healthMask: 0}  # nvmlGpuFabricInfo_v2; absent:
                               # NOT_SUPPORTED (no NVSwitch fabric)
        persistenceMode: true
        vbios: "96.00.89.00.01"
        utilization: 0         # nvmlDeviceGetUtilizationRates' GPU percentage; memory
                               # used is the processes' usedMemoryMiB (of 80 GiB)
    xidEvents:                 # delivered once each through an event set registered
      - {id: 1, device: 0, xid: 79}  # for Xids on that device; `reset: true` (a reset of
                                     # the GPU since, nvidia-smi -r): to none
    initError: false           # nvmlInit fails (driver not loaded)
    errors:                    # the C stand-in only: a call's NVML error code, for every
      nvmlDeviceGetName: NOT_SUPPORTED  # device here or under a device (`errors:` there)

The C stand-in refuses unknown keys and values of the wrong type (testenv/nvml/spec.c);
this fake ignores them.

NVML has no reset call in pynvml (nvmlDeviceResetGpuLockedClocks only resets clock
limits); the agent resets through `nvidia-smi -r`, or here through `reset_gpu`,
which stands for it: refused while a process holds the GPU, failing on a lost GPU
and its first `resetFailures` times, and otherwise clearing what a reset clears (the volatile ECC
count, a pending row remap, the driver's recovery action) in the spec. Each reset is
a line of `<spec>.resets` (`<uuid> ok|failed|in-use`), across agent restarts.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import yaml


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class _Handle:
    index: int


@dataclass
class _MigHandle:
    index: int  # the GPU's
    slot: int


@dataclass
class _PciInfo:
    busId: str  # noqa: N815 -- pynvml's field name


@dataclass
class _ProcessInfo:
    pid: int
    usedGpuMemory: int  # noqa: N815 -- bytes, as pynvml's c_nvmlProcessInfo_t


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _EventData:
    device: Any
    eventType: int  # noqa: N815
    eventData: int  # noqa: N815


@dataclass
class _EventSet:
    masks: dict[int, int]  # GPU index -> the event types registered for it


class _FieldValue:
    def __init__(self, value: int | None) -> None:
        self.nvmlReturn = (
            pynvml.NVML_SUCCESS if value is not None else pynvml.NVML_ERROR_NOT_SUPPORTED
        )
        self.value = type("V", (), {"uiVal": value or 0, "ullVal": value or 0})()


# The NVLink error totals' field ids, by the spec's nvlinkErrors key.
_NVLINK_FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "crcFlit",
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "crcData",
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "replay",
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "recovery",
}
_SIZE = re.compile(r"(?:^|[ -])(\d+)GB")
_PCIE = {"replays": 0, "width": 16, "maxWidth": 16, "generation": 5, "maxGeneration": 5}


class FakeNvml:
    def __init__(self, spec_path: Path) -> None:
        self.spec_path = spec_path
        self._spec: dict[str, Any] = {}
        # (inode, size, mtime in ns), as the C stand-in: a rewrite within one clock
        # tick of the last read still moves the size or (by rename) the inode.
        self._stamp: tuple[int, int, int] | None = None
        self._delivered: set[Any] = set()
        self._lock = threading.Lock()

    def _load(self) -> dict[str, Any]:
        with self._lock:
            try:
                st = self.spec_path.stat()
            except OSError as err:
                raise _error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND) from err
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            if stamp != self._stamp:
                self._spec = yaml.safe_load(self.spec_path.read_text()) or {}
                self._stamp = stamp
            return self._spec

    def _device(self, handle: _Handle) -> dict[str, Any]:
        devices = self._load().get("devices") or []
        if handle.index >= len(devices):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        device: dict[str, Any] = devices[handle.index]
        hang = float(device.get("hangSeconds") or 0)
        if hang:
            time.sleep(hang)
        if device.get("lost"):
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return device

    # -- the pynvml surface the probe uses ------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 -- pynvml's names
        if self._load().get("initError"):
            raise _error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    def nvmlShutdown(self) -> None:  # noqa: N802
        return None

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return str(self._load().get("driverVersion", "550.54.15"))

    def nvmlSystemGetNVMLVersion(self) -> str:  # noqa: N802
        # NVML's version is the CUDA major and the driver's: "12.550.54.15".
        cuda = int(self._load().get("cudaDriverVersion", 12040)) // 1000
        return f"{cuda}.{self.nvmlSystemGetDriverVersion()}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        return int(self._load().get("cudaDriverVersion", 12040))

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        spec = self._load()
        listed = len(spec.get("devices") or [])
        return int(spec.get("visible", listed))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        handle = _Handle(index)
        self._device(handle)
        return handle

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:  # noqa: N802
        return str(self._device(handle)["uuid"])

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:  # noqa: N802
        devices = self._load().get("devices") or []
        for index, device in enumerate(devices):
            if device.get("uuid") == uuid:
                return self.nvmlDeviceGetHandleByIndex(index)
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _PciInfo:  # noqa: N802
        return _PciInfo(
            str(self._device(handle).get("pciBusId", f"00000000:{handle.index + 1:02X}:00.0"))
        )

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter: int) -> int:  # noqa: N802
        return int(self._device(handle).get("eccUncorrectedVolatile", 0))

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:  # noqa: N802
        rows = self._device(handle).get("remappedRows")
        if rows is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return (0, 0, int(bool(rows.get("pending"))), int(bool(rows.get("failure"))))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:  # noqa: N802
        return int(bool(self._device(handle).get("retiredPagesPending")))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[_ProcessInfo]:  # noqa: N802
        return [
            _ProcessInfo(int(p["pid"]), int(p.get("usedMemoryMiB", 0)) << 20)
            for p in self._device(handle).get("processes") or []
        ]

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:  # noqa: N802
        return int(self._device(handle).get("temperature", 40))

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:  # noqa: N802
        links = self._device(handle).get("nvlinks", 0)
        states = [True] * links if isinstance(links, int) else list(links)
        if link >= len(states):
            raise _error(
                pynvml.NVML_ERROR_NOT_SUPPORTED
                if not states
                else pynvml.NVML_ERROR_INVALID_ARGUMENT
            )
        return int(bool(states[link]))

    def nvmlDeviceGetFieldValues(self, handle: _Handle, fields: list[int]) -> list[_FieldValue]:  # noqa: N802
        device = self._device(handle)
        return [_FieldValue(self._field(device, field)) for field in fields]

    @staticmethod
    def _field(device: dict[str, Any], field: int) -> int | None:
        if field == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            return int(device.get("recoveryAction", 0))
        if field in _NVLINK_FIELDS and device.get("nvlinks"):
            return int((device.get("nvlinkErrors") or {}).get(_NVLINK_FIELDS[field], 0))
        return None  # a field this stand-in does not know: NOT_SUPPORTED

    def _pcie(self, handle: _Handle, key: str) -> int:
        return int({**_PCIE, **(self._device(handle).get("pcie") or {})}[key])

    def nvmlDeviceGetPcieReplayCounter(self, handle: _Handle) -> int:  # noqa: N802
        return self._pcie(handle, "replays")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:  # noqa: N802
        return self._pcie(handle, "width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:  # noqa: N802
        return self._pcie(handle, "maxWidth")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:  # noqa: N802
        return self._pcie(handle, "generation")

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: _Handle) -> int:  # noqa: N802
        return self._pcie(handle, "maxGeneration")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:  # noqa: N802
        return int(self._device(handle).get("clocksEventReasons", 0))

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:  # noqa: N802
        return int(float((self._device(handle).get("power") or {}).get("drawW", 350)) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:  # noqa: N802
        return int(float((self._device(handle).get("power") or {}).get("limitW", 700)) * 1000)

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:  # noqa: N802
        return int(bool(self._device(handle).get("persistenceMode", True)))

    def nvmlDeviceGetVbiosVersion(self, handle: _Handle) -> str:  # noqa: N802
        return str(self._device(handle).get("vbios", "96.00.89.00.01"))

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Utilization:  # noqa: N802
        return _Utilization(int(self._device(handle).get("utilization", 0)), 0)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> _Memory:  # noqa: N802
        # As the C stand-in: the size in the product name ("... 80GB HBM3"), else 80 GiB.
        device = self._device(handle)
        sized = _SIZE.search(str(device.get("name", "NVIDIA H100 80GB HBM3")))
        total = (int(sized.group(1)) if sized and 0 < int(sized.group(1)) <= 4096 else 80) << 30
        processes = device.get("processes") or []
        used = min(total, sum(int(p.get("usedMemoryMiB", 0)) << 20 for p in processes))
        return _Memory(total, total - used, used)

    def nvmlDeviceGetGpuFabricInfoV(self, handle: _Handle, ref: Any) -> int:  # noqa: N802
        fabric = self._device(handle).get("fabric")
        if fabric is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = ref._obj  # ctypes.byref(c_nvmlGpuFabricInfo_v2_t())
        info.state = int(fabric.get("state", 3))
        info.status = int(fabric.get("status", 0))
        info.healthMask = int(fabric.get("healthMask", 0))
        return 0  # NVML_SUCCESS

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:  # noqa: N802
        device = self._device(handle)
        if device.get("migSupported") is False:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        enabled = int("mig" in device)
        return [enabled, enabled]  # current, pending

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:  # noqa: N802
        self._device(handle)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, slot: int) -> _MigHandle:  # noqa: N802
        if slot >= len(self._device(handle).get("mig") or []):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return _MigHandle(handle.index, slot)

    def nvmlDeviceGetName(self, handle: _Handle | _MigHandle) -> str:  # noqa: N802
        device = self._device(_Handle(handle.index))
        name = str(device.get("name", "NVIDIA H100 80GB HBM3"))
        if isinstance(handle, _MigHandle):
            return f"{name} MIG {device['mig'][handle.slot]}"
        return name

    def nvmlEventSetCreate(self) -> _EventSet:  # noqa: N802
        return _EventSet({})

    def nvmlEventSetFree(self, events: _EventSet) -> None:  # noqa: N802
        return None

    def nvmlDeviceRegisterEvents(self, handle: _Handle, mask: int, events: _EventSet) -> None:  # noqa: N802
        self._device(handle)
        events.masks[handle.index] = events.masks.get(handle.index, 0) | mask

    def nvmlEventSetWait(self, events: _EventSet, timeout_ms: int) -> _EventData:  # noqa: N802
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            for event in self._load().get("xidEvents") or []:
                key = event.get("id", (event.get("device"), event.get("xid")))
                registered = events.masks.get(int(event.get("device", 0)), 0)
                # As NVML: only to a set registered for Xids on the event's GPU.
                fresh = key not in self._delivered and not event.get("reset")
                if registered & pynvml.nvmlEventTypeXidCriticalError and fresh:
                    self._delivered.add(key)
                    return _EventData(
                        device=_Handle(int(event.get("device", 0))),
                        eventType=pynvml.nvmlEventTypeXidCriticalError,
                        eventData=int(event["xid"]),
                    )
            if time.monotonic() >= deadline:
                raise _error(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(0.05)

    # -- the reset nvidia-smi -r does on a real node (agent/repair.py) -----------

    @property
    def resets_path(self) -> Path:
        return self.spec_path.with_name(self.spec_path.name + ".resets")

    def resets(self) -> list[tuple[str, str]]:
        """Every reset asked for so far: (uuid, ok | failed | in-use)."""
        try:
            lines = self.resets_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [(u, r) for u, _, r in (line.partition(" ") for line in lines) if u]

    def reset_gpu(self, uuid: str) -> None:
        """Reset one GPU; raises NVMLError as a refused or failed reset would."""
        spec = self._load()
        devices = spec.get("devices") or []
        index = next((i for i, d in enumerate(devices) if d.get("uuid") == uuid), None)
        if index is None:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        device = devices[index]
        failed = sum(1 for u, r in self.resets() if u == uuid and r == "failed")
        if device.get("lost"):  # off the bus: nothing answers a reset
            outcome, code = "failed", pynvml.NVML_ERROR_GPU_IS_LOST
        elif device.get("processes"):
            outcome, code = "in-use", pynvml.NVML_ERROR_IN_USE
        elif failed < int(device.get("resetFailures") or 0):
            outcome, code = "failed", pynvml.NVML_ERROR_RESET_REQUIRED
        else:
            outcome, code = "ok", 0
        with self.resets_path.open("a") as log:
            log.write(f"{uuid} {outcome}\n")
        if code:
            raise _error(code)
        device["eccUncorrectedVolatile"] = 0
        device["recoveryAction"] = 0
        if device.get("remappedRows"):
            device["remappedRows"] = {**device["remappedRows"], "pending": False}
        # A session opened after the reset is not told of the GPU's past Xids.
        for event in spec.get("xidEvents") or []:
            if int(event.get("device", 0)) == index:
                event["reset"] = True
        tmp = self.spec_path.with_suffix(".reset-tmp")
        tmp.write_text(yaml.safe_dump(spec))
        tmp.replace(self.spec_path)
