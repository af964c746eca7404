"""The chart installed by the real helm on the real node: its values for this tier (the
image built without a registry, both programs on the real node, the NVML stand-in where
the NVIDIA container runtime injects the driver's library) and an install that undoes
itself."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.sim import ControlPlane
from gpuheal.sim.binaries import default_chart_image
from gpuheal.sim.realnode import RealNode
from gpuheal.sim.workloads import create_namespace
from tests.helpers import unique
from tests.integration.chart import CHART, helm
from tests.node.gpus import NodeGpus
from tests.node.workload import REAL_NODE_TOLERATION

RELEASE = "gpuheal"


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


def ready(pod: Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def ready_pods(kube: Client, namespace: str) -> list[Pod]:
    return [p for p in kube.list(Pod, namespace=namespace) if ready(p)]


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


@contextmanager
def installed(
    control_plane: ControlPlane,
    kube: Client,
    real_node: RealNode,
    workdir: Path,
    values: dict[str, Any],
    labels: Mapping[str, str],
) -> Iterator[str]:
    """`helm install` in a new namespace with the node labelled as a GPU Operator node
    (`labels` besides); yields the namespace. Uninstalled and unlabelled after."""
    namespace = unique("gpuheal")
    create_namespace(kube, namespace)
    nvidia_runtime_class(kube)
    kube.patch(Node, real_node.name, {"metadata": {"labels": dict(labels)}})
    (workdir / "values.yaml").write_text(yaml.safe_dump(values))
    install = ("install", RELEASE, str(CHART), "-n", namespace, "-f", str(workdir / "values.yaml"))
    try:
        helm(control_plane, workdir, *install)
        yield namespace
    finally:
        helm(control_plane, workdir, "uninstall", RELEASE, "-n", namespace, "--wait")
        unlabelled = dict.fromkeys(labels)
        kube.patch(Node, real_node.name, {"metadata": {"labels": unlabelled}})
