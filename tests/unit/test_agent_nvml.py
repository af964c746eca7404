"""The NVML probe's real code over the spec-driven fake library."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from gpuheal.agent.fakenvml import FakeNvml
from gpuheal.agent.findings import Health, verdict
from gpuheal.agent.nvml import NvmlProbe, Thresholds, XidWatcher
from gpuheal.agent.timeouts import GuardedProbe
from gpuheal.model import Severity
from gpuheal.supervisor import Supervisor


def spec(tmp_path: Path, **device_changes: Any) -> Path:
    devices = [
        {
            "uuid": f"GPU-{i}",
            "pciBusId": f"00000000:{0x18 + i:02X}:00.0",
            "temperature": 40,
            "eccUncorrectedVolatile": 0,
            "remappedRows": {"pending": False, "failure": False},
            "nvlinks": 4,
        }
        for i in range(8)
    ]
    index = device_changes.pop("index", 3)
    visible = device_changes.pop("visible", None)
    devices[index].update(device_changes)
    document: dict[str, Any] = {"driverVersion": "550.54.15", "devices": devices}
    if visible is not None:
        document["visible"] = visible
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def rewrite(path: Path, document: object) -> None:
    """Whole or not at all, as a watcher thread may read at any moment: one that
    registered on a half-written spec would see no GPU to register on, and never
    deliver an Xid (a CI run failed so)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(document))
    tmp.replace(path)


def probe(path: Path, expected: int | None = 8) -> NvmlProbe:
    return NvmlProbe(FakeNvml(path), expected_gpus=lambda: expected, thresholds=Thresholds(85, 95))


def reasons(path: Path, expected: int | None = 8) -> list[str]:
    result = probe(path, expected).run()
    assert result.ran and result.level
    return [f.reason for f in result.findings]


def test_healthy_devices_and_the_pci_to_uuid_map(tmp_path: Path) -> None:
    nvml = probe(spec(tmp_path))
    result = nvml.run()
    assert result.findings == ()
    assert nvml.devices.by_pci["0000:1b:00"] == "GPU-3"
    assert nvml.devices.count == 8


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"eccUncorrectedVolatile": 2}, "EccUncorrectable"),
        ({"remappedRows": {"pending": True, "failure": False}}, "RowRemapPending"),
        ({"remappedRows": {"pending": False, "failure": True}}, "RowRemapFailure"),
        ({"remappedRows": None, "retiredPagesPending": True}, "RetiredPagesPending"),
        ({"temperature": 97}, "Thermal"),
        ({"nvlinks": [True, False, True, True]}, "NvlinkDown"),
        ({"lost": True}, "GpuLost"),
        ({"recoveryAction": pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT}, "NodeRebootRequired154"),
        ({"visible": 7}, "GpuMissing"),
    ],
)
def test_each_device_fault_is_found(tmp_path: Path, change: dict[str, Any], reason: str) -> None:
    assert reasons(spec(tmp_path, **change)) == [reason]


def test_a_warm_gpu_is_a_warning_not_a_fault(tmp_path: Path) -> None:
    result = probe(spec(tmp_path, temperature=88)).run()
    assert result.findings == () and "88 C (warning)" in result.warnings[0]


def test_no_expected_count_means_whatever_is_visible(tmp_path: Path) -> None:
    assert reasons(spec(tmp_path, visible=7), expected=None) == []


def test_nvml_that_cannot_load_is_a_probe_that_did_not_run(tmp_path: Path) -> None:
    result = probe(tmp_path / "no-such-spec.yaml").run()
    assert not result.ran and "NVML unavailable" in result.error


def test_a_hung_call_times_out_and_later_rounds_do_not_pile_up(tmp_path: Path) -> None:
    guarded = GuardedProbe("nvml", probe(spec(tmp_path, hangSeconds=3)).run, 0.2, level=True)
    first = guarded.run()
    assert not first.ran and "timed out after 0.2s" in first.error
    second = guarded.run()
    assert not second.ran and second.error == "previous call still hung"
    assert first.hung and second.hung and not first.findings  # unknown, not faulty
    seen = verdict([second])
    assert (seen.health, seen.reason) == (Health.UNKNOWN, "DriverUnresponsive")


