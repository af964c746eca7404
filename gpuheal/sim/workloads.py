"""GPU workloads for the local control plane: namespaces, Deployments, bare
pods and PodDisruptionBudgets, shaped like real training/inference jobs."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from lightkube import ApiError, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount

from gpuheal.sim.nodes import GPU_RESOURCE

# Never pulled: kwok plays the kubelet.
WORKLOAD_IMAGE = "registry.invalid/gpu-workload:latest"


def gpu_container(
    name: str = "main", *, gpus: int = 1, resource: str = GPU_RESOURCE
) -> dict[str, Any]:
    # Extended resources must have requests == limits; setting limits alone implies both.
    return {
        "name": name,
        "image": WORKLOAD_IMAGE,
        "resources": {"limits": {resource: str(gpus)}},
    }


def _pod_spec(
    *,
    gpus: int,
    resource: str,
    node_name: str | None,
    tolerations: Sequence[Mapping[str, Any]],
    node_selector: Mapping[str, str] | None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [gpu_container(gpus=gpus, resource=resource)],
        "terminationGracePeriodSeconds": 30,
        "automountServiceAccountToken": False,
    }
    if node_name:
        spec["nodeName"] = node_name
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return spec


def gpu_pod(
    name: str,
    namespace: str,
    *,
    gpus: int = 1,
    resource: str = GPU_RESOURCE,
    node_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A bare pod requesting `gpus` of `resource`; `node_name` skips the scheduler."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": _pod_spec(
            gpus=gpus,
            resource=resource,
            node_name=node_name,
            tolerations=tolerations,
            node_selector=node_selector,
        ),
    }


def gpu_deployment(
    name: str,
    namespace: str,
    *,
    replicas: int,
    gpus_per_pod: int = 1,
    resource: str = GPU_RESOURCE,
    tolerations: Sequence[Mapping[str, Any]] = (),
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": _pod_spec(
                    gpus=gpus_per_pod,
                    resource=resource,
                    node_name=None,
                    tolerations=tolerations,
                    node_selector=node_selector or {"nvidia.com/gpu.present": "true"},
                ),
            },
        },
    }


def pod_disruption_budget(
    name: str,
    namespace: str,
    *,
    match_labels: Mapping[str, str],
    max_unavailable: int | str | None = None,
    min_available: int | str | None = None,
) -> dict[str, Any]:
    if (max_unavailable is None) == (min_available is None):
        raise ValueError("set exactly one of max_unavailable and min_available")
    spec: dict[str, Any] = {"selector": {"matchLabels": dict(match_labels)}}
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    else:
        spec["minAvailable"] = min_available
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def apply(client: Client, manifest: Mapping[str, Any]) -> Any:
    """Create one object from a manifest dict and return the stored object."""
    return client.create(codecs.from_dict(dict(manifest)))


def create_namespace(client: Client, name: str, labels: Mapping[str, str] | None = None) -> None:
    """Create a namespace ready for pods.

    The ServiceAccount admission plugin rejects pods until the namespace's
    "default" ServiceAccount exists; kube-controller-manager creates it, but a
    control plane may run without one, so create it here (AlreadyExists is fine).
    """
    client.create(Namespace(metadata=ObjectMeta(name=name, labels=dict(labels or {}))))
    try:
        client.create(ServiceAccount(metadata=ObjectMeta(name="default")), namespace=name)
    except ApiError as err:
        if err.status.code != 409:
            raise


def wait_pods_running(
    client: Client,
    namespace: str,
    *,
    count: int,
    labels: Mapping[str, str] | None = None,
    timeout_s: float = 60,
) -> list[Pod]:
    """Block until at least `count` matching pods are Running; returns them."""
    deadline = time.monotonic() + timeout_s
    while True:
        pods = list(client.list(Pod, namespace=namespace, labels=dict(labels or {})))
        running = [p for p in pods if p.status and p.status.phase == "Running"]
        if len(running) >= count:
            return running
        if time.monotonic() >= deadline:
            phases = Counter((p.status.phase if p.status else None) or "none" for p in pods)
            raise TimeoutError(
                f"{len(running)}/{count} pods Running in {namespace} after {timeout_s}s"
                f" (phases: {dict(sorted(phases.items()))})"
            )
        time.sleep(0.2)
