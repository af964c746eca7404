"""The NVML probe: device count, per-device health, Xid events.

`lib` is the `pynvml` module (nvidia-ml-py): over the driver's libnvidia-ml on a GPU
node, over the NVML stand-in (testenv/nvml) in the integration tests and the demo;
the unit tests may pass a FakeNvml (fakenvml.py) with the same functions and the same
NVMLError. The probe code below is the one that runs in production either way.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from gpuheal.agent import readings
from gpuheal.agent.degradation import DegradationJudge, Limits, Readings, vbios_mismatch
from gpuheal.agent.facts import cuda_text
from gpuheal.agent.findings import ProbeFinding, ProbeResult
from gpuheal.agent.kmsg import normalize_pci
from gpuheal.agent.readings import SKIP, code, supported, text
from gpuheal.model import Severity
from gpuheal.policy.access import NVML_OK, NVML_PENDING, nvml_state
from gpuheal.supervisor import Supervisor
from gpuheal.xid import RECOVERY_ACTIONS, XidRow

log = logging.getLogger(__name__)

PROBE = "nvml"


@dataclass(frozen=True)
class Thresholds:
    temperature_warning_c: int = 85
    temperature_critical_c: int = 95


@dataclass
class Devices:
    """What the last probe learned about the devices: PCI address -> UUID."""

    by_pci: dict[str, str]
    count: int = 0


@dataclass(frozen=True)
class Versions:
    """The driver's versions, read once per NVML initialisation (an upgrade reloads it)."""

    driver: str = ""
    cuda: str = ""  # "12.4"
    nvml: str = ""  # NVML's own version, "12.550.54.15"
    library: str = ""  # the libnvidia-ml file the process loaded


# The dynamic loader's view of this process: which libnvidia-ml it mapped.
MAPS = Path("/proc/self/maps")


def loaded_library(maps: Path = MAPS) -> str:
    """The path of the libnvidia-ml the process has loaded ("" when none is mapped,
    as with a stand-in that is not a shared library)."""
    try:
        text = maps.read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if "/libnvidia-ml.so" in path:
            return path.strip()
    return ""


