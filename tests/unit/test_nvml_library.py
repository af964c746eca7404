"""The NVML stand-in (testenv/nvml, `make nvml`): libnvidia-ml.so.1 loaded by the real
pynvml through its ordinary library search, and the stand-in nvidia-smi.

The agent's probe runs over it in every agent integration test, and over the Python
FakeNvml in the unit tests: the same specs run through both here, so the two cannot
drift. A missing build fails these tests (with what to run), never skips them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from gpuheal.agent.fakenvml import FakeNvml
from gpuheal.sim.agent import gpu_spec
from gpuheal.sim.binaries import NvmlStandIn, default_nvml
from tests.unit.nvml_report import report

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def nvml() -> NvmlStandIn:
    return default_nvml().require()


def write(tmp_path: Path, document: dict[str, Any], name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document))
    return path


def run_python(nvml: NvmlStandIn, spec: Path, code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter that finds the stand-in as a node finds NVML."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, **nvml.environment(spec)},
    )


def c_report(nvml: NvmlStandIn, spec: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.nvml_report"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, **nvml.environment(spec)},
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def smi(nvml: NvmlStandIn, spec: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(nvml.smi), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, **nvml.environment(spec)},
    )


def node(**changes: Any) -> dict[str, Any]:
    """The integration tests' healthy 8-GPU node (gpuheal/sim/agent.py), changed."""
    document = gpu_spec("node-a")
    document.update(changes)
    return document


def faulty() -> dict[str, Any]:
    document = node(cudaDriverVersion=12020, driverVersion="535.161.08")
    devices = document["devices"]
    devices[0].update(eccUncorrectedVolatile=3, processes=[{"pid": 4242, "usedMemoryMiB": 2048}])
    devices[1].update(remappedRows={"pending": True, "failure": False})
    devices[2].update(remappedRows={"pending": False, "failure": True})
    devices[3].update(temperature=96, lost=True)
    devices[4].update(temperature=87)
    devices[5].update(nvlinks=[True, False, True, False])
    devices[6].update(recoveryAction=2, processes=[{"pid": 7}, {"pid": 8, "usedMemoryMiB": 1}])
    devices[7].update(recoveryAction=1)
    return document


def pre_ampere() -> dict[str, Any]:
    document = node()
    for device in document["devices"]:
        del device["remappedRows"]
        device.update(nvlinks=0, migSupported=False, name="Tesla V100-SXM2-32GB")
    document["devices"][2]["retiredPagesPending"] = True
    return document


def mig() -> dict[str, Any]:
    document = node()
    document["devices"][0]["mig"] = ["1g.10gb", "1g.10gb", "3g.40gb"]
    document["devices"][1]["mig"] = []
    document["devices"][2]["mig"] = ["7g.80gb"]
    return document


def xids() -> dict[str, Any]:
    return node(
        xidEvents=[
            {"id": 1, "device": 3, "xid": 79},
            {"device": 0, "xid": 48},
            {"id": 2, "device": 3, "xid": 79},
            {"device": 0, "xid": 48},  # the same device and Xid without an id: one event
        ]
    )


def degraded() -> dict[str, Any]:
    """Every degradation reading away from a healthy card's (agent/degradation.py)."""
    document = node()
    devices = document["devices"]
    devices[0].update(pcie={"replays": 1234, "width": 8, "maxWidth": 16, "generation": 4})
    devices[1].update(clocksEventReasons=0x8 | 0x40 | 0x80 | 0x20)
    devices[2].update(power={"drawW": 812.5, "limitW": 500})
    devices[3].update(nvlinkErrors={"crcFlit": 10**12, "crcData": 7, "replay": 3, "recovery": 1})
    devices[4].update(fabric={"state": 3, "status": 999, "healthMask": 1})
    devices[5].update(fabric={"state": 1}, persistenceMode=False)
    devices[6].update(vbios="96.00.61.00.01", nvlinks=0, nvlinkErrors={"replay": 5})
    devices[7].update(fabric={"state": 3, "healthMask": 2 << 14})
    return document


