"""What differs between the Kubernetes versions gpuheal supports, as docs/deploy.md
(#kubernetes-versions) writes it down, on each other minor testenv builds: the
release each control plane is, what the API server keeps of a device health report
(ResourceHealthStatus, ResourceHealthStatusMessage), what the chart says at install
on a version without device health by default, and Helm refusing an older cluster."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.types import PatchType

from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.binaries import (
    VERSIONS_SOURCE,
    default_binaries,
    other_versions,
    pinned_release,
)
from gpuheal.sim.nodes import GPU_RESOURCE
from gpuheal.sim.workloads import apply, create_namespace, gpu_pod
from tests.integration.chart import CHART, installed

# docs/deploy.md's table: device health (Pod status allocatedResourcesStatus) is on by
# default from 1.36 (ResourceHealthStatus beta); from 1.33 an API server with the gate off
# drops it from status writes (1.32's has no such check); its message exists from 1.36
# (ResourceHealthStatusMessage).
DEVICE_HEALTH_BY_DEFAULT = 36
STATUS_WRITES_CHECK_GATES = 33
HEALTH_MESSAGE = 36
HOST_USERS = 33  # UserNamespacesSupport on by default: the API server keeps spec.hostUsers
OLDEST = "1.32"  # Chart.yaml's kubeVersion, docs/deploy.md's range
HEALTH = [{"resourceID": "GPU-0", "health": "Unhealthy", "message": "fallen off the bus"}]
NO_MESSAGE = [{"resourceID": "GPU-0", "health": "Unhealthy"}]  # before 1.36


def minor_of(control_plane: ControlPlane) -> int:
    """32 for "v1.32.13"."""
    return int(control_plane.version.split(".")[1])


def test_the_tier_runs_the_oldest_supported_and_a_newer_minor() -> None:
    assert other_versions()[0] == OLDEST and len(other_versions()) >= 2


def test_each_control_plane_is_the_release_its_module_pins(control_plane: ControlPlane) -> None:
    minor = f"1.{minor_of(control_plane)}"
    assert control_plane.version == pinned_release(VERSIONS_SOURCE / minor)


def stored_health(kube: Client, namespace: str) -> Any:
    """Report HEALTH for a pod's GPU the way the kubelet does (pods/status), then read
    back what the API server kept: the container's allocatedResourcesStatus or None."""
    try:  # kube-controller-manager makes it, where one runs
        kube.create(ServiceAccount(metadata=ObjectMeta(name="default")), namespace=namespace)
    except ApiError as err:
        if err.status.code != 409:
            raise
    apply(kube, gpu_pod("job-0", namespace, node_name="gpu-0"))
    devices = [{"name": GPU_RESOURCE, "resources": HEALTH}]
    status = {"name": "main", "image": "x", "imageID": "", "ready": True, "restartCount": 0,
              "state": {"running": {}}, "allocatedResourcesStatus": devices}  # fmt: skip
    body = {"status": {"containerStatuses": [status]}}
    kube.patch(Pod.Status, "job-0", body, namespace=namespace, patch_type=PatchType.MERGE)
    back = kube.get(Pod, "job-0", namespace=namespace)
    assert back.status is not None and back.status.containerStatuses
    return back.status.containerStatuses[0].to_dict().get("allocatedResourcesStatus")


def test_with_the_gate_on_the_health_message_needs_1_36(
    kube: Client, control_plane: ControlPlane, namespace: str
) -> None:
    """The tier's control planes turn ResourceHealthStatus on, as docs/deploy.md asks
    of a cluster before 1.36: the report is kept; its message only from 1.36."""
    stored = stored_health(kube, namespace)
    kept = HEALTH if minor_of(control_plane) >= HEALTH_MESSAGE else NO_MESSAGE
    assert stored == [{"name": GPU_RESOURCE, "resources": kept}]