class NvmlProbe:
    def __init__(
        self,
        lib: Any,
        *,
        expected_gpus: Callable[[], int | None],
        thresholds: Thresholds,
        processes_due: Callable[[], bool] = lambda: False,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lib = lib
        self.expected_gpus = expected_gpus
        self.thresholds = thresholds
        # The degradation signals (degradation.py), judged against each GPU's past.
        self.judge = DegradationJudge(limits or Limits())
        self.clock = clock
        self.last_readings: dict[str, Readings] = {}
        # Asked once per round: list the GPUs' compute processes this round?
        self.processes_due = processes_due
        self.devices = Devices(by_pci={})
        self.versions = Versions()
        # Facts of the last completed round, read by the agent after the probe returns.
        self.ecc_uncorrected: int | None = None  # summed over the devices read
        self.pids: tuple[int, ...] | None = None  # None: not listed (yet)
        # Compute processes per GPU UUID at the last listing ({}: not listed yet), and
        # the listing under way in a round.
        self.processes_by_gpu: dict[str, int] = {}
        self._listed: dict[str, int] = {}
        # MIG devices per profile over the GPUs ({} with MIG disabled everywhere); None
        # when no GPU supports MIG (the fact is then not written).
        self.mig: dict[str, int] | None = None
        # NVML's state for agent-access (policy/access.py) and the NVMLError of the
        # last failed initialisation.
        self.state = NVML_PENDING
        self.error = ""
        self._initialized = False
        # The UUID each index answered since NVML was initialised: a GPU lost mid-run
        # answers nothing (its handle included) and is still named by it, so the fault
        # carries the GPU a reset or a replacement is for.
        self._uuids: dict[int, str] = {}

    def driver_version(self) -> str:
        version = self.lib.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)

    def shutdown(self) -> None:
        """Close this probe's NVML session (a GPU reset needs every one closed); the
        next run opens it again."""
        if self._initialized:
            self._initialized = False
            with contextlib.suppress(pynvml.NVMLError):
                self.lib.nvmlShutdown()

    def init(self) -> None:
        if not self._initialized:
            self.lib.nvmlInit()
            self._initialized = True
            self._uuids = {}  # a (re)loaded driver may number the GPUs anew
            self.versions = self._read_versions()

    def _read_versions(self) -> Versions:
        driver = supported(self.lib.nvmlSystemGetDriverVersion)
        cuda = supported(self.lib.nvmlSystemGetCudaDriverVersion)
        nvml = supported(self.lib.nvmlSystemGetNVMLVersion)
        return Versions(
            driver=text(driver) if driver is not None else "",
            cuda=cuda_text(int(cuda)) if cuda else "",
            nvml=text(nvml) if nvml is not None else "",
            library=loaded_library(),
        )

    def run(self) -> ProbeResult:
        try:
            self.init()
            count = int(self.lib.nvmlDeviceGetCount())
        except pynvml.NVMLError as err:
            self._initialized = False
            # The code says why (policy/access.py): no library, no driver, no permission.
            self.state, self.error = nvml_state(code(err)), str(err)
            return ProbeResult(PROBE, level=True, ran=False, error=f"NVML unavailable: {err}")
        self.state, self.error = NVML_OK, ""
        findings: list[ProbeFinding] = []
        warnings: list[str] = []
        expected = self.expected_gpus()
        # None at all is not a fault of the GPUs but the container's sight of them
        # (agent-access NoGpusVisible): a driver that lost every GPU fails nvmlInit,
        # and GPUs that fall off the bus say so in the kernel log.
        if expected is not None and 0 < count < expected:
            findings.append(
                ProbeFinding(
                    "GpuMissing", Severity.P0, f"{expected} GPUs expected, {count} visible"
                )
            )
        by_pci: dict[str, str] = {}
        ecc: list[int] = []
        pids: list[int] | None = [] if self.processes_due() else None
        mig: dict[str, int] | None = None
        self.last_readings = {}
        self._listed = {}
        for index in range(count):
            findings += self._device(index, by_pci, warnings, ecc, pids)
            mig = _merge(mig, self._mig(index))
        findings += vbios_mismatch(self.last_readings)
        self.judge.forget_except(set(self.last_readings))
        self.devices = Devices(by_pci=by_pci, count=count)
        self.mig = mig
        self.ecc_uncorrected = sum(ecc)
        if pids is not None:
            self.pids = tuple(pids)
            self.processes_by_gpu = self._listed
        return ProbeResult(
            PROBE, level=True, ran=True, findings=tuple(findings), warnings=tuple(warnings)
        )

    def _device(
        self,
        index: int,
        by_pci: dict[str, str],
        warnings: list[str],
        ecc: list[int],
        pids: list[int] | None,
    ) -> list[ProbeFinding]:
        lib, found = self.lib, []
        uuid = self._uuids.get(index, f"index-{index}")
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            uuid = self._uuids[index] = text(lib.nvmlDeviceGetUUID(handle))
            by_pci[normalize_pci(text(lib.nvmlDeviceGetPciInfo(handle).busId))] = uuid
            if pids is not None:
                running = supported(lib.nvmlDeviceGetComputeRunningProcesses, handle) or ()
                pids.extend(int(p.pid) for p in running)
                self._listed[uuid] = len(running)
            found += self._ecc(handle, uuid, ecc)
            found += self._temperature(handle, uuid, warnings)
            found += self._nvlink(handle, uuid)
            found += self._recovery_action(handle, uuid)
            seen = readings.read(lib, handle, text(lib.nvmlDeviceGetName(handle)))
            self.last_readings[uuid] = seen
            found += self.judge.judge(uuid, seen, self.clock())
        except pynvml.NVMLError as err:
            if code(err) == pynvml.NVML_ERROR_GPU_IS_LOST:
                found.append(ProbeFinding("GpuLost", Severity.P0, f"GPU {uuid} is lost", (uuid,)))
            else:
                found.append(
                    ProbeFinding(
                        "NvmlError", Severity.P1, f"GPU {uuid}: NVML error: {err}", (uuid,)
                    )
                )
        return found

    def _mig(self, index: int) -> dict[str, int] | None:
        """This GPU's MIG devices per profile, as the device plugin names them from
        NVML's device name ("NVIDIA A100-SXM4-40GB MIG 1g.5gb" -> 1g.5gb); {} with MIG
        disabled; None when the GPU has no MIG (or cannot be read: its findings say why)."""
        lib = self.lib
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            mode = supported(lib.nvmlDeviceGetMigMode, handle)
            if mode is None:
                return None
            if int(mode[0]) != pynvml.NVML_DEVICE_MIG_ENABLE:
                return {}
            counts: dict[str, int] = {}
            for slot in range(int(lib.nvmlDeviceGetMaxMigDeviceCount(handle))):
                try:
                    device = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except pynvml.NVMLError as err:
                    if code(err) == pynvml.NVML_ERROR_NOT_FOUND:
                        continue  # an empty slot
                    raise
                profile = text(lib.nvmlDeviceGetName(device)).rsplit(" ", 1)[-1]
                counts[profile] = counts.get(profile, 0) + 1
            return counts
        except pynvml.NVMLError:
            return None

    def _ecc(self, handle: Any, uuid: str, totals: list[int]) -> list[ProbeFinding]:
        lib, found = self.lib, []

        def fault(reason: str, severity: Severity, what: str) -> None:
            found.append(ProbeFinding(reason, severity, f"GPU {uuid}: {what}", (uuid,)))

        uncorrected = supported(
            lib.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        if uncorrected is not None:
            totals.append(int(uncorrected))
        if uncorrected:
            fault(
                "EccUncorrectable", Severity.P0, f"{uncorrected} uncorrectable volatile ECC errors"
            )
        rows = supported(lib.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            _corr, _unc, pending, failure = rows
            if failure:
                fault("RowRemapFailure", Severity.P0, "row remapping failed")
            elif pending:
                fault("RowRemapPending", Severity.P1, "row remapping pending a reset")
        elif supported(lib.nvmlDeviceGetRetiredPagesPendingStatus, handle):
            # Pre-Ampere: page retirement instead of row remapping.
            fault("RetiredPagesPending", Severity.P1, "retired pages pending a reset")
        return found

    def _temperature(self, handle: Any, uuid: str, warnings: list[str]) -> list[ProbeFinding]:
        reading = supported(self.lib.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
        if reading is None:
            return []
        celsius = int(reading)
        if celsius >= self.thresholds.temperature_critical_c:
            return [
                ProbeFinding("Thermal", Severity.P1, f"GPU {uuid}: {celsius} C (critical)", (uuid,))
            ]
        if celsius >= self.thresholds.temperature_warning_c:
            warnings.append(f"GPU {uuid}: {celsius} C (warning)")
        return []

    def _nvlink(self, handle: Any, uuid: str) -> list[ProbeFinding]:
        down = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = self.lib.nvmlDeviceGetNvLinkState(handle, link)
            except pynvml.NVMLError as err:
                if code(err) in SKIP:
                    break  # no (more) NVLinks on this GPU
                raise
            if not active:
                down.append(link)
        if down:
            links = ",".join(map(str, down))
            return [
                ProbeFinding("NvlinkDown", Severity.P0, f"GPU {uuid}: NVLink {links} down", (uuid,))
            ]
        return []

    def _recovery_action(self, handle: Any, uuid: str) -> list[ProbeFinding]:
        values = supported(
            self.lib.nvmlDeviceGetFieldValues, handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        )
        if values is None:
            return []
        (value,) = values
        if getattr(value, "nvmlReturn", 0) != pynvml.NVML_SUCCESS:
            return []  # the driver does not have the field
        row = RECOVERY_ACTIONS.get(int(value.value.uiVal))
        if row is None or row.severity is Severity.P2:
            return []
        return [
            ProbeFinding(
                row.reason, row.severity, f"GPU {uuid}: driver says {row.description}", (uuid,)
            )
        ]


def _merge(total: dict[str, int] | None, one: dict[str, int] | None) -> dict[str, int] | None:
    if one is None:
        return total
    merged = dict(total or {})
    for profile, n in one.items():
        merged[profile] = merged.get(profile, 0) + n
    return merged


class XidWatcher:
    """Xid events through an NVML event set, in a dedicated thread."""

    def __init__(self, lib: Any, on_xid: Callable[[int, str], None]) -> None:
        self.lib = lib
        self.on_xid = on_xid
        self._stop = threading.Event()
        # A GPU reset needs every NVML session closed: pause() closes this one.
        self._pause = threading.Event()
        self._released = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, supervisor: Supervisor | None = None) -> None:
        """Watch in a thread of `supervisor`'s: a crash is said, counted and
        restarted after a backoff (NVML is opened afresh)."""
        supervisor = supervisor or Supervisor("agent")
        self._thread = supervisor.thread("nvml-events", self._run, self._stop)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def pause(self, timeout_s: float = 5.0) -> bool:
        """Close the event set and NVML; True once closed (within one wait, 1 s)."""
        self._released.clear()
        self._pause.set()
        if self._thread is None or not self._thread.is_alive():
            return True
        return self._released.wait(timeout_s)

    def resume(self) -> None:
        self._pause.clear()

    def _register(self) -> Any:
        lib = self.lib
        events = lib.nvmlEventSetCreate()
        mask = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeGpuUnavailableError
        for index in range(int(lib.nvmlDeviceGetCount())):
            try:
                lib.nvmlDeviceRegisterEvents(lib.nvmlDeviceGetHandleByIndex(index), mask, events)
            except pynvml.NVMLError as err:
                log.warning("cannot watch Xid events", extra={"gpu": index, "error": str(err)})
        return events

    def _close(self, events: Any) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            if events is not None:
                self.lib.nvmlEventSetFree(events)
        with contextlib.suppress(pynvml.NVMLError):
            self.lib.nvmlShutdown()

    def _run(self) -> None:
        events, opened = None, False
        while not self._stop.is_set():
            if self._pause.is_set():
                if opened:
                    self._close(events)
                    events, opened = None, False
                self._released.set()
                self._stop.wait(0.2)
                continue
            try:
                if not opened:
                    self.lib.nvmlInit()
                    opened = True
                if events is None:
                    events = self._register()
                data = self.lib.nvmlEventSetWait(events, 1000)
            except pynvml.NVMLError as err:
                if code(err) == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                log.warning("NVML event wait failed", extra={"error": str(err)})
                self._close(events)
                events, opened = None, False
                self._stop.wait(5.0)
                continue
            uuid = self._uuid(data.device)
            xid = (
                79
                if data.eventType == pynvml.nvmlEventTypeGpuUnavailableError
                else int(data.eventData)
            )
            self.on_xid(xid, uuid)

    def _uuid(self, device: Any) -> str:
        """The event's GPU; "" when NVML names none or cannot say which (a GPU that fell
        off the bus, Xid 79, answers GPU_IS_LOST): the Xid is reported all the same."""
        if not device:
            return ""
        try:
            return text(self.lib.nvmlDeviceGetUUID(device))
        except pynvml.NVMLError as err:
            log.warning("cannot name the GPU of an NVML event", extra={"error": str(err)})
            return ""


def xid_finding(xid: int, device: str, row: XidRow) -> ProbeFinding:
    """The finding of a node-fault Xid, as the catalogue (or config) classified it."""
    return ProbeFinding(
        row.reason,
        row.severity,
        f"Xid {xid} on {device or 'unknown GPU'}: {row.description} (action: {row.action})",
        (device,) if device else (),
        immediate=row.severity is Severity.P0,
    )
