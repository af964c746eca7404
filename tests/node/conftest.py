"""The node tier: a real kubelet and container runtime (gpuheal/sim/realnode.py) joined
to the session's control plane beside the kwok nodes, for this folder's tests only.

A machine that cannot run one fails these tests with what is missing (`make node`
installs and builds it), never skips them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.sim import ControlPlane
from gpuheal.sim.binaries import default_chart_image, default_device_plugin_image
from gpuheal.sim.nodes import GPU_RESOURCE
from gpuheal.sim.realnode import RealNode, RealNodeConfig
from gpuheal.sim.workloads import apply
from tests.helpers import wait_for

# The integration tier's fixtures, for the controller tests on the real node.
from tests.integration.conftest import crds, pool, start_controller  # noqa: F401
from tests.node.gpus import PLUGIN_LABELS, NodeGpus, device_plugin_daemonset


@pytest.fixture(scope="package")
def real_node(control_plane: ControlPlane) -> Iterator[RealNode]:
    """One real node for the tier, Ready, with the chart's and the device plugin's
    images imported (`make image`); stopped (and removed) after its last test."""
    images = (default_chart_image().archive, default_device_plugin_image().archive)
    config = RealNodeConfig(extra_images=images)
    with RealNode(control_plane, config) as node:
        yield node


@pytest.fixture(scope="package")
def node_gpus(real_node: RealNode) -> NodeGpus:
    """The real node's 8 GPUs: the NVML stand-in's spec every container of the node reads."""
    return NodeGpus.create(real_node.workdir / "nvml", real_node.name)


@pytest.fixture(scope="package")
def device_plugin(real_node: RealNode, node_gpus: NodeGpus, kube: Client) -> Iterator[str]:
    """NVIDIA's device plugin running on the real node (`make image`), its 8 GPUs
    allocatable through the kubelet; yields the DaemonSet's namespace."""
    image = default_device_plugin_image()
    manifest = device_plugin_daemonset("kube-system", image.reference, real_node.name, node_gpus)
    daemonset = apply(kube, manifest)
    try:
        wait_for(
            "the kubelet's 8 GPUs from the device plugin",
            lambda: allocatable_gpus(kube, real_node.name) == 8,
            timeout_s=60,
        )
    except AssertionError as err:
        pods = kube.list(Pod, namespace="kube-system", labels=dict(PLUGIN_LABELS))
        said = [f"{p.metadata.name}: {p.status}" for p in pods if p.metadata]
        logs = real_node.pod_logs("kube-system", "nvidia-device-plugin")
        raise AssertionError(
            f"{err}\n{said}\n{logs[-3000:]}\n{real_node.failure_report()}"
        ) from err
    yield "kube-system"
    kube.delete(DaemonSet, str(daemonset.metadata.name), namespace="kube-system")


def allocatable_gpus(kube: Client, node: str) -> int:
    status = kube.get(Node, node).status
    allocatable = (status.allocatable if status else None) or {}
    return int(allocatable.get(GPU_RESOURCE, "0"))


def restart_device_plugin(kube: Client, namespace: str, node: str) -> None:
    """Delete the plugin's pod and wait for the new one's 8 GPUs: after a test's Xid and
    a reset of its GPU, the next test finds the node as the tier started it."""
    for pod in kube.list(Pod, namespace=namespace, labels=dict(PLUGIN_LABELS)):
        kube.delete(Pod, str(pod.metadata.name), namespace=namespace)  # type: ignore[union-attr]
    wait_for(
        "the device plugin's 8 GPUs again", lambda: allocatable_gpus(kube, node) == 8, timeout_s=60
    )