SPECS = {
    "healthy": node,
    "degraded": degraded,
    "faulty": faulty,
    "pre-ampere": pre_ampere,
    "mig": mig,
    "fell-off": lambda: node(visible=6),
    "no-driver": lambda: node(initError=True),
    "xid-events": xids,
    "empty": dict,
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_probe_reports_the_same_over_the_c_library_and_fakenvml(
    nvml: NvmlStandIn, tmp_path: Path, name: str
) -> None:
    spec = write(tmp_path, SPECS[name]())
    over_c = c_report(nvml, spec)
    # The stand-in is what the dynamic loader mapped (agent-access reports this path).
    assert over_c.pop("library") == str(nvml.library)
    assert over_c == report(FakeNvml(spec))


def test_a_faulty_node_reads_as_nvml_would_say_it(nvml: NvmlStandIn, tmp_path: Path) -> None:
    over_c = c_report(nvml, write(tmp_path, faulty()))
    lost = faulty()["devices"][3]["uuid"]
    reasons = {(r, tuple(d)) for r, _, _, d in over_c["findings"]}
    assert ("GpuLost", ("index-3",)) in reasons  # lost before its UUID was read
    assert {r for r, _ in reasons} >= {
        "EccUncorrectable", "RowRemapPending", "RowRemapFailure", "NvlinkDown",
    }  # fmt: skip
    assert over_c["warnings"] == [f"GPU {faulty()['devices'][4]['uuid']}: 87 C (warning)"]
    assert over_c["versions"] == ["535.161.08", "12.2", "12.535.161.08"]
    assert over_c["pids"] == [4242, 7, 8] and over_c["ecc"] == 3
    assert lost not in over_c["by_pci"].values()


def test_degradation_readings_read_as_nvml_gives_them(nvml: NvmlStandIn, tmp_path: Path) -> None:
    over_c = c_report(nvml, write(tmp_path, degraded()))
    uuids = [d["uuid"] for d in degraded()["devices"]]
    seen = over_c["readings"]
    assert seen[uuids[0]]["pcie_replays"] == 1234
    assert seen[uuids[0]]["pcie_width"] == [8, 16] and seen[uuids[0]]["pcie_generation"] == [4, 5]
    assert seen[uuids[1]]["clock_reasons"] == 0xE8
    assert (seen[uuids[2]]["power_mw"], seen[uuids[2]]["power_limit_mw"]) == (812500, 500000)
    assert seen[uuids[3]]["nvlink_errors"] == {
        "crcFlit": 10**12, "crcData": 7, "replay": 3, "recovery": 1,
    }  # fmt: skip
    assert seen[uuids[4]]["fabric"] == {"state": 3, "status": 999, "health_mask": 1}
    assert seen[uuids[5]]["fabric"] == {"state": 1, "status": 0, "health_mask": 0}
    assert seen[uuids[5]]["persistence"] is False and seen[uuids[0]]["persistence"] is True
    # Without NVLink there are no NVLink counters; without a fabric, no fabric.
    assert seen[uuids[6]]["nvlink_errors"] == {} and seen[uuids[0]]["fabric"] is None
    reasons = {(r, s) for r, s, _, _ in over_c["findings"]}
    assert {
        ("FabricRegistrationFailed", "P1"), ("VbiosMismatch", "P2"), ("PersistenceModeOff", "P2"),
        ("HwSlowdown", "P2"), ("HwThermalSlowdown", "P2"), ("HwPowerBrakeSlowdown", "P2"),
        ("SwThermalSlowdown", "P2"),
    } <= reasons  # fmt: skip
    # Held or counted over time, none of the rest is judged from one round.
    assert not {r for r, _ in reasons} & {
        "PcieLinkDegraded", "PcieReplayRate", "PowerOverLimit", "FabricNotReady",
        "NvlinkRecoveryErrors",
    }  # fmt: skip


def test_an_older_fabric_struct_version_is_refused(nvml: NvmlStandIn, tmp_path: Path) -> None:
    """The stand-in serves nvmlGpuFabricInfo_v2 only, and says so as NVML does."""
    document = node()
    document["devices"][0]["fabric"] = {"state": 3}
    code = (
        "import ctypes, pynvml\n"
        "pynvml.nvmlInit()\n"
        "h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "for info in (pynvml.c_nvmlGpuFabricInfo_v3_t(), pynvml.c_nvmlGpuFabricInfo_v2_t()):\n"
        "    try:\n"
        "        pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))\n"
        "        print(info.state)\n"
        "    except pynvml.NVMLError as err:\n"
        "        print('error', err.value)\n"
    )
    done = run_python(nvml, write(tmp_path, document), code)
    assert done.returncode == 0, done.stderr
    version_mismatch = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert done.stdout.split("\n")[:2] == [f"error {version_mismatch}", "3"]


def test_per_call_errors_from_the_spec(nvml: NvmlStandIn, tmp_path: Path) -> None:
    document = node(errors={"nvmlDeviceGetRemappedRows": "NVML_ERROR_UNKNOWN"})
    document["devices"][1].update(
        temperature=99, errors={"nvmlDeviceGetTemperature": "NOT_SUPPORTED"}
    )
    document["devices"][2].update(errors={"nvmlDeviceGetPciInfo": 15})
    over_c = c_report(nvml, write(tmp_path, document))
    findings = {(r, m) for r, _, m, _ in over_c["findings"]}
    uuids = [d["uuid"] for d in document["devices"]]
    # Not supported is skipped (no Thermal finding at 99 C); other codes are findings.
    assert not any(r == "Thermal" for r, _ in findings)
    assert ("GpuLost", f"GPU {uuids[2]} is lost") in findings
    assert ("NvmlError", f"GPU {uuids[0]}: NVML error: Unknown Error") in findings


def test_the_spec_is_read_again_when_it_changes(nvml: NvmlStandIn, tmp_path: Path) -> None:
    spec = write(tmp_path, node())
    code = f"""
import os, pynvml, yaml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(5)
print(pynvml.nvmlDeviceGetTemperature(h, 0))
doc = yaml.safe_load(open({str(spec)!r}))
doc["devices"][5]["lost"] = True
open({str(spec)!r} + ".tmp", "w").write(yaml.safe_dump(doc))
os.replace({str(spec)!r} + ".tmp", {str(spec)!r})
try:
    pynvml.nvmlDeviceGetTemperature(h, 0)
except pynvml.NVMLError_GpuIsLost as err:
    print(err)
"""
    done = run_python(nvml, spec, code)
    assert done.stdout.split("\n")[:2] == ["41", "GPU is lost"], done.stderr


def test_nvml_answers_as_nvml_does(nvml: NvmlStandIn, tmp_path: Path) -> None:
    spec = write(tmp_path, node())
    code = """
import ctypes, pynvml
lib = ctypes.CDLL("libnvidia-ml.so.1")
count = ctypes.c_uint()
print(lib.nvmlDeviceGetCount_v2(ctypes.byref(count)))  # before nvmlInit
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
small = ctypes.create_string_buffer(4)
print(lib.nvmlDeviceGetUUID(handle, small, ctypes.c_uint(4)))
for call in (lambda: pynvml.nvmlDeviceGetHandleByIndex(8),
             lambda: pynvml.nvmlDeviceGetTemperature(handle, 1),
             lambda: pynvml.nvmlDeviceGetNvLinkState(handle, 18)):
    try:
        call()
    except pynvml.NVMLError as err:
        print(err.value)
values = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 1])
print(values[0].nvmlReturn, values[0].valueType, values[0].value.uiVal, values[1].nvmlReturn)
print(pynvml.nvmlErrorString(pynvml.NVML_ERROR_IN_USE))
"""
    done = run_python(nvml, spec, code)
    assert done.stdout.splitlines() == [
        str(pynvml.NVML_ERROR_UNINITIALIZED),
        str(pynvml.NVML_ERROR_INSUFFICIENT_SIZE),
        str(pynvml.NVML_ERROR_INVALID_ARGUMENT),  # index 8 of 8
        str(pynvml.NVML_ERROR_INVALID_ARGUMENT),  # no such sensor
        str(pynvml.NVML_ERROR_INVALID_ARGUMENT),  # link 18 of 18
        f"0 {pynvml.NVML_VALUE_TYPE_UNSIGNED_INT} 0 {pynvml.NVML_ERROR_NOT_SUPPORTED}",
        "In use by another client",
    ], done.stderr


def test_events_honour_the_registered_mask(nvml: NvmlStandIn, tmp_path: Path) -> None:
    spec = write(tmp_path, node(xidEvents=[{"id": 1, "device": 2, "xid": 79}]))
    code = """
import pynvml
pynvml.nvmlInit()
events = pynvml.nvmlEventSetCreate()
two = pynvml.nvmlDeviceGetHandleByIndex(2)
pynvml.nvmlDeviceRegisterEvents(two, pynvml.nvmlEventTypeGpuUnavailableError, events)
try:
    pynvml.nvmlEventSetWait(events, 200)
except pynvml.NVMLError_Timeout:
    print("timeout")  # registered for another type: the Xid waits
pynvml.nvmlDeviceRegisterEvents(two, pynvml.nvmlEventTypeXidCriticalError, events)
data = pynvml.nvmlEventSetWait(events, 200)
print(pynvml.nvmlDeviceGetUUID(data.device), data.eventType, data.eventData)
try:
    pynvml.nvmlDeviceRegisterEvents(two, pynvml.nvmlEventTypeClock, events)
except pynvml.NVMLError_NotSupported:
    print("not supported")
"""
    done = run_python(nvml, spec, code)
    uuid = gpu_spec("node-a")["devices"][2]["uuid"]
    assert done.stdout.splitlines() == [
        "timeout",
        f"{uuid} {pynvml.nvmlEventTypeXidCriticalError} 79",
        "not supported",
    ], done.stderr


@pytest.mark.parametrize(
    ("document", "said"),
    [
        (
            {"devices": [{"uuid": "GPU-1", "temprature": 40}]},
            "spec.yaml:2: devices: unknown key temprature",
        ),
        (
            {"devices": [{"uuid": "GPU-1", "lost": "maybe"}]},
            "lost: expected true or false, got maybe",
        ),
        ({"devices": [{"pciBusId": "00000000:18:00.0"}]}, "devices[0]: uuid is required"),
        ({"errors": {"nvmlDeviceGetName": "BROKEN"}}, "not an NVML error name"),
        ({"xidEvents": [{"device": 0}]}, "xidEvents: xid is required"),
    ],
)
def test_a_bad_spec_is_refused_with_where_and_why(
    nvml: NvmlStandIn, tmp_path: Path, document: dict[str, Any], said: str
) -> None:
    spec = write(tmp_path, document)
    code = """
import pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as err:
    print(err.value)
"""
    done = run_python(nvml, spec, code)
    assert done.stdout.strip() == str(pynvml.NVML_ERROR_UNKNOWN)
    assert said in done.stderr and str(spec) in done.stderr


def test_without_a_spec_there_is_no_driver_to_describe(nvml: NvmlStandIn, tmp_path: Path) -> None:
    code = """
import pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as err:
    print(err.value)
"""
    done = run_python(nvml, tmp_path / "absent.yaml", code)
    assert done.stdout.strip() == str(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


ENTRY_POINTS = (
    "nvmlInitWithFlags", "nvmlInit_v2", "nvmlShutdown", "nvmlErrorString",
    "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetNvLinkState", "nvmlDeviceGetFieldValues", "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
)  # fmt: skip


def test_the_abi_pynvml_resolves(nvml: NvmlStandIn, tmp_path: Path) -> None:
    """Every versioned entry point the agent reaches through pynvml, and the struct
    sizes pynvml's ctypes definitions assume (nvml.c asserts the same at compile time).
    In a child process: this one must not map a libnvidia-ml (test_agent_access.py)."""
    code = f"""
import ctypes, pynvml
lib = ctypes.CDLL("libnvidia-ml.so.1")
print([n for n in {ENTRY_POINTS!r} if not hasattr(lib, n)])
print([ctypes.sizeof(t) for t in (pynvml.nvmlPciInfo_t, pynvml.c_nvmlProcessInfo_v3_t,
                                  pynvml.c_nvmlFieldValue_t, pynvml.c_nvmlEventData_t)])
"""
    done = run_python(nvml, write(tmp_path, node()), code)
    assert done.stdout.splitlines() == ["[]", "[68, 24, 40, 32]"], done.stderr


# Every NVML function NVIDIA's device plugin (testenv/deviceplugin) calls, by the name
# its binary binds (LD_DEBUG=bindings): at start, in device discovery, in its health
# checker and for a preferred allocation. One missing kills the plugin (go-nvml's calls
# are bound lazily: "symbol lookup error").
DEVICE_PLUGIN_ENTRY_POINTS = (
    "nvmlInit_v2", "nvmlShutdown", "nvmlErrorString", "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetName",
    "nvmlDeviceGetMigMode", "nvmlDeviceGetUUID", "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCudaComputeCapability",
    "nvmlEventSetCreate", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2", "nvmlEventSetFree", "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo_v2",
)  # fmt: skip


def test_what_the_device_plugin_reads(nvml: NvmlStandIn, tmp_path: Path) -> None:
    document = node()
    document["devices"][3]["devicePath"] = str(tmp_path / "nvidia7")  # its minor: 7
    document["devices"][1].update(
        name="NVIDIA A100-SXM4-40GB", processes=[{"pid": 42, "usedMemoryMiB": 2048}]
    )
    document["devices"][5]["nvlinks"] = 0
    code = f"""
import ctypes, pynvml
lib = ctypes.CDLL("libnvidia-ml.so.1")
print([n for n in {DEVICE_PLUGIN_ENTRY_POINTS!r} if not hasattr(lib, n)])
pynvml.nvmlInit()
gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
print([pynvml.nvmlDeviceGetMinorNumber(h) for h in gpus])
print(*(pynvml.nvmlDeviceGetCudaComputeCapability(h) for h in gpus[:2]))
for h in gpus[:2]:
    m = pynvml.nvmlDeviceGetMemoryInfo(h)
    print(m.total >> 20, m.free >> 20, m.used >> 20)
print([pynvml.nvmlDeviceGetTopologyCommonAncestor(gpus[0], h) for h in gpus])
print(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(gpus[0], 5).busId)
for call in (lambda: pynvml.nvmlDeviceGetNvLinkRemotePciInfo(gpus[0], 18),
             lambda: pynvml.nvmlDeviceGetNvLinkRemotePciInfo(gpus[5], 0)):
    try:
        call()
    except pynvml.NVMLError as err:
        print(err.value)
"""
    done = run_python(nvml, write(tmp_path, document), code)
    assert done.stdout.splitlines() == [
        "[]",
        "[0, 1, 2, 7, 4, 5, 6, 7]",
        "(9, 0) (8, 0)",
        "81920 81920 0",  # the name's 80GB (the default H100 80GB HBM3), nothing running
        "40960 38912 2048",
        "[0, 40, 40, 40, 50, 50, 50, 50]",  # one board; one NUMA node by fours; across
        "00000000:06:00.0",  # link 5: NVSwitch 1
        str(pynvml.NVML_ERROR_INVALID_ARGUMENT),  # link 18 of 18
        str(pynvml.NVML_ERROR_NOT_SUPPORTED),  # no NVLink
    ], done.stderr


def test_an_event_wait_honours_its_timeout_and_sees_an_xid_added_while_it_waits(
    nvml: NvmlStandIn, tmp_path: Path
) -> None:
    """The device plugin's health checker: nvmlEventSetWait_v2(set, 5000) in a loop,
    while a test adds the Xid to the spec."""
    spec = write(tmp_path, node())
    code = f"""
import os, threading, time, pynvml, yaml
pynvml.nvmlInit()
events = pynvml.nvmlEventSetCreate()
two = pynvml.nvmlDeviceGetHandleByIndex(2)
pynvml.nvmlDeviceRegisterEvents(two, pynvml.nvmlEventTypeXidCriticalError, events)
start = time.monotonic()
try:
    pynvml.nvmlEventSetWait(events, 300)
except pynvml.NVMLError_Timeout:
    print("timeout", 0.3 <= time.monotonic() - start < 1.5)
def add_xid():
    doc = yaml.safe_load(open({str(spec)!r}))
    doc["xidEvents"] = [{{"id": 1, "device": 2, "xid": 48}}]
    open({str(spec)!r} + ".tmp", "w").write(yaml.safe_dump(doc))
    os.replace({str(spec)!r} + ".tmp", {str(spec)!r})
threading.Timer(0.5, add_xid).start()
start = time.monotonic()
data = pynvml.nvmlEventSetWait(events, 5000)
print(pynvml.nvmlDeviceGetUUID(data.device), data.eventType, data.eventData,
      0.5 <= time.monotonic() - start < 3)
"""
    done = run_python(nvml, spec, code)
    uuid = gpu_spec("node-a")["devices"][2]["uuid"]
    assert done.stdout.splitlines() == [
        "timeout True",
        f"{uuid} {pynvml.nvmlEventTypeXidCriticalError} 48 True",
    ], done.stderr


# -- the stand-in nvidia-smi ----------------------------------------------------


def resets(spec: Path) -> list[str]:
    log = spec.with_name(spec.name + ".resets")
    return log.read_text().splitlines() if log.exists() else []


def test_smi_reset_as_fakenvml_resets(nvml: NvmlStandIn, tmp_path: Path) -> None:
    document = node()
    busy, flaky, lost = (document["devices"][i] for i in (1, 2, 3))
    busy["processes"] = [{"pid": 4242}]
    flaky.update(
        resetFailures=1,
        eccUncorrectedVolatile=5,
        recoveryAction=1,
        remappedRows={"pending": True, "failure": False},
    )
    lost["lost"] = True
    spec = write(tmp_path, document)

    done = smi(nvml, spec, "-r", "-i", busy["uuid"])
    assert done.returncode == 255
    assert done.stdout.startswith(
        "The following GPUs could not be reset:\n"
        f"  GPU {busy['pciBusId']}: In use by another client\n"
    )
    assert "Please first kill all processes using this device" in done.stdout

    done = smi(nvml, spec, "-r", "-i", flaky["uuid"])
    assert done.returncode == 255 and "could not be reset" in done.stdout
    assert yaml.safe_load(spec.read_text())["devices"][2]["eccUncorrectedVolatile"] == 5

    done = smi(nvml, spec, "-r", "-i", flaky["uuid"])
    assert (done.returncode, done.stdout) == (
        0,
        f"GPU {flaky['pciBusId']} was successfully reset.\n",
    )
    after = yaml.safe_load(spec.read_text())
    assert after["devices"][2] == {
        **flaky,
        "eccUncorrectedVolatile": 0,
        "recoveryAction": 0,
        "remappedRows": {"pending": False, "failure": False},
    }
    assert after["devices"][1] == busy  # only the reset GPU changed

    assert smi(nvml, spec, "-r", "-i", lost["uuid"]).returncode == 15
    assert smi(nvml, spec, "-r", "-i", "GPU-nonesuch").returncode == 6
    assert resets(spec) == [
        f"{busy['uuid']} in-use",
        f"{flaky['uuid']} failed",
        f"{flaky['uuid']} ok",
        f"{lost['uuid']} failed",
    ]

    # FakeNvml.reset_gpu: the same outcomes on the same spec.
    twin = write(tmp_path, document, "twin.yaml")
    fake = FakeNvml(twin)
    outcomes = []
    for uuid in (busy["uuid"], flaky["uuid"], flaky["uuid"], lost["uuid"]):
        with contextlib.suppress(pynvml.NVMLError):  # refused or failed: in the log
            fake.reset_gpu(uuid)
        outcomes.append(f"{uuid} {fake.resets()[-1][1]}")
    assert outcomes == resets(spec)
    assert yaml.safe_load(twin.read_text())["devices"][2] == after["devices"][2]


def test_smi_query_as_the_smi_probe_reads_it(nvml: NvmlStandIn, tmp_path: Path) -> None:
    """The query answers as NVML does over the same spec: past `visible` not listed, a
    GPU without a handle a line of its own ahead of the rows, a field NVML cannot read
    its error in brackets (the shapes gpuheal/agent/smi.py cites)."""
    document = node(visible=7)
    devices = document["devices"]
    devices[4]["lost"] = True
    devices[5]["errors"] = {"nvmlDeviceGetHandleByIndex": "UNKNOWN"}
    devices[1]["errors"] = {
        "nvmlDeviceGetUUID": "GPU_IS_LOST",
        "nvmlDeviceGetPciInfo": "GPU_IS_LOST",
    }
    devices[2]["errors"] = {"nvmlDeviceGetUUID": "NOT_SUPPORTED"}
    spec = write(tmp_path, document)
    done = smi(nvml, spec, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader")
    assert done.returncode == 15  # nvidia-smi(1): a GPU fallen off the bus
    assert done.stdout.splitlines() == [
        "Unable to determine the device handle for GPU0000:1C:00.0: GPU is lost. "
        "Reboot the system to recover this GPU",
        "Unable to determine the device handle for GPU0000:1D:00.0: Unknown Error",
        f"0, {devices[0]['uuid']}, {devices[0]['pciBusId']}",
        "1, [GPU is lost], [GPU is lost]",
        f"2, [N/A], {devices[2]['pciBusId']}",
        f"3, {devices[3]['uuid']}, {devices[3]['pciBusId']}",
        f"6, {devices[6]['uuid']}, {devices[6]['pciBusId']}",
    ]
    devices[4]["lost"] = False
    done = smi(nvml, write(tmp_path, document), "--query-gpu=index,uuid", "--format=csv,noheader")
    assert done.returncode == 255 and done.stdout.splitlines()[0].endswith(": Unknown Error")
    done = smi(nvml, spec, "--query-gpu=index,power.draw", "--format=csv,noheader")
    assert (done.returncode, done.stdout) == (
        2,
        'Field "power.draw" is not a valid field to query.\n\n',
    )
    done = smi(nvml, spec, "--query-gpu=index", "--format=csv")
    assert done.returncode == 2 and "only --format=csv,noheader" in done.stderr
    # The same GPUs through NVML: the lost one and the one without a handle fail there too.
    seen = c_report(nvml, spec)
    assert seen["count"] == 7


def test_smi_query_waits_as_long_as_a_hung_gpu(nvml: NvmlStandIn, tmp_path: Path) -> None:
    document = node()
    document["devices"][6]["hangSeconds"] = 0.5
    started = time.monotonic()
    done = smi(nvml, write(tmp_path, document), "--query-gpu=index,uuid", "--format=csv,noheader")
    assert time.monotonic() - started >= 0.5
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 8


def test_a_reset_gpu_s_past_xids_reach_no_session_opened_after_it(
    nvml: NvmlStandIn, tmp_path: Path
) -> None:
    """A device plugin restarted after `nvidia-smi -r` (the agent's restartPods) opens a
    new NVML session: the reset GPU's Xid is history to it, another GPU's is not."""
    document = node()
    document["xidEvents"] = [{"id": 1, "device": 2, "xid": 48}, {"id": 2, "device": 5, "xid": 79}]
    spec = write(tmp_path, document)
    twin = write(tmp_path, document, "twin.yaml")
    uuid = document["devices"][2]["uuid"]
    assert smi(nvml, spec, "-r", "-i", uuid).returncode == 0
    FakeNvml(twin).reset_gpu(uuid)
    for path in (spec, twin):
        events = yaml.safe_load(path.read_text())["xidEvents"]
        assert events == [
            {"id": 1, "device": 2, "xid": 48, "reset": True},
            {"id": 2, "device": 5, "xid": 79},
        ]
    code = """
import pynvml
pynvml.nvmlInit()
events = pynvml.nvmlEventSetCreate()
for i in range(8):
    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
seen = []
while True:
    try:
        seen.append(pynvml.nvmlEventSetWait(events, 300).eventData)
    except pynvml.NVMLError_Timeout:
        break
print(seen)
"""
    assert run_python(nvml, spec, code).stdout.strip() == "[79]"
    fake = FakeNvml(twin)
    fake_events = fake.nvmlEventSetCreate()
    for i in range(8):
        handle = fake.nvmlDeviceGetHandleByIndex(i)
        fake.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, fake_events)
    assert fake.nvmlEventSetWait(fake_events, 300).eventData == 79
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(fake_events, 300)
