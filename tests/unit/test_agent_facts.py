"""The agent's facts: cgroup parsing, GPU process listing, counters, versions."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal.agent.config import parse_agent_config
from gpuheal.agent.facts import (
    Counters,
    changed_facts,
    cuda_text,
    gpu_processes,
    pod_uid,
)
from gpuheal.agent.fakenvml import FakeNvml
from gpuheal.agent.nvml import NvmlProbe, Thresholds
from gpuheal.config import ConfigError
from gpuheal.model import COUNTERS_SINCE, ECC_ERRORS, LAST_GPU_ERROR, XID_ERRORS

UID = "1b2c3d4e-5f60-4718-9abc-0123456789ab"
UNDERSCORED = UID.replace("-", "_")
CONTAINER = "3f1e" * 16


@pytest.mark.parametrize(
    "cgroup",
    [
        # cgroup v2, systemd driver, each QoS class
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}.slice"
        f"/cri-containerd-{CONTAINER}.scope\n",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice"
        f"/crio-{CONTAINER}.scope\n",
        f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/cri-containerd-{CONTAINER}.scope\n",
        # cgroup v2, cgroupfs driver
        f"0::/kubepods/burstable/pod{UID}/{CONTAINER}\n",
        f"0::/kubepods/pod{UID}/{CONTAINER}\n",
        # cgroup v1: one line per hierarchy, some without the pod
        "12:pids:/system.slice/containerd.service\n"
        f"11:memory:/kubepods/besteffort/pod{UID}/{CONTAINER}\n"
        f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CONTAINER}\n",
        "13:cpuset:/\n"
        f"4:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}"
        f".slice/docker-{CONTAINER}.scope\n",
        # garbage lines around the real one
        f"garbage\n::\n\x00\x01\n5:cpu:/kubepods/burstable/pod{UID.upper()}/{CONTAINER}\n",
        # the pod's own cgroup (a process in the pause sandbox's parent)
        f"0::/kubepods/burstable/pod{UID}\n",
    ],
)
def test_the_pod_uid_comes_from_either_cgroup_layout(cgroup: str) -> None:
    assert pod_uid(cgroup) == UID


def test_a_static_pod_uid_has_no_dashes() -> None:
    static = "6e3ab0a3a7e1c8d1f6b2c3d4e5f60718"
    assert pod_uid(f"0::/kubepods/burstable/pod{static}/{CONTAINER}\n") == static


@pytest.mark.parametrize(
    "cgroup",
    [
        "",
        "0::/\n",
        "0::/system.slice/sshd.service\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "not a cgroup file at all",
        "0::/kubepods/burstable/podnot-a-uid/abc\n",
        f"0::/kubepods/burstable/pod{UID}x/{CONTAINER}\n",  # not a whole UID
        f"0::/docker/pod{UID}/{CONTAINER}\n",  # "pod" outside the kubelet's tree
        "1:2\n3\n:::::\n",
    ],
)
def test_processes_outside_any_pod_have_no_uid(cgroup: str) -> None:
    assert pod_uid(cgroup) == ""


def proc(tmp_path: Path, cgroups: dict[int, str]) -> Path:
    root = tmp_path / "proc"
    for pid, text in cgroups.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
    return root


def test_gpu_processes_name_their_pods_sorted_and_deduplicated(tmp_path: Path) -> None:
    root = proc(
        tmp_path,
        {
            4242: f"0::/kubepods/burstable/pod{UID}/{CONTAINER}\n",
            17: "0::/system.slice/dcgm.service\n",
        },
    )
    # 999 has exited since NVML listed it (or is not visible): its pod is unknown.
    value = gpu_processes([4242, 17, 999, 4242], root, cap=64)
    assert value == f"17@,999@?,4242@{UID}"


def test_the_process_list_is_capped(tmp_path: Path) -> None:
    value = gpu_processes(range(1000, 1100), tmp_path, cap=64)
    entries = value.split(",")
    assert len(entries) == 64 and entries[0] == "1000@?" and entries[-1] == "1063@?"
    assert len(value) < 1024  # an annotation stays small


def test_cuda_driver_version_as_people_write_it() -> None:
    assert cuda_text(12040) == "12.4"
    assert cuda_text(11080) == "11.8"
    assert cuda_text(12000) == "12.0"


def test_counters_count_xids_and_new_ecc_errors_since_the_start() -> None:
    start = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
    counters = Counters(start)
    assert counters.facts() == {XID_ERRORS: "0", COUNTERS_SINCE: "2025-03-01T12:00:00Z"}
    counters.ecc_total(0, start + dt.timedelta(seconds=10))
    assert counters.facts()[ECC_ERRORS] == "0" and LAST_GPU_ERROR not in counters.facts()
    counters.xid(start + dt.timedelta(minutes=1))
    counters.xid(start + dt.timedelta(minutes=2))
    counters.ecc_total(3, start + dt.timedelta(minutes=3))
    counters.ecc_total(3, start + dt.timedelta(minutes=4))  # no new error
    assert counters.facts() == {
        XID_ERRORS: "2",
        ECC_ERRORS: "3",
        COUNTERS_SINCE: "2025-03-01T12:00:00Z",
        LAST_GPU_ERROR: "2025-03-01T12:03:00Z",
    }


def test_only_changed_facts_are_written() -> None:
    written = {XID_ERRORS: "1", COUNTERS_SINCE: "a"}
    assert changed_facts(written, {XID_ERRORS: "1", COUNTERS_SINCE: "b"}) == {COUNTERS_SINCE: "b"}
    assert changed_facts(written, {XID_ERRORS: "1"}) == {}


def spec(tmp_path: Path, **top: Any) -> Path:
    devices = [{"uuid": f"GPU-{i}", "eccUncorrectedVolatile": 0, "nvlinks": 0} for i in range(4)]
    devices[1]["processes"] = [{"pid": 300, "usedMemoryMiB": 512}, {"pid": 301}]
    devices[2]["processes"] = [{"pid": 300}]  # one process on two GPUs
    devices[3]["eccUncorrectedVolatile"] = 2
    document = {"driverVersion": "550.54.15", "devices": devices, **top}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_the_probe_reads_versions_the_ecc_total_and_processes_when_due(tmp_path: Path) -> None:
    due = [False]
    nvml = NvmlProbe(
        FakeNvml(spec(tmp_path, cudaDriverVersion=12020)),
        expected_gpus=lambda: None,
        thresholds=Thresholds(),
        processes_due=lambda: due[0],
    )
    assert nvml.run().ran
    assert (nvml.versions.driver, nvml.versions.cuda) == ("550.54.15", "12.2")
    assert nvml.ecc_uncorrected == 2
    assert nvml.pids is None  # not listed: not due
    due[0] = True
    nvml.run()
    assert sorted(nvml.pids or ()) == [300, 300, 301]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"procRoot": ""}, "procRoot: must be a non-empty string"),
        ({"processReportSeconds": -1}, "processReportSeconds: must be between 0 and 86400"),
        ({"processReportMax": 0}, "processReportMax: must be between 1 and 10000"),
        ({"processReportMax": "64"}, "processReportMax: must be an integer"),
    ],
)
def test_process_reporting_config_is_validated(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_agent_config(raw)


def test_process_reporting_config_defaults_and_values() -> None:
    default = parse_agent_config({})
    assert (default.proc_root, default.process_report_seconds, default.process_report_max) == (
        Path("/proc"),
        60.0,
        64,
    )
    set_ = parse_agent_config(
        {"procRoot": "/host/proc", "processReportSeconds": 5, "processReportMax": 8}
    )
    assert (set_.proc_root, set_.process_report_seconds, set_.process_report_max) == (
        Path("/host/proc"),
        5.0,
        8,
    )
