"""Xids as NVIDIA defines them, through a real agent process on a fake GPU node of the
real control plane: the kernel lines are the driver's own shapes (from NVSentinel's
public test data), written as /dev/kmsg records."""

from __future__ import annotations

import re
import urllib.request

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal.model import FAULT_REASON, FAULT_SEVERITY, STATUS, XID_ERRORS
from gpuheal.sim.agent import AgentProcess
from gpuheal.xid import VERSION
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import StartAgent, node_annotations

pytestmark = pytest.mark.timeout(240)

# The fake NVML's GPU 0 is at PCI 0000:18:00 (gpuheal/sim/agent.py::gpu_spec).
GPU0, GPU1 = "PCI:0000:18:00", "PCI:0000:19:00"


def metrics(agent: AgentProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def rounds_pass(agent: AgentProcess, n: int) -> None:
    start = agent.metric("gpuheal_agent_rounds_total")
    wait_for(f"{n} rounds", lambda: agent.metric("gpuheal_agent_rounds_total") >= start + n)


APPLICATION_LINES = [
    f"NVRM: Xid ({GPU0}): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
    f"NVRM: Xid ({GPU0}): 31, pid=2280636, name=train.3, Ch 0000000d, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_e4000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    f"NVRM: Xid ({GPU0}): 43, pid=2280636, name=train.3, Ch 00000008",
    f"NVRM: Xid ({GPU1}): 45, pid=2280636, name=train.3, Ch 00000008",
    f"NVRM: Xid ({GPU0}): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked for remapping, reset gpu to activate.",
    f"NVRM: Xid ({GPU0}): 92, pid='<unknown>', name=<unknown>, High single-bit ECC error rate",
    # NVLink5 by NVIDIA's decode sheet: RLW_REMAP with Error Status 0x100 is IGNORE.
    f"NVRM: Xid ({GPU1}): 145, RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000100 0x00000000 0x00000000 0x00000000 0x00000000)",
    # Xid 74 with only bits NVIDIA's workflow says to ignore (first register bit 0).
    f"NVRM: Xid ({GPU1}): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 2(0x1, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
]


def test_application_and_ignorable_xids_never_make_the_node_faulty_and_a_gpu_fault_does(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = start_agent(node, {"failRounds": 2, "healthyRounds": 2, "intervalSeconds": 0.2})
    uuid0 = agent.spec["devices"][0]["uuid"]
    for line in APPLICATION_LINES:
        agent.kernel(line)
    wait_for("every line read", lambda: agent.metric("gpuheal_agent_kmsg_records_total") >= 8)
    rounds_pass(agent, 10)  # five times failRounds: a fault would have been reported
    assert STATUS not in node_annotations(kube, node)
    assert node_annotations(kube, node).get(XID_ERRORS) == "0"  # no GPU error for the gate
    text = metrics(agent)
    assert sample(text, "gpuheal_agent_application_xid_total", gpu=uuid0, xid="13") == 1
    assert sample(text, "gpuheal_agent_application_xid_total", gpu=uuid0, xid="31") == 1
    assert sample(text, "gpuheal_agent_xid_total", xid="43") == 1  # counted, not a fault
    assert sample(text, "gpuheal_agent_xid_catalogue_info", version=VERSION) == 1

    agent.kernel(
        f"NVRM: Xid ({GPU0}): 95, pid='<unknown>', name=<unknown>, Uncontained: SM MMU. RST: Yes, D-RST: No"
    )
    wait_for("Xid 95 reported", lambda: node_annotations(kube, node).get(STATUS) == "faulty")
    found = node_annotations(kube, node)
    assert (found[FAULT_REASON], found[FAULT_SEVERITY]) == ("EccUncontained95", "P0")
    assert found[XID_ERRORS] == "1"


def test_application_xids_on_one_gpu_become_a_fault_only_as_a_rate(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    (node,) = fake_gpu_nodes(1)
    config = {"failRounds": 2, "intervalSeconds": 0.2, "applicationXidsPerGpu": 3}
    agent = start_agent(node, config)
    uuid0 = agent.spec["devices"][0]["uuid"]
    line = f"NVRM: Xid ({GPU0}): 13, pid=4242, name=python3, Graphics Exception: ESR 0x50df30=0x107000e"
    for _ in range(2):
        agent.kernel(line)
    rounds_pass(agent, 6)
    assert STATUS not in node_annotations(kube, node)  # two on one GPU: the application's
    agent.kernel(line)
    wait_for("the rate reported", lambda: node_annotations(kube, node).get(STATUS) == "faulty")
    found = node_annotations(kube, node)
    assert (found[FAULT_REASON], found[FAULT_SEVERITY]) == ("RepeatedApplicationXids", "P1")
    assert found["gpuheal.io/fault-devices"] == uuid0


def test_an_xid_the_catalogue_does_not_know_is_a_watched_fault_naming_the_catalogue(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = start_agent(node, {"failRounds": 2, "intervalSeconds": 0.2})
    agent.kernel(f"NVRM: Xid ({GPU0}): 250, pid='<unknown>', name=<unknown>, something new")
    wait_for("reported", lambda: node_annotations(kube, node).get(STATUS) == "faulty")
    found = node_annotations(kube, node)
    assert (found[FAULT_REASON], found[FAULT_SEVERITY]) == ("XidUnknown250", "P1")
    assert sample(metrics(agent), "gpuheal_agent_xid_uncatalogued_total", xid="250") == 1
    status = kube.get(Node, node).status
    assert status is not None
    condition = next(c for c in status.conditions or [] if c.type == "GPUHealthy")
    assert VERSION in (condition.message or "")  # the finding's message names the catalogue
