"""The agent's GPU reset on a real node (docs/operations.md#gpu-reset): the chart's
agent, told by gpuheal's repair, resets the GPU with (the stand-in's) nvidia-smi,
deletes NVIDIA's device plugin pod (`gpuReset.restartPods`, a plugin outside the GPU
Operator keeps a device it marked Unhealthy until it restarts), waits for the new one,
and the GPU is allocatable again: the node returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpuheal.sim import ControlPlane
from gpuheal.sim.realnode import RealNode
from gpuheal.sim.workloads import apply
from tests.helpers import wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    faults_of,
    our_taint,
    record_entries,
    record_phase,
)
from tests.node.conftest import allocatable_gpus
from tests.node.gpus import PLUGIN_LABELS, STAND_IN, NodeGpus
from tests.node.release import chart_values, installed, ready, ready_pods
from tests.node.test_real_node import deployment, running_pods
from tests.node.workload import trainer_template

pytestmark = pytest.mark.timeout(300)
FAULTY = 5


def agent_values(
    real_node: RealNode, gpus: NodeGpus, pool: dict[str, str], namespace: str
) -> dict[str, Any]:
    """The chart's agent alone (the controller runs as a test process), allowed to reset
    with the stand-in's nvidia-smi and to restart the device plugin's pod."""
    values = chart_values(real_node, gpus, pool)
    values["controller"]["replicas"] = 0
    values["agent"]["extraVolumeMounts"] = gpus.mounts(resets=True)
    values["agent"]["config"] = {
        "intervalSeconds": 2,
        "repairEnabled": True,
        "repairPollSeconds": 1,
        "repairResetCommand": [f"{STAND_IN}/bin/nvidia-smi"],
    }
    values["agent"]["gpuReset"] = {
        "enabled": True,
        "daemons": "none",
        "namespace": namespace,
        "restartPods": [PLUGIN_LABELS],
        "timeoutSeconds": 60,
    }
    return values


def plugin_pods(kube: Client, namespace: str) -> list[Pod]:
    return [p for p in kube.list(Pod, namespace=namespace, labels=dict(PLUGIN_LABELS)) if ready(p)]


def test_a_reset_restarts_the_device_plugin_and_the_gpu_is_allocatable_again(
    real_node: RealNode,
    node_gpus: NodeGpus,
    device_plugin: str,
    control_plane: ControlPlane,
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    start_controller: StartController,
    tmp_path: Path,
) -> None:
    values = agent_values(real_node, node_gpus, pool, device_plugin)
    # GPU Feature Discovery's labels: the gate's expected GPU count comes from the second,
    # so the node returns only once the kubelet offers all 8 again.
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8", **pool}
    with installed(control_plane, kube, real_node, tmp_path, values, labels) as release:
        wait_for("the agent ready", lambda: ready_pods(kube, release), timeout_s=90)
        _slow_trainer(real_node, kube, namespace, pool)
        (before,) = plugin_pods(kube, device_plugin)
        gate = {"devicePluginSelector": PLUGIN_LABELS, "devicePluginRequired": True}
        repair = {"enabled": True, "mode": "act", "resultTimeoutSeconds": 180}
        start_controller(controller_config(pool, repair=repair, healthGate=gate))

        usable = allocatable_gpus(kube, real_node.name)
        node_gpus.xid(FAULTY, 48)
        wait_for("the node quarantined", lambda: our_taint(kube, real_node.name), timeout_s=60)
        one_less = lambda: allocatable_gpus(kube, real_node.name) == usable - 1  # noqa: E731
        wait_for("the GPU Unhealthy to the kubelet", one_less, timeout_s=60)
        record = _returned(kube, real_node.name)
        assert our_taint(kube, real_node.name) is None
        assert allocatable_gpus(kube, real_node.name) == usable
        (after,) = plugin_pods(kube, device_plugin)
        assert after.metadata and before.metadata and after.metadata.name != before.metadata.name
        resets = (node_gpus.directory / "nvml-spec.yaml.resets").read_text().splitlines()
        assert resets == [f"{node_gpus.uuid(FAULTY)} ok"]
        actions = [e["action"] for e in record_entries(record)]
        assert "repaired" in actions, actions


def _slow_trainer(real_node: RealNode, kube: Client, namespace: str, pool: dict[str, str]) -> None:
    """A GPU pod that takes 15 s to stop holds the drain, and so the reset, that long:
    long enough for the kubelet to say the GPU is gone (its 10 s status report)."""
    workload = real_node.config.build.workload_image
    template = trainer_template(workload, real_node.workdir / "journal", grace_s=30, stop_s=15)
    apply(kube, deployment("trainer", namespace, template, pool))
    wait_for("the trainer running", lambda: running_pods(kube, namespace), timeout_s=60)


def _returned(kube: Client, node: str) -> Any:
    """The node's fault (the agent's report), once Resolved: not the device path's record
    of the same GPU from the kubelet's pod status, which waits for its own canary."""

    def node_records() -> list[Any]:
        return [r for r in faults_of(kube, node) if not r.spec.get("resourceID")]

    try:
        return wait_for(
            "the node returned",
            lambda: [r for r in node_records() if record_phase(r) == "Resolved"],
            timeout_s=240,
        )[0]
    except AssertionError:
        for record in faults_of(kube, node):
            print(record_phase(record), record_entries(record))
        raise
