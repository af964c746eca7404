"""The agent's production NVML path end to end: the real pynvml over the NVML stand-in
(testenv/nvml, `make nvml`: libnvidia-ml.so.1 found through LD_LIBRARY_PATH), on a fake
GPU node of the real control plane — a GPU lost mid-run, an Xid from NVML's event set
with the kernel log off, and a node without the library at all."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from lightkube import Client

from gpuheal.model import AGENT_ACCESS, FAULT_DEVICES, FAULT_REASON, FAULT_SEVERITY, STATUS
from gpuheal.policy import access
from gpuheal.xid import classify
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import StartAgent, gpu_healthy, node_annotations

pytestmark = pytest.mark.timeout(240)


def test_a_gpu_lost_mid_run_is_a_gpu_lost_fault_of_that_gpu(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = start_agent(node, {"failRounds": 2})
    wait_for("healthy", lambda: gpu_healthy(kube, node)[:2] == ("True", "GPUsHealthy"))
    value = node_annotations(kube, node)[AGENT_ACCESS]
    # The stand-in is the library the agent's dynamic loader mapped, by NVML's own name.
    assert f"library={agent.nvml.library}" in value and value.startswith("nvml=ok;gpus=8/8")

    agent.set_device(3, lost=True)  # every NVML call on GPU 3: NVML_ERROR_GPU_IS_LOST
    wait_for("reported", lambda: node_annotations(kube, node).get(STATUS) == "faulty")
    found = node_annotations(kube, node)
    assert (found[FAULT_REASON], found[FAULT_SEVERITY]) == ("GpuLost", "P0")
    # NVML answers nothing of it now; the probe names it by the UUID it answered before.
    assert found[FAULT_DEVICES] == agent.spec["devices"][3]["uuid"]
    assert gpu_healthy(kube, node)[:2] == ("False", "GpuLost")


def test_a_lost_gpu_that_still_answers_its_uuid_is_named_by_it(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = start_agent(node, {"failRounds": 2})
    wait_for("healthy", lambda: gpu_healthy(kube, node)[0] == "True")
    # The handle and UUID still answer; the health queries say the GPU is gone.
    agent.set_device(3, errors={"nvmlDeviceGetTotalEccErrors": "GPU_IS_LOST"})
    wait_for("reported", lambda: node_annotations(kube, node).get(STATUS) == "faulty")
    found = node_annotations(kube, node)
    assert found[FAULT_REASON] == "GpuLost"
    assert found[FAULT_DEVICES] == agent.spec["devices"][3]["uuid"]


def test_an_xid_79_from_the_nvml_event_set_reaches_the_node_with_its_gpu(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    (node,) = fake_gpu_nodes(1)
    # No kernel log: the Xid can only come through nvmlEventSetWait.
    agent = start_agent(node, {"kmsgEnabled": False, "failRounds": 2})
    wait_for("healthy", lambda: gpu_healthy(kube, node)[0] == "True")
    assert "kmsg=off" in node_annotations(kube, node)[AGENT_ACCESS]

    agent.set_spec(xidEvents=[{"id": 1, "device": 3, "xid": 79}])
    wait_for("reported", lambda: node_annotations(kube, node).get(STATUS) == "faulty")
    found = node_annotations(kube, node)
    row = classify(79)
    assert (found[FAULT_REASON], found[FAULT_SEVERITY]) == (row.reason, row.severity.value)
    assert found[FAULT_DEVICES] == agent.spec["devices"][3]["uuid"]
    assert agent.metric("gpuheal_agent_kmsg_records_total") == 0


def test_without_the_library_the_agent_runs_and_says_nvml_is_unavailable(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent, tmp_path: Path
) -> None:
    (node,) = fake_gpu_nodes(1)
    empty = tmp_path / "no-nvml"
    empty.mkdir()
    # LD_LIBRARY_PATH without the stand-in (and no driver on this machine): pynvml's
    # dlopen("libnvidia-ml.so.1") fails, as in a container without the driver mounted.
    agent = start_agent(node, {"kmsgEnabled": False}, nvml_lib_dir=empty)
    wait_for(
        "the reason on the condition",
        lambda: gpu_healthy(kube, node)[1] == access.NVML_LIBRARY_NOT_FOUND,
        timeout_s=30,
    )
    state, _, message = gpu_healthy(kube, node)
    assert state == "Unknown"
    assert "NVML unavailable" in message and "libnvidia-ml.so.1" in message
    wait_for(
        "the annotation",
        lambda: (
            node_annotations(kube, node).get(AGENT_ACCESS)
            == "nvml=library-not-found;gpus=?/8;kmsg=off"
        ),
    )
    time.sleep(2)  # rounds go on: still running, still no fault
    assert agent.component.exit_code() is None
    assert STATUS not in node_annotations(kube, node)
    assert agent.metric("gpuheal_agent_nvml_up") == 0
    assert str(agent.nvml.library) not in agent.log()  # never loaded
