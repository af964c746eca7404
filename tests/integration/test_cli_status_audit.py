"""`gpuheal status` and `gpuheal audit` against the real control plane, with kwok
GPU nodes seeded the way an agent, the controller and people would leave them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from gpuheal.cli import main
from gpuheal.model import DRIVER_VERSION, GPU_PROCESSES, STATE_LABEL, TAINT_KEY
from gpuheal.sim import ControlPlane
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import gpu_pod, wait_pods_running
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import annotate

pytestmark = pytest.mark.timeout(240)

POOL_LABEL = "gpuheal.io/pool"
ZONE = "topology.kubernetes.io/zone"
KEEP = "gpuheal.test/keep"  # a finalizer nobody removes: the pod stays Terminating


class Cli:
    """Run `gpuheal <command> ...` in-process on one test's nodes (its -l and
    --config come first, so a later -l wins); returns (exit code, stdout)."""

    def __init__(self, kubeconfig: Path, config: Path, namespace: str, capsys: Any) -> None:
        self.kubeconfig, self.config, self.namespace = kubeconfig, config, namespace
        self.capsys = capsys
        self.err = ""

    def __call__(self, command: str, *rest: str) -> tuple[int, str]:
        self.capsys.readouterr()
        code = main(
            [
                command,
                "--kubeconfig",
                str(self.kubeconfig),
                "--config",
                str(self.config),
                "-l",
                f"gpuheal.test/pool={self.namespace}",
                *rest,
            ]
        )
        captured = self.capsys.readouterr()
        self.err = captured.err
        return code, captured.out


@pytest.fixture
def cli(
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Cli:
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps tables at the terminal width
    config = tmp_path / "gpuheal.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "nodeSelector": {"gpuheal.test/pool": namespace},
                "pools": {"expectedLabels": {ZONE: "*"}},
            }
        )
    )
    return Cli(control_plane.kubeconfig, config, namespace, capsys)


def pools(fake_gpu_nodes: FakeNodes, namespace: str, sizes: dict[str, int]) -> dict[str, list[str]]:
    return {
        pool: fake_gpu_nodes(
            count, labels={"gpuheal.test/pool": namespace, POOL_LABEL: pool, ZONE: "z1"}
        )
        for pool, count in sizes.items()
    }


def held_record(kube: Client, node: str) -> str:
    """A GPUFault the controller held at the breaker, as it would write it."""
    name = f"{node}-held"
    record = {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "GPUFault",
        "metadata": {"name": name, "labels": {"gpuheal.io/node": node}},
        "spec": {
            "node": node,
            "faultID": f"{node}-f1",
            "scope": "node",
            "source": "agent",
            "reason": "XidCritical79",
            "severity": "P0",
        },
    }
    kube.create(GPUFault.from_dict(record))
    kube.patch(GPUFault.Status, name, {"status": {"phase": "Held"}}, patch_type=PatchType.MERGE)
    return name


@pytest.fixture
def records(kube: Client, crds: None) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        kube.delete(GPUFault, name)


def test_status_counts_nodes_by_state_gpus_per_pool_faults_and_the_breaker(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    namespace: str,
    records: list[str],
    cli: Cli,
) -> None:
    nodes = pools(fake_gpu_nodes, namespace, {"a": 3, "b": 3})
    (a0, a1, a2), (b0, b1, b2) = nodes["a"], nodes["b"]
    kube.patch(Node, a0, {"metadata": {"labels": {STATE_LABEL: "maintenance"}}})
    kube.patch(
        Node, a1, {"spec": {"taints": [{"key": TAINT_KEY, "value": "f", "effect": "NoSchedule"}]}}
    )
    records.append(held_record(kube, b0))
    kube.create(codecs.from_dict(gpu_pod("train", namespace, gpus=2, node_name=b1)))
    wait_pods_running(kube, namespace, count=1)

    code, out = cli("status", "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert data["nodes"] == {
        "total": 6,
        "byState": {
            "healthy": 3,
            "suspect": 0,
            "quarantined": 1,
            "draining": 0,
            "held": 1,
            "maintenance": 1,
            "not-ready": 0,
        },
    }
    states = {n["node"]: (n["state"], n["pool"]) for n in data["nodeStates"]}
    assert states == {
        a0: ("maintenance", "a"),
        a1: ("quarantined", "a"),
        a2: ("healthy", "a"),
        b0: ("held", "b"),
        b1: ("healthy", "b"),
        b2: ("healthy", "b"),
    }
    assert data["pools"] == [
        {"pool": "a", "nodes": 3, "capacity": 24, "allocatable": 24, "allocated": 0},
        {"pool": "b", "nodes": 3, "capacity": 24, "allocatable": 24, "allocated": 2},
    ]
    (fault,) = data["faults"]
    assert (fault["node"], fault["faultId"], fault["phase"], fault["reason"]) == (
        b0,
        f"{b0}-f1",
        "Held",
        "XidCritical79",
    )
    assert 0 <= fault["ageSeconds"] < 120
    # 6 GPU nodes at the default 10 %: one slot, taken by a1 (a0's maintenance is not a fault).
    assert data["breaker"] == {"capacity": 1, "quarantined": 1, "rolling": 0, "remaining": 0}

    code, table = cli("status")
    assert code == 0
    for expected in (
        "GPU nodes by state (6)",
        "maintenance",
        a0,
        "quarantined",
        a1,
        "held",
        b0,
        "GPUs per pool",
        "Open faults",
        f"{b0}-f1",
        "XidCritical79",
        "0 of 1 quarantine slots left (1 node(s) carry the gpuheal.io/gpu-fault taint)",
    ):
        assert expected in table, expected

    code, out = cli("status", "-o", "yaml")
    assert code == 0 and yaml.safe_load(out)["breaker"]["remaining"] == 0


def set_allocatable_gpus(kube: Client, node: str, gpus: int) -> None:
    """What the device plugin does when it offers fewer (or no) GPUs."""
    kube.patch(Node.Status, node, {"status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}})


def test_audit_finds_a_leak_a_zombie_zero_allocatable_skew_and_a_missing_label(
    kube: Client, fake_gpu_nodes: FakeNodes, namespace: str, cli: Cli
) -> None:
    nodes = pools(fake_gpu_nodes, namespace, {"a": 3, "b": 2})
    (a0, a1, a2), (b0, b1) = nodes["a"], nodes["b"]
    for node in (a0, a1, a2, b0, b1):
        annotate(kube, node, {DRIVER_VERSION: "550.54.15"})
    code, out = cli("audit", "-o", "json")
    assert (code, json.loads(out)) == (0, {"findings": [], "counts": {}, "nodes": 5})

    # A leak: a GPU pod deleted but held by a finalizer, Terminating for good.
    stuck = gpu_pod("stuck", namespace, gpus=1, node_name=a0)
    stuck["metadata"]["finalizers"] = [KEEP]
    kube.create(codecs.from_dict(stuck))
    # A live pod on a1, and a GPU process of a pod that no longer exists.
    kube.create(codecs.from_dict(gpu_pod("live", namespace, gpus=1, node_name=a1)))
    running = {p.metadata.name: p for p in wait_pods_running(kube, namespace, count=2)}  # type: ignore[union-attr]
    live_uid = running["live"].metadata.uid  # type: ignore[union-attr]
    gone_uid = "0b9d6c1e-2f3a-4b5c-8d7e-6f5a4b3c2d1e"
    try:
        kube.delete(Pod, "stuck", namespace=namespace, grace_period=0)
        annotate(kube, a1, {GPU_PROCESSES: f"4242@{gone_uid},4243@{live_uid}"})
        set_allocatable_gpus(kube, b0, 0)
        annotate(kube, a2, {DRIVER_VERSION: "535.104.05"})
        kube.patch(Node, b1, {"metadata": {"labels": {ZONE: None}}})
        time.sleep(2.5)  # past --stuck-after 1

        code, out = cli("audit", "-o", "json", "--stuck-after", "1")
        assert code == 3
        data = json.loads(out)
        assert data["nodes"] == 5
        assert data["counts"] == {
            "leak": 1,
            "zombie-process": 1,
            "zero-allocatable": 1,
            "driver-skew": 1,
            "missing-label": 1,
        }
        found = {(f["kind"], f["node"]): f["detail"] for f in data["findings"]}
        assert set(found) == {
            ("leak", a0),
            ("zombie-process", a1),
            ("zero-allocatable", b0),
            ("driver-skew", a2),
            ("missing-label", b1),
        }
        assert f"pod {namespace}/stuck holds 1 GPU(s)" in found["leak", a0]
        assert KEEP in found["leak", a0]
        assert f"process 4242 of pod UID {gone_uid}" in found["zombie-process", a1]
        assert "4243" not in found["zombie-process", a1]
        assert "driver 535.104.05 differs from 550.54.15" in found["driver-skew", a2]
        assert f"label {ZONE} is missing" in found["missing-label", b1]
        assert all(f["pool"] == ("a" if f["node"] in nodes["a"] else "b") for f in data["findings"])

        code, table = cli("audit", "--stuck-after", "1")
        assert code == 3
        for expected in (
            "leak (1)",
            "zombie-process (1)",
            "zero-allocatable (1)",
            "driver-skew (1)",
            "missing-label (1)",
            KEEP,
            "535.104.05",
            f"gpuheal doctor {b0}",
            "5 finding(s) on 5 of 5 GPU node(s)",
        ):
            assert expected in table, expected
    finally:
        try:
            kube.patch(Pod, "stuck", {"metadata": {"finalizers": None}}, namespace=namespace)
        except ApiError as err:
            if err.status.code != 404:
                raise

    # Every problem fixed: a clean fleet.
    def gone() -> bool:
        try:
            kube.get(Pod, "stuck", namespace=namespace)
        except ApiError as err:
            return err.status.code == 404
        return False

    wait_for("the stuck pod gone", gone)
    annotate(kube, a1, {GPU_PROCESSES: f"4243@{live_uid}"})
    set_allocatable_gpus(kube, b0, 8)
    annotate(kube, a2, {DRIVER_VERSION: "550.54.15"})
    kube.patch(Node, b1, {"metadata": {"labels": {ZONE: "z1"}}})
    code, out = cli("audit", "-o", "json")
    assert (code, json.loads(out)) == (0, {"findings": [], "counts": {}, "nodes": 5})
    code, table = cli("audit")
    assert code == 0 and "no findings on 5 GPU node(s)" in table


def test_a_bad_selector_is_a_usage_error(cli: Cli) -> None:
    code, out = cli("audit", "-l", "pool in (a,b)")
    assert (code, out) == (2, "")
    assert "cannot read the label selector term 'pool in (a'" in cli.err
