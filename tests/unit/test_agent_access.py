"""What the agent reaches (NVML, the GPUs, the kernel log): the fact's format, the
condition it makes, the NVML probe's state, the metrics and `gpuheal status`."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import msgspec
import pynvml
import pytest
import yaml
from prometheus_client import generate_latest

from gpuheal.agent.fakenvml import FakeNvml
from gpuheal.agent.findings import Health, ProbeFinding, ProbeResult, Verdict, verdict, with_access
from gpuheal.agent.nvml import NvmlProbe, Thresholds, loaded_library
from gpuheal.config import Config
from gpuheal.kube.projections import NodeJson
from gpuheal.kube.snapshot import Snapshot
from gpuheal.metrics.agent import AgentMetrics
from gpuheal.model import AGENT_ACCESS, Severity
from gpuheal.ops.status import NO_AGENT, agent_access, fleet_status
from gpuheal.policy import access
from gpuheal.policy.sharing import gpus_offered, label_counts_gpus

_NOW = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)
LOADED = access.Access(
    access.NVML_OK,
    access.KMSG_OK,
    gpus=8,
    expected=8,
    driver="550.54.15",
    nvml_version="12.550.54.15",
    library="/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15",
)


def test_the_fact_round_trips_and_names_every_piece() -> None:
    value = access.encode(LOADED)
    assert value == (
        "nvml=ok;gpus=8/8;kmsg=ok;driver=550.54.15;nvml-version=12.550.54.15;"
        "library=/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"
    )
    assert access.decode(value) == LOADED
    missing = access.Access(access.NVML_NO_LIBRARY, access.KMSG_UNREADABLE, nvml_error="x")
    assert access.encode(missing) == "nvml=library-not-found;gpus=?/?;kmsg=unreadable"
    # The error text is the log's and the condition's, not the annotation's.
    assert access.decode(access.encode(missing)) == access.Access(
        access.NVML_NO_LIBRARY, access.KMSG_UNREADABLE
    )


@pytest.mark.parametrize(
    "value",
    ["", "nvml=ok", "nvml=maybe;gpus=1/1;kmsg=ok", "nvml=ok;gpus=x/1;kmsg=ok",
     "nvml=ok;gpus=1/1;kmsg=ok;nvml=ok", "nvml=ok;gpus=1/1;kmsg=ok;driver=5 5"],
)  # fmt: skip
def test_a_value_the_agent_does_not_write_is_none(value: str) -> None:
    assert access.decode(value) is None


def test_a_library_path_cannot_break_the_format() -> None:
    odd = access.Access(access.NVML_OK, access.KMSG_OK, 1, 1, library="/a b;c=d/" + "x" * 400)
    decoded = access.decode(access.encode(odd))
    assert decoded is not None and decoded.library.startswith("/a_b_c_d/")
    assert len(decoded.library) == access.MAX_TEXT


def test_nvml_states_follow_nvmls_error_codes() -> None:
    assert access.nvml_state(None) == access.NVML_OK
    assert access.nvml_state(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND) == access.NVML_NO_LIBRARY
    assert access.nvml_state(pynvml.NVML_ERROR_DRIVER_NOT_LOADED) == access.NVML_NO_DRIVER
    assert access.nvml_state(pynvml.NVML_ERROR_NO_PERMISSION) == access.NVML_NO_PERMISSION
    assert access.nvml_state(pynvml.NVML_ERROR_UNKNOWN) == access.NVML_ERROR


def reasons(reach: access.Access) -> list[str]:
    return [p.reason for p in access.problems(reach)]


def test_each_missing_piece_is_a_reason_the_worst_first() -> None:
    assert reasons(LOADED) == []
    assert reasons(access.Access(access.NVML_PENDING, access.KMSG_PENDING)) == []
    assert reasons(access.Access(access.NVML_OFF, access.KMSG_OFF)) == []
    assert reasons(access.Access(access.NVML_NO_LIBRARY, access.KMSG_UNREADABLE)) == [
        access.NVML_LIBRARY_NOT_FOUND,
        access.KERNEL_LOG_UNREADABLE,
    ]
    assert reasons(access.Access(access.NVML_NO_DRIVER, access.KMSG_OK)) == [
        access.NVML_DRIVER_NOT_LOADED
    ]
    blind = access.Access(access.NVML_OK, access.KMSG_OK, gpus=0, expected=8)
    assert reasons(blind) == [access.NO_GPUS_VISIBLE]
    # Nothing to expect: none seen is no problem (a CPU node, a node not labelled yet).
    assert reasons(access.Access(access.NVML_OK, access.KMSG_OK, gpus=0, expected=None)) == []
    # Fewer, but some, is the GpuMissing fault, not a matter of access.
    assert reasons(access.Access(access.NVML_OK, access.KMSG_OK, gpus=7, expected=8)) == []


HEALTHY = verdict([ProbeResult("nvml", ran=True, level=True)])
UNRAN = verdict([ProbeResult("nvml", ran=False, level=True, error="NVML unavailable: x")])
FAULTY = verdict(
    [
        ProbeResult(
            "nvml", ran=True, level=True, findings=(ProbeFinding("GpuLost", Severity.P0, "m"),)
        )
    ]
)


def told(seen: Verdict, reach: access.Access) -> tuple[Health, str]:
    said = with_access(seen, access.problems(reach))
    return said.health, said.reason


def test_the_condition_says_why_and_a_fault_stays_the_fault() -> None:
    no_library = access.Access(access.NVML_NO_LIBRARY, access.KMSG_OK, nvml_error="not found")
    assert told(UNRAN, no_library) == (Health.UNKNOWN, access.NVML_LIBRARY_NOT_FOUND)
    message = with_access(UNRAN, access.problems(no_library)).message
    assert "libnvidia-ml.so.1" in message and "NVML unavailable: x" in message
    kmsg = access.Access(access.NVML_OK, access.KMSG_UNREADABLE, gpus=8, expected=8)
    assert told(HEALTHY, kmsg) == (Health.HEALTHY, access.KERNEL_LOG_UNREADABLE)
    blind = access.Access(access.NVML_OK, access.KMSG_OK, gpus=0, expected=8)
    assert told(HEALTHY, blind) == (Health.UNKNOWN, access.NO_GPUS_VISIBLE)
    assert told(FAULTY, kmsg) == (Health.FAULTY, "GpuLost")
    assert with_access(HEALTHY, ()) is HEALTHY


def write_spec(tmp_path: Path, gpus: int) -> Path:
    path = tmp_path / "spec.yaml"
    devices = [{"uuid": f"GPU-{i}", "pciBusId": f"00000000:{0x18 + i:02X}:00.0"}
               for i in range(gpus)]  # fmt: skip
    path.write_text(yaml.safe_dump({"driverVersion": "550.54.15", "devices": devices}))
    return path


def test_the_probe_keeps_nvmls_state_and_why(tmp_path: Path) -> None:
    path = write_spec(tmp_path, 8)
    probe = NvmlProbe(FakeNvml(path), expected_gpus=lambda: 8, thresholds=Thresholds())
    assert probe.state == access.NVML_PENDING
    assert probe.run().ran and probe.state == access.NVML_OK and probe.error == ""
    assert probe.versions.nvml == "12.550.54.15"
    path.unlink()  # the library gone: NVML_ERROR_LIBRARY_NOT_FOUND
    probe._initialized = False  # as after a driver upgrade's reload
    assert not probe.run().ran
    assert probe.state == access.NVML_NO_LIBRARY and "Not Found" in probe.error


def test_no_gpu_visible_is_not_the_gpu_missing_fault(tmp_path: Path) -> None:
    def found(gpus: int) -> list[str]:
        probe = NvmlProbe(
            FakeNvml(write_spec(tmp_path, gpus)), expected_gpus=lambda: 8, thresholds=Thresholds()
        )
        return [f.reason for f in probe.run().findings]

    assert found(0) == []  # agent-access NoGpusVisible instead
    assert found(7) == ["GpuMissing"]


def test_the_loaded_library_is_read_from_the_process_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f1c2a000000-7f1c2a200000 r-xp 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f1c2b000000-7f1c2b400000 r-xp 00000000 08:01 5678 "
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15\n"
        "7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0 [stack]\n"
    )
    assert loaded_library(maps) == "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"
    assert loaded_library(tmp_path / "absent") == ""
    assert loaded_library() == ""  # this process has no NVML


def test_the_expected_gpus_come_from_what_counts_gpus() -> None:
    assert gpus_offered({}, {"nvidia.com/gpu": 8}) == 8
    shared = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    assert gpus_offered(shared, {"nvidia.com/gpu": 32}) == 8
    assert gpus_offered(shared, {"nvidia.com/gpu.shared": 32}) == 8
    assert gpus_offered({"nvidia.com/mig.strategy": "mixed"}, {"nvidia.com/gpu": 2}) is None
    assert gpus_offered({}, {"cpu": 96}) is None
    assert label_counts_gpus({"nvidia.com/mig.strategy": "mixed"})
    assert not label_counts_gpus({"nvidia.com/mig.strategy": "single"})  # MIG devices


def scrape(reach: access.Access) -> str:
    metrics = AgentMetrics()
    metrics.follow_access(lambda: reach)
    return generate_latest(metrics.registry).decode()


def test_the_metrics_say_what_is_reached_and_every_reason() -> None:
    text = scrape(LOADED)
    assert "gpuheal_agent_nvml_up 1.0" in text
    assert (
        'gpuheal_agent_nvml_info{driver="550.54.15",library="/usr/lib/x86_64-linux-gnu/'
        'libnvidia-ml.so.550.54.15",nvml="12.550.54.15"} 1.0'
    ) in text
    assert "gpuheal_agent_gpus_visible 8.0" in text and "gpuheal_agent_gpus_expected 8.0" in text
    assert "gpuheal_agent_kmsg_readable 1.0" in text
    for reason in access.REASONS:
        assert f'gpuheal_agent_access_problem{{reason="{reason}"}} 0.0' in text
    text = scrape(access.Access(access.NVML_NO_LIBRARY, access.KMSG_UNREADABLE))
    assert "gpuheal_agent_nvml_up 0.0" in text and "gpuheal_agent_kmsg_readable 0.0" in text
    assert 'gpuheal_agent_access_problem{reason="NvmlLibraryNotFound"} 1.0' in text
    assert 'gpuheal_agent_access_problem{reason="KernelLogUnreadable"} 1.0' in text
    assert "gpuheal_agent_gpus_visible" not in text and "gpuheal_agent_nvml_info{" not in text
    text = scrape(access.Access(access.NVML_OFF, access.KMSG_OFF))
    assert "gpuheal_agent_nvml_up" not in text and "gpuheal_agent_kmsg_readable" not in text


def gpu_node(name: str, value: str | None, *, condition: bool = True) -> NodeJson:
    annotations = {AGENT_ACCESS: value} if value is not None else {}
    conditions = [{"type": "GPUHealthy", "status": "Unknown"}] if condition else []
    return msgspec.convert(
        {
            "metadata": {
                "name": name,
                "labels": {"nvidia.com/gpu.present": "true"},
                "annotations": annotations,
            },
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}, *conditions],
                "capacity": {"nvidia.com/gpu": "8"},
                "allocatable": {"nvidia.com/gpu": "8"},
            },
        },
        NodeJson,
    )


def test_status_lists_the_agents_that_cannot_see_and_the_nodes_without_one() -> None:
    nodes = [
        gpu_node("ip-10-0-1-10.ec2.internal", access.encode(LOADED)),
        gpu_node("ip-10-0-1-11.ec2.internal", "nvml=library-not-found;gpus=?/8;kmsg=ok"),
        gpu_node("ip-10-0-1-12.ec2.internal", None, condition=False),
        gpu_node("ip-10-0-1-13.ec2.internal", "garbage"),
    ]
    assert agent_access(nodes[0]) is None and agent_access(nodes[3]) is None
    report = fleet_status(Snapshot(nodes=nodes, pods=[], faults=[]), Config(), _NOW)
    assert report.data()["agentAccess"] == [
        {
            "node": "ip-10-0-1-11.ec2.internal",
            "problems": [access.NVML_LIBRARY_NOT_FOUND],
            "reach": "NVML library-not-found; kernel log ok",
        },
        {"node": "ip-10-0-1-12.ec2.internal", "problems": [NO_AGENT], "reach": ""},
    ]
