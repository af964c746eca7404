"""The chart, installed by the real helm, running as real containers on the real node:
the image built without a registry (deploy/docker/build.sh), the chart's security
contexts, mounts and probes as rendered, the controller ready behind its /readyz probe
and the agent reporting its node's GPUs, reached through the chart's mounts (the NVML
stand-in where the NVIDIA container runtime would inject the driver's library)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.model import AGENT_ACCESS
from gpuheal.sim import ControlPlane
from gpuheal.sim.binaries import default_chart_image
from gpuheal.sim.realnode import RealNode, container_pids
from gpuheal.sim.workloads import create_namespace
from tests.helpers import unique, wait_for
from tests.integration.chart import helm
from tests.integration.conftest import gpu_healthy
from tests.node.gpus import NodeGpus
from tests.node.workload import REAL_NODE_TOLERATION

pytestmark = pytest.mark.timeout(300)
READY_WITHIN_S = 90  # the issue's bound, from the images' import (done at the node's start)


def chart_values(real_node: RealNode, gpus: NodeGpus, pool: dict[str, str]) -> dict[str, Any]:
    """The chart's defaults but: this image, both programs on the real node, the
    controller managing the test's pool, and the NVML stand-in mounted and named."""
    repository, tag = default_chart_image().reference.rsplit(":", 1)
    on_node = {"kubernetes.io/hostname": real_node.name}
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "controller": {
            "replicas": 1,
            "nodeSelector": on_node,
            "tolerations": [REAL_NODE_TOLERATION],
            "config": {"nodeSelector": pool},
        },
        "agent": {
            "nodeSelector": on_node,
            "extraEnv": gpus.env(),
            "extraVolumes": gpus.volumes(),
            "extraVolumeMounts": gpus.mounts(),
        },
    }


CAP_SYSLOG = 1 << 34
# What the chart's security contexts make of each program's process, as the kernel
# sees it: (user, effective capabilities, root filesystem read-only).
EXPECTED = {"controller": (65532, 0, True), "agent": (0, CAP_SYSLOG, True)}


def process_of(pod: Pod) -> tuple[int, int, bool]:
    """The pod's container's first process, read from the machine's /proc."""
    assert pod.status and pod.status.containerStatuses
    container_id = str(pod.status.containerStatuses[0].containerID).removeprefix("containerd://")
    pid = container_pids(container_id)[0]
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    root = next(
        line.split()
        for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        if line.split()[4] == "/"
    )
    return int(status["Uid"].split()[1]), int(status["CapEff"], 16), "ro" in root[5].split(",")


def node_annotation(kube: Client, node: str, key: str) -> str:
    meta = kube.get(Node, node).metadata
    return (meta.annotations or {}).get(key, "") if meta else ""


def ready(pod: Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def nvidia_runtime_class(kube: Client) -> None:
    """The GPU Operator's RuntimeClass, whose handler the real node's containerd has."""
    manifest = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
    }
    try:
        kube.create(codecs.from_dict(manifest))
    except ApiError as err:
        if err.status.code != 409:
            raise


def test_the_chart_runs_on_a_real_kubelet(
    real_node: RealNode,
    node_gpus: NodeGpus,
    control_plane: ControlPlane,
    kube: Client,
    pool: dict[str, str],
    tmp_path: Path,
) -> None:
    namespace = unique("gpuheal")
    create_namespace(kube, namespace)
    nvidia_runtime_class(kube)
    labels = {"nvidia.com/gpu.present": "true", **pool}
    kube.patch(Node, real_node.name, {"metadata": {"labels": labels}})
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(chart_values(real_node, node_gpus, pool)))
    release = "gpuheal"
    try:
        started = time.monotonic()
        helm(
            control_plane,
            tmp_path,
            "install",
            release,
            "deploy/helm/gpuheal",
            "-n",
            namespace,
            "-f",
            str(values),
        )

        def both_ready() -> list[str]:
            pods = kube.list(Pod, namespace=namespace)
            names = [str(p.metadata.name) for p in pods if ready(p) and p.metadata]
            return names if len(names) == 2 else []

        names = wait_for("the controller and the agent ready", both_ready, timeout_s=READY_WITHIN_S)
        print(f"ready in {time.monotonic() - started:.1f}s: {names}")

        wait_for("the agent's GPUHealthy", lambda: gpu_healthy(kube, real_node.name)[0])
        assert gpu_healthy(kube, real_node.name)[0] == "True", gpu_healthy(kube, real_node.name)
        access = wait_for(
            "the agent's access fact", lambda: node_annotation(kube, real_node.name, AGENT_ACCESS)
        )
        # runc hands an unprivileged container no /dev/kmsg (agent.kernelLog in the chart):
        # the agent says so, and reads NVML through the chart's mounts.
        assert "nvml=ok" in access and "gpus=8/" in access and "kmsg=unreadable" in access, access
        for pod in kube.list(Pod, namespace=namespace):
            component = (pod.metadata.labels or {}).get("app.kubernetes.io/component", "")  # type: ignore[union-attr]
            assert process_of(pod) == EXPECTED[component], component
    finally:
        helm(control_plane, tmp_path, "uninstall", release, "-n", namespace, "--wait")
        kube.patch(Node, real_node.name, {"metadata": {"labels": dict.fromkeys(labels)}})
