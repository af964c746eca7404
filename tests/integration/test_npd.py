"""The real node-problem-detector (testenv/npd) with the monitor config the chart ships,
against the local control plane: NPD reads NVIDIA kernel lines from a log file, sets
its conditions on a fake GPU node, and the controller (with the chart's NPD condition
rules) quarantines the node for an Xid 79 exactly once and never for an application
Xid, as the agent's classification says."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from gpuheal.sim import ControlPlane
from gpuheal.sim.npd import USER, NodeProblemDetector
from gpuheal.sim.workloads import apply
from tests.helpers import FakeNodes, wait_for
from tests.integration.chart import render
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    our_taint,
    record_of,
)

pytestmark = pytest.mark.timeout(240)

XID_13 = (
    "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python3, Graphics SM Warp Exception "
    "on (GPC 1, TPC 3, SM 0): Out Of Range Address"
)
XID_31 = (
    "NVRM: Xid (PCI:0000:3b:00): 31, pid=4242, name=python3, Ch 00000010, intr 10000000. "
    "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1e_4a000000"
)
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."
XID_48 = "NVRM: Xid (PCI:0000:86:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."
SXID_NON_FATAL = (
    "nvidia-nvswitch2: SXid (PCI:0000:c5:00.0): 11012, Non-fatal, Link 28 Single bit ECC error"
)


def shipped(control_plane: ControlPlane) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What the chart renders with nodeProblemDetector on: the monitor config in its
    ConfigMap, and the controller config's conditions rules."""
    sets = {
        "nodeProblemDetector.conditions": "true",
        "nodeProblemDetector.configMap.enabled": "true",
    }
    objects = render(control_plane, "gh", "gpuheal-system", sets=sets)
    maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    monitor = json.loads(maps["gh-npd-nvidia-monitor"]["data"]["nvidia-monitor.json"])
    config = yaml.safe_load(maps["gh-controller"]["data"]["config.yaml"])
    return monitor, config["conditions"]


def told(kube: Client, node: str, reason: str) -> int:
    """How many times NPD told `reason` about the node: its recorder folds a repeat of
    the same Event into one object's count."""
    return sum(e.count or 1 for e in events_for(kube, node, reason))


def condition(kube: Client, node: str, type_: str) -> Any:
    status = kube.get(Node, node).status
    return next((c for c in (status.conditions if status else None) or [] if c.type == type_), None)


def wait_started(kube: Client, npd: NodeProblemDetector) -> None:
    """Until NPD has written its conditions, False, from the monitor's defaults."""

    def started() -> bool:
        assert npd.running(), npd.log()[-3000:]
        return condition(kube, npd.node, "NVSwitchSXid") is not None

    wait_for(f"NPD's conditions on {npd.node}", started, timeout_s=90)
    for type_ in ("NVIDIAXid", "NVIDIAXidDecoded", "NVSwitchSXid"):
        assert condition(kube, npd.node, type_).status == "False", npd.log()[-3000:]


@pytest.fixture
def npd_identity(kube: Client) -> Iterator[str]:
    """The node-problem-detector identity bound to the API server's own
    system:node-problem-detector ClusterRole (what NPD's DaemonSet is given)."""
    name = f"{USER}-test"
    apply(
        kube,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:node-problem-detector",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        },
    )
    yield USER
    kube.delete(ClusterRoleBinding, name)


