"""The read commands' snapshot (kube/snapshot.py) against the real API server:
paged lists, the selectors it sends, and how `status` and `audit` say that the
API server cannot be read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Pod

from gpuheal.cli import main
from gpuheal.kube.client import operator_api
from gpuheal.kube.snapshot import Snapshot, read_snapshot
from gpuheal.sim import ControlPlane
from gpuheal.sim.kubeconfig import write_kubeconfig
from gpuheal.sim.workloads import gpu_pod, wait_pods_running
from tests.helpers import FakeNodes, wait_for

pytestmark = pytest.mark.timeout(120)


def snapshot_of(kubeconfig: Path, **options: object) -> Snapshot:
    async def read() -> Snapshot:
        api = operator_api(kubeconfig, None)
        try:
            return await read_snapshot(api, **options)  # type: ignore[arg-type]
        finally:
            await api.close()

    return asyncio.run(read())


def test_the_snapshot_reads_every_page_and_only_the_pods_that_hold_a_node(
    control_plane: ControlPlane,
    kube: Client,
    namespace: str,
    fake_gpu_nodes: FakeNodes,
    crds: None,
) -> None:
    pool = {"gpuheal.test/pool": namespace}
    nodes = fake_gpu_nodes(3, labels=pool)
    kube.create(codecs.from_dict(gpu_pod("train", namespace, gpus=2, node_name=nodes[0])))
    kube.create(codecs.from_dict(gpu_pod("done", namespace, gpus=8, node_name=nodes[1])))
    wait_pods_running(kube, namespace, count=2)
    kube.patch(Pod.Status, "done", {"status": {"phase": "Succeeded"}}, namespace=namespace)
    # No node matches: it stays Pending, bound to none.
    unplaced = gpu_pod("waiting", namespace, node_selector={"gpuheal.test/pool": "none"})
    kube.create(codecs.from_dict(unplaced))

    def done() -> bool:
        pod = kube.get(Pod, "done", namespace=namespace)
        return pod.status is not None and pod.status.phase == "Succeeded"

    wait_for("the finished pod Succeeded", done)
    # Pages of one object: every continue token followed, concurrently for each kind.
    snap = snapshot_of(
        control_plane.kubeconfig,
        faults=True,
        node_selector=f"gpuheal.test/pool={namespace}",
        page=1,
    )
    assert sorted(n.metadata.name for n in snap.nodes) == sorted(nodes)
    ours = {p.metadata.name: p for p in snap.pods if p.metadata.namespace == namespace}
    assert set(ours) == {"train"}  # not the Succeeded one, not the unbound one
    assert [p.metadata.name for p in snap.pods_by_node[nodes[0]] if p in ours.values()] == ["train"]
    assert snap.faults is not None  # the CRD is installed: a list, maybe empty


def test_status_and_audit_say_plainly_when_the_api_server_cannot_be_read(
    control_plane: ControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nobody = control_plane.kubeconfig_for("gpuheal-operator")  # RBAC grants it nothing
    closed = write_kubeconfig(
        tmp_path / "closed.yaml",
        server="https://127.0.0.1:1",
        ca_cert=control_plane.ca_cert,
        user="gpuheal-operator",
        token="unused",
    )
    for command in ("status", "audit"):
        assert main([command, "--kubeconfig", str(nobody)]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert f"gpuheal {command}: the API server refused: 403 Forbidden: " in captured.err
        assert main([command, "--kubeconfig", str(closed)]) == 1
        captured = capsys.readouterr()
        assert captured.err.startswith(f"gpuheal {command}: cannot reach the API server: ")
        assert main([command, "--kubeconfig", str(tmp_path / "absent.yaml")]) == 2
        assert "cannot load a kubeconfig" in capsys.readouterr().err
