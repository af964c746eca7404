"""The start-order facts end to end: a real agent (fake NVML) whose environment
probe reads a DGX H100's host tree reports them on its Node; `gpuheal gate` and
the controller's recovery hold the node while Fabric Manager is down and return
it once it runs. And the chart mounts what the probe reads, read-only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Node

from gpuheal.agent.config import parse_agent_config
from gpuheal.cli import main
from gpuheal.model import NODE_ENVIRONMENT
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from tests.helpers import FakeNodes, wait_for
from tests.hosts import dgx_h100
from tests.integration.chart import render
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    our_taint,
)

pytestmark = pytest.mark.timeout(240)

POOL_LABEL = "gpuheal.test/pool"


def environment(kube: Client, node: str) -> str:
    meta = kube.get(Node, node).metadata
    return str(((meta.annotations if meta else None) or {}).get(NODE_ENVIRONMENT, ""))


def test_the_gate_holds_an_nvswitch_node_until_fabric_manager_runs(
    control_plane: ControlPlane,
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    tree = dgx_h100(tmp_path / "host")
    tree.stop("nv-fabricmanage")  # after the reboot, Fabric Manager did not come up
    config_file = tmp_path / "gpuheal.yaml"
    config_file.write_text(yaml.safe_dump(controller_config(pool, pools={"label": POOL_LABEL})))

    def gate() -> tuple[int, dict[str, Any]]:
        capsys.readouterr()
        code = main(["gate", node, "-o", "json", "--kubeconfig", str(control_plane.kubeconfig),
                     "--config", str(config_file)])  # fmt: skip
        out = json.loads(capsys.readouterr().out)
        return code, next(c for c in out["checks"] if c["name"] == "environment")

    agent = AgentProcess(tmp_path, control_plane.kubeconfig, node, tree.agent_config()).start()
    try:
        down = "modules=ok;persistenced=ok;fabricmanager=stopped;runtimehook=ok"
        wait_for("the facts on the node", lambda: environment(kube, node) == down)
        code, check = gate()
        assert code == 64 | 32, check
        assert check["result"] == "fail"
        assert check["reason"] == (
            "Fabric Manager (nv-fabricmanager) is not running on an NVSwitch system"
        )

        tree.processes({2317: "nv-fabricmanage"})
        up = "modules=ok;persistenced=ok;fabricmanager=ok;runtimehook=ok"
        wait_for("the fixed facts on the node", lambda: environment(kube, node) == up)
        code, check = gate()
        assert code == 0, check
        assert check["result"] == "pass"
        assert "fabricmanager ok" in check["reason"]
        assert "Forbidden" not in agent.log()
    finally:
        agent.stop()
        print(f"--- agent log (tail) ---\n{agent.log()[-3000:]}")


def test_the_controllers_recovery_holds_the_node_until_fabric_manager_runs(
    control_plane: ControlPlane,
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    start_controller: StartController,
    tmp_path: Path,
) -> None:
    """The real agent reports an Xid 79 and its end; the controller's recovery gate
    sees Fabric Manager down on the NVSwitch node and keeps the fault taint."""
    (node,) = fake_gpu_nodes(1, labels=pool)
    tree = dgx_h100(tmp_path / "host")
    tree.stop("nv-fabricmanage")
    settings = {**tree.agent_config(), "xidHoldSeconds": 2}
    agent = AgentProcess(tmp_path, control_plane.kubeconfig, node, settings).start()
    start_controller(controller_config(pool, pools={"label": POOL_LABEL}))
    try:
        agent.kernel("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.")
        wait_for("the quarantine", lambda: our_taint(kube, node) is not None)

        def gate_failed() -> list[dict[str, str]]:
            (record,) = faults_of(kube, node)
            actions = (record.status or {}).get("actions", [])
            return [a for a in actions if a["action"] == "gate-failed"]

        # The Xid is held 2 s, then the agent clears the fault and recovery gates the node.
        (entry,) = wait_for("the gate's refusal on the record", gate_failed, timeout_s=60)
        # The failing checks, then the gate's summary ("check: why").
        assert entry["detail"] == (
            "environment: environment: "
            "Fabric Manager (nv-fabricmanager) is not running on an NVSwitch system"
        )
        wait_for("its Event", lambda: events_for(kube, node, "GPUHealthGateFailed"))
        assert our_taint(kube, node) is not None

        tree.processes({2317: "nv-fabricmanage"})
        wait_for("the node returned", lambda: our_taint(kube, node) is None, timeout_s=60)
        # The pass writes the record's status after the actions it records.
        wait_for(
            "Resolved", lambda: [r.status["phase"] for r in faults_of(kube, node)] == ["Resolved"]
        )
    finally:
        agent.stop()
        print(f"--- agent log (tail) ---\n{agent.log()[-3000:]}")


def test_the_chart_mounts_the_runtimes_config_read_only_where_the_probe_reads(
    kube: Client, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump({"agent": {"runtimeConfigDirs": ["/etc/crio", "/etc/containerd"]}})
    )
    objects = render(control_plane, "gh", namespace, values)
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    runtime = {
        m["mountPath"]: volumes[m["name"]]["hostPath"]
        for m in agent["volumeMounts"]
        if m["name"].startswith("runtime-config-") and m["readOnly"] is True
    }
    assert runtime == {
        "/host/etc/crio": {"path": "/etc/crio", "type": "Directory"},
        "/host/etc/containerd": {"path": "/etc/containerd", "type": "Directory"},
    }
    (rendered,) = [
        o for o in objects if o["metadata"]["name"] == "gh-agent" and o["kind"] == "ConfigMap"
    ]
    config = parse_agent_config(yaml.safe_load(rendered["data"]["config.yaml"]))
    assert (config.host_root, config.proc_root) == (Path("/host"), Path("/host/proc"))
    # Every mounted directory holds a config the probe reads.
    for mount in runtime:
        assert any(
            str(config.host_root / p.lstrip("/")).startswith(mount + "/")
            for p in config.runtime_config_paths
        ), mount
    kube.create(codecs.from_dict(daemonset), dry_run=True)  # the API server takes it
