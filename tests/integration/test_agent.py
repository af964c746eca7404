"""Agent processes on fake GPU nodes of the real control plane."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal import values
from gpuheal.agent.facts import FACT_KEYS
from gpuheal.cli import main
from gpuheal.model import (
    COUNTERS_SINCE,
    CUDA_VERSION,
    DRIVER_VERSION,
    ECC_ERRORS,
    FAULT_DEVICES,
    FAULT_ID,
    FAULT_REASON,
    FAULT_SEVERITY,
    GPU_PROCESSES,
    HANDLED_FAULT_ID,
    LAST_GPU_ERROR,
    STATUS,
    VBIOS_VERSION,
    XID_ERRORS,
)
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.ibsysfs import hgx_node
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartAgent,
    StartController,
    controller_config,
    gpu_healthy,
    node_annotations,
    our_taint,
)

pytestmark = pytest.mark.timeout(240)


def test_injected_faults_are_reported_after_n_rounds_kept_stable_and_cleared(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    nodes = fake_gpu_nodes(3)
    agents = [start_agent(n, {"failRounds": 3, "healthyRounds": 3}) for n in nodes]

    def all_healthy() -> bool:
        return all(gpu_healthy(kube, n)[:2] == ("True", "GPUsHealthy") for n in nodes)

    wait_for("GPUHealthy=True everywhere", all_healthy)

    sick, agent = nodes[1], agents[1]
    agent.set_device(5, eccUncorrectedVolatile=3)
    wait_for("the fault reported", lambda: node_annotations(kube, sick).get(STATUS) == "faulty")
    assert '"failing_rounds": 3' in agent.log()  # after exactly 3 failing rounds
    assert gpu_healthy(kube, sick)[:2] == ("False", "EccUncorrectable")
    fault_id = node_annotations(kube, sick)[FAULT_ID]
    assert (
        node_annotations(kube, sick)["gpuheal.io/fault-devices"] == agent.spec["devices"][5]["uuid"]
    )

    writes = agent.metric("gpuheal_agent_reports_total")
    rounds = agent.metric("gpuheal_agent_rounds_total")
    wait_for("50 more rounds", lambda: agent.metric("gpuheal_agent_rounds_total") >= rounds + 50)
    assert node_annotations(kube, sick)[FAULT_ID] == fault_id  # stable while faulty
    assert agent.metric("gpuheal_agent_reports_total") == writes  # no write when nothing changed

    # The controller marks it handled; recovery must keep that history.
    kube.patch(Node, sick, {"metadata": {"annotations": {HANDLED_FAULT_ID: fault_id}}})
    agent.set_device(5, eccUncorrectedVolatile=0)
    wait_for("the fault cleared", lambda: STATUS not in node_annotations(kube, sick))
    assert gpu_healthy(kube, sick)[:2] == ("True", "GPUsHealthy")
    assert node_annotations(kube, sick)[HANDLED_FAULT_ID] == fault_id
    for node in (nodes[0], nodes[2]):
        assert STATUS not in node_annotations(kube, node)  # neighbours untouched


def test_a_restarted_agent_does_not_report_old_kernel_lines_again(
    control_plane: ControlPlane, kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    (node,) = fake_gpu_nodes(1)
    config = {"failRounds": 2, "healthyRounds": 2, "xidHoldSeconds": 1}
    agent = start_agent(node, config)
    agent.kernel("NVRM: Xid (PCI:0000:1a:00): 79, pid=<unknown>, GPU has fallen off the bus.")
    wait_for("the Xid reported", lambda: gpu_healthy(kube, node)[:2] == ("False", "XidCritical79"))
    wait_for("cleared after the hold", lambda: STATUS not in node_annotations(kube, node))
    agent.stop()

    # Same state directory and kernel log, same boot: only new lines may count.
    again = AgentProcess(agent.dir.parent, control_plane.kubeconfig, node, config).start()
    try:
        time.sleep(2)  # ten rounds
        assert STATUS not in node_annotations(kube, node)
        assert gpu_healthy(kube, node)[:2] == ("True", "GPUsHealthy")
        assert again.metric("gpuheal_agent_xid_total") == 0
    finally:
        again.stop()


def test_a_hung_nvml_call_is_unknown_then_an_unresponsive_driver(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = start_agent(node, {"nvmlTimeoutSeconds": 0.3, "driverHangSeconds": 4})
    wait_for("healthy", lambda: gpu_healthy(kube, node)[0] == "True")
    agent.set_device(0, hangSeconds=60)
    wait_for("Unknown", lambda: gpu_healthy(kube, node)[:2] == ("Unknown", "DriverUnresponsive"))
    assert STATUS not in node_annotations(kube, node)  # Unknown is not Unhealthy
    assert agent.metric('gpuheal_agent_probe_failures_total{probe="nvml"}') >= 1
    # Still hung after driverHangSeconds: the driver answers nothing, a node fault.
    wait_for("faulty", lambda: node_annotations(kube, node).get(STATUS) == "faulty")
    assert gpu_healthy(kube, node)[:2] == ("False", "DriverUnresponsive")


def test_degradation_faults_and_warnings_as_nvidia_documents_them(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = start_agent(node, {})
    wait_for("healthy", lambda: gpu_healthy(kube, node)[:2] == ("True", "GPUsHealthy"))
    uuids = [d["uuid"] for d in agent.spec["devices"]]

    def warned(reason: str, gpu: str) -> float:
        return agent.metric(f'gpuheal_agent_warning{{device="{gpu}",reason="{reason}"}}')

    # A replay burst above DCGM's limit and one hardware slowdown: warnings, never a fault.
    agent.set_device(1, pcie={"replays": 5000}, clocksEventReasons=0x8)
    agent.set_device(2, persistenceMode=False, vbios="96.00.61.00.01")
    wait_for("warned", lambda: warned("PcieReplayRate", uuids[1]) == 1)
    assert warned("HwSlowdown", uuids[1]) == warned("PersistenceModeOff", uuids[2]) == 1
    assert warned("VbiosMismatch", uuids[2]) == 1
    time.sleep(2)  # many rounds (and far more than failRounds)
    assert gpu_healthy(kube, node)[:2] == ("True", "GPUsHealthy")
    assert STATUS not in node_annotations(kube, node)
    assert '"msg": "warning"' in agent.log()

    # A GPU whose NVSwitch fabric registration failed runs no CUDA work: a P1 fault.
    agent.set_device(4, fabric={"state": 3, "status": 999})
    wait_for("faulty", lambda: node_annotations(kube, node).get(STATUS) == "faulty")
    found = node_annotations(kube, node)
    assert (found[FAULT_REASON], found[FAULT_SEVERITY]) == ("FabricRegistrationFailed", "P1")
    assert found[FAULT_DEVICES] == uuids[4]
    # The warnings that cleared are gone from the gauge.
    agent.set_device(1, pcie={"replays": 5000}, clocksEventReasons=0)
    wait_for("cleared", lambda: warned("HwSlowdown", uuids[1]) == 0)


def test_the_agent_survives_an_api_outage_and_reports_afterwards(
    control_plane: ControlPlane, kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = start_agent(node, {"failRounds": 2})
    wait_for("healthy", lambda: gpu_healthy(kube, node)[0] == "True")
    apiserver = control_plane.pids["kube-apiserver"]
    os.kill(apiserver, signal.SIGSTOP)
    try:
        agent.set_device(2, lost=True)
        time.sleep(6)  # the fault is found while nobody can be told
        assert agent.component.exit_code() is None  # still running
    finally:
        os.kill(apiserver, signal.SIGCONT)
    wait_for(
        "reported after the outage",
        lambda: gpu_healthy(kube, node)[:2] == ("False", "GpuLost"),
        timeout_s=60,
    )
    assert agent.metric("gpuheal_agent_report_failures_total") >= 1


def test_an_injected_xid_79_is_quarantined_end_to_end(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_agent: StartAgent,
    start_controller: StartController,
) -> None:
    bad, good = fake_gpu_nodes(2, labels=pool)
    start_controller(controller_config(pool))
    agents = {n: start_agent(n) for n in (bad, good)}
    agents[bad].kernel(
        "NVRM: Xid (PCI:0000:1c:00): 79, pid=2843, name=python3, GPU has fallen off the bus."
    )
    wait_for("the node quarantined", lambda: our_taint(kube, bad) is not None, timeout_s=30)
    reported = node_annotations(kube, bad)[FAULT_ID]
    assert our_taint(kube, bad) == values.taint_value(values.fault_id(reported))
    assert our_taint(kube, good) is None


def test_versions_counters_and_gpu_processes_land_on_the_node(
    control_plane: ControlPlane,
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    start_agent: StartAgent,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (node,) = fake_gpu_nodes(1)
    # The host's /proc as the agent sees it: one process in a pod, one outside any.
    uid = "0b9d6c1e-2f3a-4b5c-8d7e-6f5a4b3c2d1e"
    proc = tmp_path / "proc"
    for pid, cgroup in {
        4242: f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{uid.replace('-', '_')}.slice/cri-containerd-{'ab' * 32}.scope\n",
        4243: "0::/system.slice/dcgm.service\n",
    }.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(cgroup)
    agent = start_agent(node, {"procRoot": str(proc), "processReportSeconds": 0.5})
    agent.set_spec(cudaDriverVersion=12040)
    agent.set_device(1, processes=[{"pid": 4242, "usedMemoryMiB": 2048}, {"pid": 4243}])

    def facts() -> dict[str, str]:
        return {k: v for k, v in node_annotations(kube, node).items() if k in FACT_KEYS}

    wait_for("the processes reported", lambda: facts().get(GPU_PROCESSES) == f"4242@{uid},4243@")
    reported = facts()
    assert reported[DRIVER_VERSION] == "550.54.15"
    assert reported[CUDA_VERSION] == "12.4"
    assert reported[VBIOS_VERSION] == "96.00.89.00.01"  # every GPU's, the stand-in's default
    assert (reported[XID_ERRORS], reported[ECC_ERRORS]) == ("0", "0")
    assert LAST_GPU_ERROR not in reported
    since = dt.datetime.fromisoformat(reported[COUNTERS_SINCE])
    assert abs((dt.datetime.now(dt.UTC) - since).total_seconds()) < 120

    agent.kernel("NVRM: Xid (PCI:0000:1a:00): 79, pid=<unknown>, GPU has fallen off the bus.")
    agent.set_device(2, eccUncorrectedVolatile=2)
    wait_for(
        "the counters reported",
        lambda: (facts().get(XID_ERRORS), facts().get(ECC_ERRORS)) == ("1", "2"),
    )
    assert dt.datetime.fromisoformat(facts()[LAST_GPU_ERROR]) >= since

    # The audit reads the agent's report: the pod UID is of no pod on the node.
    capsys.readouterr()
    selector = f"kubernetes.io/hostname={node}"
    code = main(
        ["audit", "-o", "json", "--kubeconfig", str(control_plane.kubeconfig), "-l", selector]
    )
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert code == 3
    assert {f["kind"] for f in findings} == {"zombie-process", "host-process"}

    agent.set_device(1, processes=[])
    wait_for("the processes gone", lambda: facts().get(GPU_PROCESSES) == "")


def test_the_node_s_network_faults_and_warnings(
    kube: Client, fake_gpu_nodes: FakeNodes, start_agent: StartAgent, tmp_path: Path
) -> None:
    (node,) = fake_gpu_nodes(1)
    # An HGX node's eight 400 Gb/s rails (and a RoCE port), before the agent starts.
    tree = hgx_node(AgentProcess.dir_for(tmp_path, node) / "sys" / "class" / "infiniband")
    agent = start_agent(
        node, {"ibExpectedHcas": 8, "ibExpectedPorts": 8, "ibExpectedRateGbps": 400}
    )
    wait_for("healthy", lambda: gpu_healthy(kube, node)[:2] == ("True", "GPUsHealthy"))

    # One flap and a transmit timeout the driver recovers from: said, never a fault.
    tree.set_counter("mlx5_3", 1, "link_downed", 1)
    agent.kernel("NETDEV WATCHDOG: ib3 (mlx5_core): transmit queue 12 timed out 5376 ms")
    wait_for(
        "warned",
        lambda: agent.metric('gpuheal_agent_warning{device="mlx5_3/1",reason="IbPortFlap"}') == 1,
    )
    wait_for(
        "counted",
        lambda: agent.metric('gpuheal_agent_nic_errors_total{reason="NicTxTimeout"}') == 1,
    )
    time.sleep(1)
    assert STATUS not in node_annotations(kube, node)

    # The firmware's health counter stopped on one HCA: the node is held.
    agent.kernel(
        "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised"
        " - reached miss count"
    )
    wait_for("faulty", lambda: node_annotations(kube, node).get(STATUS) == "faulty")
    found = node_annotations(kube, node)
    assert (found[FAULT_REASON], found[FAULT_SEVERITY]) == ("NicHealthCompromised", "P1")
    assert found[FAULT_DEVICES] == "0000:41:00.0"
