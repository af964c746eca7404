"""The nvidia-smi probe over the NVML stand-in's real `nvidia-smi` binary (testenv/nvml,
`make nvml`): each shape the real tool prints (a lost GPU, a field it cannot read, no
handle, fewer GPUs, a hang) is the verdict docs/agent.md documents, and each finding
names the GPU, so a repair can target it. Then the agent itself with NVML off: the
GPU's UUID reaches the Node's fault-devices."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client

from gpuheal.agent.findings import Health, Verdict, verdict
from gpuheal.agent.smi import SmiProbe
from gpuheal.model import FAULT_DEVICES, FAULT_REASON, FAULT_SEVERITY, STATUS, Severity
from gpuheal.sim.agent import AgentProcess, gpu_spec
from gpuheal.sim.binaries import NVML_SPEC_ENV, NvmlStandIn, default_nvml
from gpuheal.sim.controlplane import ControlPlane
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import StartAgent, gpu_healthy, node_annotations

pytestmark = pytest.mark.timeout(240)

Spec = dict[str, Any]


@pytest.fixture(scope="module")
def nvml() -> NvmlStandIn:
    return default_nvml().require()


def _lost(d: Spec) -> None:
    d["lost"] = True  # every NVML call: GPU_IS_LOST, the handle's too


def _fields_lost(d: Spec) -> None:
    # The handle answers; the GPU's readings say it is gone: "[GPU is lost]" fields.
    d["errors"] = {"nvmlDeviceGetUUID": "GPU_IS_LOST", "nvmlDeviceGetPciInfo": "GPU_IS_LOST"}


def _na(d: Spec) -> None:
    d["errors"] = {"nvmlDeviceGetUUID": "NOT_SUPPORTED"}  # "[N/A]"


def _no_handle(d: Spec) -> None:
    d["errors"] = {"nvmlDeviceGetHandleByIndex": "UNKNOWN"}


@pytest.mark.parametrize(
    ("change", "reason", "said"),
    [
        (_lost, "GpuLost", "GPU ({uuid}, 0000:1B:00.0): Unable to determine the device handle: "
                           "GPU is lost. Reboot the system to recover this GPU"),
        (_fields_lost, "GpuLost", "GPU 3 ({uuid}): uuid [GPU is lost], pci.bus_id [GPU is lost]"),
        (_na, "GpuLost", "GPU 3 ({uuid}, 00000000:1B:00.0): uuid [N/A]"),
        (_no_handle, "GpuLost", "GPU ({uuid}, 0000:1B:00.0): Unable to determine the device "
                                "handle: Unknown Error"),
    ],
)  # fmt: skip
def test_each_shape_of_a_broken_gpu_is_faulty_and_names_it(
    nvml: NvmlStandIn,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[Spec], None],
    reason: str,
    said: str,
) -> None:
    document = gpu_spec("smi-node")
    probe = _probe(nvml, tmp_path, monkeypatch, document)
    assert _round(probe).health is Health.HEALTHY  # the probe sees every GPU's row first
    gpu = document["devices"][3]
    change(gpu)
    _write(tmp_path, document)
    seen = _round(probe)
    assert (seen.health, seen.reason, seen.severity) == (Health.FAULTY, reason, Severity.P0)
    assert seen.devices == (gpu["uuid"],)  # what a reset (`nvidia-smi -r -i`) takes
    assert seen.message == f"nvidia-smi: {said.format(uuid=gpu['uuid'])}"


def test_fewer_gpus_than_the_node_has_names_the_gpu_gone(
    nvml: NvmlStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = gpu_spec("smi-node")
    probe = _probe(nvml, tmp_path, monkeypatch, document)
    assert _round(probe).health is Health.HEALTHY
    document["visible"] = 7  # the last GPU fell off: nvidia-smi lists 0..6
    _write(tmp_path, document)
    seen = _round(probe)
    gone = document["devices"][7]["uuid"]
    assert (seen.health, seen.reason, seen.devices) == (Health.FAULTY, "GpuMissing", (gone,))
    assert seen.message == f"8 GPUs expected, 7 visible to nvidia-smi; gone: {gone}"


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"visible": 0}, "nvidia-smi listed no GPU (exit 6): No devices were found"),
        ({"initError": True}, "nvidia-smi listed no GPU (exit 9): NVIDIA-SMI has failed"),
    ],
)
def test_no_gpu_or_no_driver_vouches_for_nothing(
    nvml: NvmlStandIn,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    changes: Spec,
    error: str,
) -> None:
    document = gpu_spec("smi-node")
    document.update(changes)
    seen = _round(_probe(nvml, tmp_path, monkeypatch, document))
    assert (seen.health, seen.reason) == (Health.UNKNOWN, "ProbesFailed")
    assert seen.message.startswith(f"smi: {error}")


def test_a_hung_gpu_is_bounded_by_the_timeout_and_unknown(
    nvml: NvmlStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = gpu_spec("smi-node")
    document["devices"][2]["hangSeconds"] = 60  # its driver call blocks: nvidia-smi hangs
    probe = _probe(nvml, tmp_path, monkeypatch, document, timeout_s=0.5)
    started = time.monotonic()
    seen = _round(probe)
    assert time.monotonic() - started < 3
    assert (seen.health, seen.reason) == (Health.UNKNOWN, "DriverUnresponsive")
    assert seen.message == f"smi: {nvml.smi} did not answer within 0.5s; killed"


def _probe(
    nvml: NvmlStandIn,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    document: Spec,
    timeout_s: float = 10,
) -> SmiProbe:
    monkeypatch.setenv(NVML_SPEC_ENV, str(_write(tmp_path, document)))
    expected = len(document["devices"])
    return SmiProbe([str(nvml.smi)], timeout_s, expected_gpus=lambda: expected)


def _write(tmp_path: Path, document: Spec) -> Path:
    path = tmp_path / "spec.yaml"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(document))
    tmp.replace(path)
    return path


def _round(probe: SmiProbe) -> Verdict:
    return verdict([probe.run()])


# -- the agent, NVML off: nvidia-smi alone vouches for the GPUs ------------------

SMI_ONLY = {"nvmlEnabled": False, "smiEnabled": True, "smiTimeoutSeconds": 1, "failRounds": 2}


def test_the_agent_reports_a_hang_as_unknown_and_a_lost_gpu_by_its_uuid(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = start_agent(node, SMI_ONLY)
    wait_for("healthy", lambda: gpu_healthy(kube, node)[:2] == ("True", "GPUsHealthy"))

    agent.set_device(2, hangSeconds=60)
    wait_for("unknown", lambda: gpu_healthy(kube, node)[:2] == ("Unknown", "DriverUnresponsive"))
    assert "did not answer within 1s" in gpu_healthy(kube, node)[2]
    agent.set_device(2, hangSeconds=0)
    wait_for("healthy again", lambda: gpu_healthy(kube, node)[0] == "True")

    agent.set_device(3, lost=True)
    wait_for("reported", lambda: node_annotations(kube, node).get(STATUS) == "faulty")
    found = node_annotations(kube, node)
    assert (found[FAULT_REASON], found[FAULT_SEVERITY]) == ("GpuLost", "P0")
    assert found[FAULT_DEVICES] == agent.spec["devices"][3]["uuid"]


def test_a_gpu_lost_before_the_agent_started_is_named_by_the_kernel_log(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    control_plane: ControlPlane,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = AgentProcess(tmp_path, control_plane.kubeconfig, node, SMI_ONLY)
    agents.append(agent)
    gpu = agent.spec["devices"][3]
    agent.set_device(3, lost=True)  # nvidia-smi never printed its UUID to this agent
    agent.kernel(f"NVRM: GPU at PCI:0000:1b:00: {gpu['uuid']}", priority=6)  # at driver load
    agent.start()
    # A round may run before the follower read that line: the fault's devices grow.
    wait_for("named", lambda: node_annotations(kube, node).get(FAULT_DEVICES) == gpu["uuid"])
    assert node_annotations(kube, node)[FAULT_REASON] == "GpuLost"