def test_npd_conditions_quarantine_an_xid_79_once_and_an_application_xid_never(
    kube: Client,
    control_plane: ControlPlane,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    npd_identity: str,
    tmp_path: Path,
) -> None:
    binary = control_plane.config.binaries.node_problem_detector
    assert binary.is_file(), f"{binary} missing: run `make testenv` (testenv/npd/build.sh)"
    (node,) = fake_gpu_nodes(1, labels=pool)
    monitor, rules = shipped(control_plane)
    assert [r["type"] for r in rules] == [
        "GPUHealthy",
        "NVIDIAXid",
        "NVIDIAXidDecoded",
        "NVSwitchSXid",
    ]
    start_controller(controller_config(pool, conditions=rules))
    npd = NodeProblemDetector(tmp_path, control_plane.kubeconfig_for(npd_identity), node, monitor)
    npd.start()
    try:
        wait_started(kube, npd)

        # Application Xids and a non-fatal SXid: NPD reads them (an Event each) and sets
        # no condition; nothing is quarantined.
        for line in (XID_13, XID_31, SXID_NON_FATAL):
            npd.kernel(line)
        wait_for(
            "NPD's Events of the application Xids",
            lambda: (
                told(kube, node, "NVIDIAXidError") == 2
                and told(kube, node, "NVSwitchSXidError") == 1
            ),
        )
        time.sleep(3)  # two heartbeats of NPD's, each a Node update the controller looks at
        assert condition(kube, node, "NVIDIAXid").status == "False"
        assert condition(kube, node, "NVSwitchSXid").status == "False"
        assert faults_of(kube, node) == []
        assert our_taint(kube, node) is None

        # An Xid 79 in the same log: NPD's condition, gpuheal's fault, once.
        npd.kernel(XID_79)
        wait_for("NVIDIAXid True", lambda: condition(kube, node, "NVIDIAXid").status == "True")
        cond = condition(kube, node, "NVIDIAXid")
        assert cond.reason == "NVIDIAXidNodeFault" and cond.message == XID_79
        wait_for("the taint", lambda: our_taint(kube, node) is not None)
        record = record_of(kube, node)
        assert record.spec["reason"] == "XidCritical79"
        assert record.spec["severity"] == "P0"
        assert record.spec["source"] == "node-condition/NVIDIAXid"
        assert record.spec["devices"] == ["0000:3b:00"]
        assert our_taint(kube, node) == record.spec["faultID"]

        # More lines and heartbeats: the condition keeps its first line, no second fault.
        npd.kernel(XID_48)
        npd.kernel(XID_13)
        wait_for("NPD's Events", lambda: told(kube, node, "NVIDIAXidError") == 5)
        time.sleep(5)
        assert condition(kube, node, "NVIDIAXid").message == XID_79
        assert len(faults_of(kube, node)) == 1
        spec = kube.get(Node, node).spec
        assert spec is not None
        assert [t.key for t in spec.taints or []].count("gpuheal.io/gpu-fault") == 1
        assert len(events_for(kube, node, "GPUFaultDetected", at_least=1)) == 1
        assert len(events_for(kube, node, "GPUFaultQuarantined", at_least=1)) == 1
        assert npd.running(), npd.log()[-3000:]
    finally:
        npd.stop()
        print(f"--- NPD log (tail) ---\n{npd.log()[-4000:]}")


XID_154_NONE = (
    "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) "
    "to 0x0 (None)"
)
SXID_12028 = [
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine instance 32 Sub-engine instance 00",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Data {0x00000000, 0x00000000, 0x00000000, 0x00000000}",
]
OFF_THE_BUS_RECORDS = [
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:2330) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
]


def test_npd_decoded_xids_sxids_and_a_gpu_off_the_bus_read_as_the_agent_reads_them(
    kube: Client,
    control_plane: ControlPlane,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    npd_identity: str,
    tmp_path: Path,
) -> None:
    """NPD's Go regexps on the other conditions: an Xid 154 to recovery action None
    sets NVIDIAXidDecoded and is no fault (NVIDIA: nothing to do); an SXid the guide
    makes fatal though its line says Non-fatal (12028) is one, on its NVSwitch; the
    driver's "fallen off the bus" in three records is one, on the GPU its first names."""
    switch_node, bus_node = fake_gpu_nodes(2, labels=pool)
    monitor, rules = shipped(control_plane)
    start_controller(controller_config(pool, conditions=rules))
    kubeconfig = control_plane.kubeconfig_for(npd_identity)
    on_switch = NodeProblemDetector(tmp_path, kubeconfig, switch_node, monitor).start()
    off_bus = NodeProblemDetector(tmp_path, kubeconfig, bus_node, monitor).start()
    try:
        for npd in (on_switch, off_bus):
            wait_started(kube, npd)

        on_switch.kernel(XID_154_NONE)
        wait_for(
            "NVIDIAXidDecoded True",
            lambda: condition(kube, switch_node, "NVIDIAXidDecoded").status == "True",
        )
        assert condition(kube, switch_node, "NVIDIAXidDecoded").message == XID_154_NONE
        time.sleep(3)
        assert faults_of(kube, switch_node) == []
        assert our_taint(kube, switch_node) is None

        for line in SXID_12028:
            on_switch.kernel(line)
        wait_for("the SXid's taint", lambda: our_taint(kube, switch_node) is not None)
        assert condition(kube, switch_node, "NVSwitchSXid").message == SXID_12028[0]
        record = record_of(kube, switch_node)
        assert (record.spec["reason"], record.spec["severity"]) == ("NvswitchFatal12028", "P0")
        assert record.spec["source"] == "node-condition/NVSwitchSXid"
        assert record.spec["devices"] == ["nvidia-nvswitch0"]

        for line in OFF_THE_BUS_RECORDS:
            off_bus.kernel(line)
        wait_for("the off-the-bus taint", lambda: our_taint(kube, bus_node) is not None)
        assert condition(kube, bus_node, "NVIDIAXid").message == "\n".join(OFF_THE_BUS_RECORDS)
        record = record_of(kube, bus_node)
        assert (record.spec["reason"], record.spec["severity"]) == ("GpuFellOffBus", "P0")
        assert record.spec["devices"] == ["0000:b3:00"]
        time.sleep(3)
        assert len(faults_of(kube, switch_node)) == len(faults_of(kube, bus_node)) == 1
        assert on_switch.running() and off_bus.running()
    finally:
        for npd in (on_switch, off_bus):
            npd.stop()
            print(f"--- {npd.node} NPD log (tail) ---\n{npd.log()[-3000:]}")
