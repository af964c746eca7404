"""A real node stops cleanly: nothing of it stays on the machine or in the cluster."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node

from gpuheal.sim import ControlPlane
from gpuheal.sim.realnode import HOST_PATHS, RealNode, RealNodeConfig, namespace_members

OTHER = RealNodeConfig(name="gke-a3-mega-pool-2-7f3c9d21-x4lq", address="10.128.0.77")


def _links() -> str:
    return subprocess.run(
        [shutil.which("ip") or "ip", "-o", "link"], capture_output=True, text=True, check=True
    ).stdout


def test_a_stopped_node_leaves_nothing_behind(control_plane: ControlPlane, kube: Client) -> None:
    existed = {path: Path(path).exists() for path in HOST_PATHS}
    links = _links()
    node = RealNode(control_plane, OTHER)
    with node:
        assert kube.get(Node, OTHER.name).metadata
        namespace = node.pid_namespace
        assert namespace is not None
        assert len(namespace_members(namespace)) >= 3  # its shell, containerd, the kubelet
        cgroups = [p for p in Path("/sys/fs/cgroup").glob(f"*/{node.cgroup.path.lstrip('/')}")]
        assert cgroups
        workdir = node.workdir
    assert namespace_members(namespace) == []
    assert not workdir.exists()
    assert str(workdir) not in Path("/proc/self/mountinfo").read_text()
    assert [p for p in cgroups if p.exists()] == []
    assert {path: Path(path).exists() for path in HOST_PATHS if not existed[path]} == {
        path: False for path in HOST_PATHS if not existed[path]
    }
    assert _links() == links
    try:
        kube.get(Node, OTHER.name)
        raise AssertionError("the stopped node's Node object is still there")
    except ApiError as err:
        assert err.status.code == 404
