"""The agent's GPU reset on a real node (docs/operations.md#gpu-reset): the chart's
agent, told by gpuheal's repair, resets the GPU with (the stand-in's) nvidia-smi,
deletes NVIDIA's device plugin pod (`gpuReset.restartPods`, a plugin outside the GPU
Operator keeps a device it marked Unhealthy until it restarts), waits for the new one,
and the GPU is allocatable again: the node returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpuheal.sim import ControlPlane
from gpuheal.sim.workloads import apply, create_namespace
from tests.helpers import unique, wait_for
from tests.integration.chart import helm
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
from tests.node.test_chart import chart_values, nvidia_runtime_class, ready
from tests.node.test_real_node import deployment, label, running_pods
from tests.node.workload import trainer_template

pytestmark = pytest.mark.timeout(300)
FAULTY = 5


def agent_values(
    real_node: Any, gpus: NodeGpus, pool: dict[str, str], namespace: str
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
    real_node: Any,
    node_gpus: NodeGpus,
    device_plugin: str,
    control_plane: ControlPlane,
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    start_controller: StartController,
    tmp_path: Path,
) -> None:
    release_ns = unique("gpuheal")
    create_namespace(kube, release_ns)
    nvidia_runtime_class(kube)
    # GPU Feature Discovery's labels: the gate's expected GPU count comes from the second,
    # so the node returns only once the kubelet offers all 8 again.
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8", **pool}
    label(kube, real_node.name, labels)
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(agent_values(real_node, node_gpus, pool, device_plugin)))
    try:
        helm(
            control_plane,
            tmp_path,
            "install",
            "gpuheal",
            "deploy/helm/gpuheal",
            "-n",
            release_ns,
            "-f",
            str(values),
        )
        wait_for(
            "the agent ready",
            lambda: [p for p in kube.list(Pod, namespace=release_ns) if ready(p)],
            timeout_s=90,
        )
        # A pod that takes 15 s to stop holds the drain, and so the reset, that long:
        # long enough for the kubelet to say the GPU is gone (its 10 s status report).
        template = trainer_template(
            real_node.config.build.workload_image,
            real_node.workdir / "journal",
            grace_s=30,
            stop_s=15,
        )
        apply(kube, deployment("trainer", namespace, template, pool))
        wait_for("the trainer running", lambda: running_pods(kube, namespace), timeout_s=60)
        (before,) = plugin_pods(kube, device_plugin)
        gate = {"devicePluginSelector": PLUGIN_LABELS, "devicePluginRequired": True}
        repair = {"enabled": True, "mode": "act", "resultTimeoutSeconds": 180}
        start_controller(controller_config(pool, repair=repair, healthGate=gate))

        usable = allocatable_gpus(kube, real_node.name)
        node_gpus.xid(FAULTY, 48)
        wait_for("the node quarantined", lambda: our_taint(kube, real_node.name), timeout_s=60)
        wait_for(
            "the GPU Unhealthy to the kubelet",
            lambda: allocatable_gpus(kube, real_node.name) == usable - 1,
            timeout_s=60,
        )

        def node_records() -> list[Any]:
            """The node's fault (the agent's report), not the device path's record of the
            same GPU from the kubelet's pod status, which waits for its own canary."""
            return [r for r in faults_of(kube, real_node.name) if not r.spec.get("resourceID")]

        def returned() -> bool:
            return any(record_phase(r) == "Resolved" for r in node_records())

        try:
            wait_for("the node returned", returned, timeout_s=240)
        except AssertionError:
            for record in faults_of(kube, real_node.name):
                print(record_phase(record), record_entries(record))
            raise
        assert our_taint(kube, real_node.name) is None
        assert allocatable_gpus(kube, real_node.name) == usable
        (after,) = plugin_pods(kube, device_plugin)
        assert after.metadata and before.metadata and after.metadata.name != before.metadata.name
        resets = (node_gpus.directory / "nvml-spec.yaml.resets").read_text().splitlines()
        assert resets == [f"{node_gpus.uuid(FAULTY)} ok"]
        (record,) = node_records()
        actions = [e["action"] for e in record_entries(record)]
        assert "repaired" in actions, actions
    finally:
        helm(control_plane, tmp_path, "uninstall", "gpuheal", "-n", release_ns, "--wait")
        label(kube, real_node.name, dict.fromkeys(labels))