def test_a_call_hung_past_the_limit_is_an_unresponsive_driver(tmp_path: Path) -> None:
    now = [100.0]
    guarded = GuardedProbe(
        "nvml",
        probe(spec(tmp_path, hangSeconds=3)).run,
        0.1,
        level=True,
        fault_after_s=60,
        clock=lambda: now[0],
    )
    assert not guarded.run().findings
    now[0] += 59
    assert not guarded.run().findings  # 59 s: still only unknown
    now[0] += 1
    (found,) = guarded.run().findings
    assert (found.reason, found.severity) == ("DriverUnresponsive", Severity.P1)
    assert verdict([guarded.run()]).health is Health.FAULTY


def test_a_call_that_fails_fast_is_not_a_hang(tmp_path: Path) -> None:
    result = GuardedProbe("nvml", probe(tmp_path / "none.yaml").run, 1, level=True).run()
    assert not result.ran and not result.hung
    assert verdict([result]).reason == "ProbesFailed"


def test_a_gpu_lost_mid_run_is_named_by_the_uuid_it_last_answered(tmp_path: Path) -> None:
    path = spec(tmp_path)
    nvml = probe(path)
    assert nvml.run().findings == ()
    spec(tmp_path, lost=True)  # GPU 3 now answers nothing, its handle included
    (lost,) = nvml.run().findings
    assert (lost.reason, lost.devices, lost.message) == ("GpuLost", ("GPU-3",), "GPU GPU-3 is lost")
    # A probe that never saw it read (a restarted agent) can only say which index.
    (first,) = probe(path).run().findings
    assert first.devices == ("index-3",)


def test_an_xid_of_a_gpu_that_cannot_be_named_is_still_reported(tmp_path: Path) -> None:
    """Xid 79 comes from a GPU that fell off the bus: its UUID query fails too."""
    path = spec(tmp_path)
    seen: list[tuple[int, str]] = []
    watcher = XidWatcher(FakeNvml(path), lambda xid, uuid: seen.append((xid, uuid)))

    def wait(count: int) -> None:
        deadline = time.monotonic() + 10
        while len(seen) < count and time.monotonic() < deadline:
            time.sleep(0.05)

    watcher.start()
    try:
        document = yaml.safe_load(path.read_text())
        document["xidEvents"] = [{"id": 1, "device": 2, "xid": 48}]
        rewrite(path, document)
        wait(1)  # registered on every GPU by now
        document["devices"][3]["lost"] = True
        document["xidEvents"].append({"id": 2, "device": 3, "xid": 79})
        rewrite(path, document)
        wait(2)
    finally:
        watcher.stop()
    assert seen == [(48, "GPU-2"), (79, "")]


def test_a_watcher_that_crashes_is_said_counted_and_watches_again(tmp_path: Path) -> None:
    """An unexpected error in the NVML event thread (here from its consumer) must not
    end the Xid intake silently: the supervisor counts it and the thread registers
    again and goes on (the kernel log carries the Xid that was being handled)."""
    path = spec(tmp_path)
    seen: list[tuple[int, str]] = []

    def on_xid(xid: int, uuid: str) -> None:
        seen.append((xid, uuid))
        if len(seen) == 1:
            raise RuntimeError("a bug in the consumer")

    counted: list[str] = []
    supervisor = Supervisor("agent", counted=counted.append, base_s=0.05, max_s=0.05)
    watcher = XidWatcher(FakeNvml(path), on_xid)
    watcher.start(supervisor)
    try:
        document = yaml.safe_load(path.read_text())
        document["xidEvents"] = [{"id": 1, "device": 2, "xid": 48}]
        rewrite(path, document)
        deadline = time.monotonic() + 10
        while not counted and time.monotonic() < deadline:
            time.sleep(0.05)
        document["xidEvents"].append({"id": 2, "device": 1, "xid": 31})
        rewrite(path, document)
        while (31, "GPU-1") not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watcher.stop()
    assert counted == ["nvml-events"]
    assert seen[0] == (48, "GPU-2") and (31, "GPU-1") in seen


def test_the_fake_reads_a_spec_rewritten_within_one_clock_tick(tmp_path: Path) -> None:
    """A truncate-and-write keeps the mtime when the kernel's clock has not ticked
    between the two (it ticks in jiffies): the fake, as the C stand-in, must see the
    new size, or it keeps the half-written spec it read in between for ever."""
    path = spec(tmp_path)
    nvml = FakeNvml(path)
    stamp = path.stat().st_mtime_ns
    path.write_text("")
    os.utime(path, ns=(stamp, stamp))
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 0
    spec(tmp_path)
    os.utime(path, ns=(stamp, stamp))
    assert nvml.nvmlDeviceGetCount() == 8