@pytest.fixture
def gates_at_their_defaults(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """An API server (and etcd) of the same version with every feature gate at its
    default, as a managed cluster runs it."""
    binaries = control_plane.config.binaries
    config = ControlPlaneConfig(
        scheduler=False, controller_manager=False, kwok=False, feature_gates={}, binaries=binaries
    )
    with ControlPlane(config) as cp:
        yield cp


def test_at_the_gates_defaults_device_health_is_kept_on_1_32_and_from_1_36(
    gates_at_their_defaults: ControlPlane,
) -> None:
    """A managed cluster's API server: on 1.32 it keeps what the kubelet sends whatever
    the gate (the kubelet's own gate decides); 1.33 to 1.35 drop it; 1.36 keeps it."""
    kube = gates_at_their_defaults.client()
    create_namespace(kube, "devices")
    stored = stored_health(kube, "devices")
    minor = minor_of(gates_at_their_defaults)
    if minor >= DEVICE_HEALTH_BY_DEFAULT:
        assert stored == [{"name": GPU_RESOURCE, "resources": HEALTH}]
    elif minor >= STATUS_WRITES_CHECK_GATES:
        assert stored is None  # dropped: the device path sees nothing
    else:
        assert stored == [{"name": GPU_RESOURCE, "resources": NO_MESSAGE}]


def test_the_agent_runs_in_the_host_user_namespace_whether_or_not_the_field_is_kept(
    kube: Client, control_plane: ControlPlane, crds: None
) -> None:
    """The chart asks for the host's user namespace (hostUsers: true); before 1.33 the
    API server drops the field, which leaves the same: the host's is the default."""
    with installed(kube, control_plane) as release:
        agent = kube.get(DaemonSet, f"{release.name}-agent", namespace=release.namespace)
    assert agent.spec is not None and agent.spec.template.spec is not None
    kept = agent.spec.template.spec.hostUsers
    assert kept is (True if minor_of(control_plane) >= HOST_USERS else None)


def install_notes(control_plane: ControlPlane, tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it for this cluster: a server-side dry run,
    so the chart sees the API server's version (nothing is installed)."""
    home = {f"HELM_{k}_HOME": str(tmp_path / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}
    argv = [str(control_plane.config.binaries.helm), "install", "gh-notes", str(CHART),
            "--namespace", "gpuheal-system", "--dry-run=server",
            "--kubeconfig", str(control_plane.kubeconfig)]  # fmt: skip
    for value in sets:
        argv += ["--set", value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, **home})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_the_install_says_what_device_health_needs_where_it_is_off_by_default(
    control_plane: ControlPlane, crds: None, tmp_path: Path
) -> None:
    said = install_notes(control_plane, tmp_path)
    note = f"Kubernetes {control_plane.version}: device-level health reads Pod"
    if minor_of(control_plane) >= DEVICE_HEALTH_BY_DEFAULT:
        assert "ResourceHealthStatus" not in said
    else:
        assert note in said and "ResourceHealthStatus feature gate" in said
        off = install_notes(control_plane, tmp_path, "controller.config.deviceHealth.enabled=false")
        assert "ResourceHealthStatus" not in off  # nothing to say: the path is off


def test_the_install_says_where_a_dra_gpu_cannot_be_fenced_alone(
    control_plane: ControlPlane, crds: None, tmp_path: Path
) -> None:
    """DeviceTaintRules: GA (resource.k8s.io/v1) from 1.37; before, the install says
    what the device fence needs, unless the fence is turned off."""
    said = install_notes(control_plane, tmp_path)
    if minor_of(control_plane) >= 37:
        assert "DeviceTaintRule" not in said
    else:
        assert "fenced alone by a DeviceTaintRule" in said and "DRADeviceTaintRules" in said
        off = install_notes(control_plane, tmp_path, "controller.config.deviceHealth.fence=off")
        assert "DeviceTaintRule" not in off


def test_helm_refuses_a_cluster_older_than_the_supported_range() -> None:
    def template(version: str) -> subprocess.CompletedProcess[str]:
        argv = [
            str(default_binaries().helm),
            "template",
            "gh",
            str(CHART),
            "--kube-version",
            version,
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    older = template("1.31.14")
    assert older.returncode != 0
    assert (
        "chart requires kubeVersion: >=1.32.0-0 which is incompatible with Kubernetes v1.31.14"
        in older.stderr
    )
    assert template(f"{OLDEST}.0").returncode == 0
