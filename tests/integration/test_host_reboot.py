"""A reboot through the node's own systemd (the chart's agent.hostReboot), where no
reboot daemon runs: the agent runs the command the chart renders,
`nsenter --mount=/proc/1/ns/mnt -- /bin/systemctl reboot`, confined as PID 1 of a PID
and mount namespace of its own where /bin/systemctl only records the call
(gpuheal/sim/hostsystemd.py). Xid 79 → one `systemctl reboot`, in the jail's
namespaces and never the test's → the node reboots (new boot id) → result done → the
node returned; the agent after the reboot calls it no more."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal.model import REPAIR_RESULT
from gpuheal.policy.repairwire import Outcome, decode_result
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.hostsystemd import HostSystemd
from gpuheal.sim.kured import own_namespaces
from tests.helpers import FakeNodes, wait_for
from tests.integration.chart import render
from tests.integration.conftest import StartController, faults_of, our_taint
from tests.integration.test_repair import XID_79, repair_config

pytestmark = pytest.mark.timeout(180)


def chart_reboot_config(control_plane: ControlPlane) -> dict[str, Any]:
    """The agent's reboot keys and pod settings as the chart renders agent.hostReboot."""
    objects = render(
        control_plane, "gh", "gpuheal-system", sets={"agent.hostReboot.enabled": "true"}
    )
    (configmap,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gh-agent"
    ]
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True  # /proc/1 is the host's init there
    assert pod["containers"][0]["securityContext"]["privileged"] is True
    rendered = yaml.safe_load(configmap["data"]["config.yaml"])
    return {k: rendered[k] for k in ("repairRebootMethod", "repairRebootCommand")}


def test_xid_79_reboots_through_the_node_s_systemd_once_and_the_node_returns(
    control_plane: ControlPlane,
    kube: Client,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    reboot = chart_reboot_config(control_plane)
    assert reboot == {
        "repairRebootMethod": "command",
        "repairRebootCommand": ["/usr/bin/nsenter", "--mount=/proc/1/ns/mnt", "--",
                                "/bin/systemctl", "reboot"],
    }  # fmt: skip
    host = HostSystemd(tmp_path)
    (node,) = fake_gpu_nodes(1, labels=pool)
    start_controller(repair_config(pool, settleSeconds=30))
    settings = {"repairEnabled": True, "repairPollSeconds": 0.2, **reboot}
    agent = AgentProcess(tmp_path, control_plane.kubeconfig, node, settings, wrap=host.wrap())
    agent.start()
    try:
        agent.kernel(XID_79)
        (call,) = wait_for("systemctl reboot", host.calls, timeout_s=60)
        _when, verb, mnt, pid = call.split(" ")
        assert verb == "reboot"
        assert mnt != own_namespaces()[0] and pid != own_namespaces()[1]
        annotations = kube.get(Node, node).metadata.annotations or {}  # type: ignore[union-attr]
        assert REPAIR_RESULT not in annotations  # answered once the node is back
        # The node goes down and comes back: the agent restarts on a new boot.
        agent.stop()
        agent.reboot()
        agent.start()
        wait_for("the node returned", lambda: our_taint(kube, node) is None, timeout_s=90)
        annotations = kube.get(Node, node).metadata.annotations or {}  # type: ignore[union-attr]
        result = decode_result(annotations.get(REPAIR_RESULT))
        assert result is not None and result.outcome is Outcome.DONE
        assert "rebooted" in result.detail
        time.sleep(2)  # ten of its repair polls: no second call
        assert len(host.calls()) == 1
        (record,) = faults_of(kube, node)
        actions = (record.status or {}).get("actions", [])
        assert [a["action"] for a in actions].count("repair-requested") == 1
        assert "host-systemd jail: PID 1 of" in agent.log()
    finally:
        agent.stop()
