"""`gpuheal doctor NODE` on the real control plane with kwok nodes: prepared broken
cases, each checked by finding kind in -o json, by a key phrase in the table, and
by the exit code. Every test labels its nodes with its own pool so that tests do
not see each other's nodes."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpuheal.cli import main
from gpuheal.model import TAINT_KEY, fault_record_name
from gpuheal.ops import exitcodes
from gpuheal.sim import ControlPlane
from gpuheal.sim.records import PastFault, create_past_faults
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import (
    apply,
    gpu_deployment,
    gpu_pod,
    pod_disruption_budget,
    wait_pods_running,
)
from tests.helpers import FakeNodes, wait_for

pytestmark = pytest.mark.timeout(180)
POOL_LABEL = "gpuheal.io/pool"


def doctor(
    control_plane: ControlPlane, capsys: pytest.CaptureFixture[str], node: str, output: str
) -> tuple[int, str]:
    capsys.readouterr()  # drop what earlier calls left
    code = main(["doctor", node, "--kubeconfig", str(control_plane.kubeconfig), "-o", output])
    captured = capsys.readouterr()
    assert code in (0, 3, 5), captured.err
    return code, captured.out


def diagnose(
    control_plane: ControlPlane, capsys: pytest.CaptureFixture[str], node: str
) -> tuple[int, dict[str, Any], str]:
    """Doctor's exit code, its JSON and its table text for one node."""
    code, out = doctor(control_plane, capsys, node, "json")
    table_code, table = doctor(control_plane, capsys, node, "table")
    assert table_code == code
    return code, json.loads(out), table


def kinds(report: dict[str, Any], question: str | None = None) -> dict[str, str]:
    return {
        f["kind"]: f["severity"]
        for q in report["questions"]
        if question is None or q["id"] == question
        for f in q["findings"]
    }


def text_of(report: dict[str, Any], kind: str) -> str:
    texts = [f["text"] for q in report["questions"] for f in q["findings"] if f["kind"] == kind]
    assert texts, f"no {kind} finding in {report}"
    return str(texts[0])


def taint(kube: Client, node: str, *taints: dict[str, str]) -> None:
    kube.patch(Node, node, {"spec": {"taints": list(taints)}})


def test_a_healthy_node_is_all_ok(
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    fake_gpu_nodes: FakeNodes,
    namespace: str,
) -> None:
    nodes = fake_gpu_nodes(2, labels={POOL_LABEL: namespace})
    code, report, table = diagnose(control_plane, capsys, nodes[0])
    assert code == exitcodes.OK, report
    assert report["node"] == nodes[0] and report["healthy"] is True
    assert [q["id"] for q in report["questions"]] == ["ready", "gpus", "workloads", "affected"]
    found = kinds(report)
    assert all(severity in ("ok", "info") for severity in found.values()), found
    assert {"ready", "gpus-visible", "nothing-waiting", "pool-healthy"} <= set(found)
    assert f"The other node of pool {namespace} serves" in text_of(report, "pool-healthy")
    assert "1. Is the node registered and Ready?" in table
    assert "The scheduler sees 8 allocatable GPUs" in table
    assert "nothing wrong found" in table


def test_an_unknown_node_exits_5(
    control_plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report, table = diagnose(control_plane, capsys, "no-such-gpu-node")
    assert code == exitcodes.NOT_FOUND
    assert kinds(report) == {"not-registered": "bad"}
    assert "is not registered with the API server" in table


def test_missing_toleration(
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    namespace: str,
) -> None:
    pool = {POOL_LABEL: namespace}
    nodes = fake_gpu_nodes(2, labels=pool)
    for name in nodes:  # a dedicated set of nodes, as a cluster admin would set it up
        taint(kube, name, {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
    apply(kube, gpu_deployment("trainer", namespace, replicas=2, node_selector=pool))

    def scheduler_spoke() -> dict[str, Any] | None:
        report = json.loads(doctor(control_plane, capsys, nodes[0], "json")[1])
        pending = [f["text"] for q in report["questions"] for f in q["findings"]]
        both = f"2 pods of Deployment {namespace}/trainer"  # replicas share one diagnosis
        spoke = any("the scheduler says:" in t and t.startswith(both) for t in pending)
        return report if spoke else None

    report = wait_for("the scheduler's FailedScheduling event", scheduler_spoke, timeout_s=60)
    assert report is not None
    assert kinds(report, "workloads")["missing-toleration"] == "bad"
    text = text_of(report, "missing-toleration")
    assert "do not tolerate taint nvidia.com/gpu=present:NoSchedule" in text
    assert "2 of the 2 nodes they may use carry" in text
    assert "operator: Equal, value: present" in text
    assert "untolerated taint" in text_of(report, "pending")  # the scheduler's own words
    code, table = doctor(control_plane, capsys, nodes[0], "table")
    assert code == exitcodes.FINDINGS
    assert "add the toleration {key: nvidia.com/gpu" in table


def test_request_larger_than_any_node(
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    namespace: str,
) -> None:
    pool = {POOL_LABEL: namespace}
    nodes = fake_gpu_nodes(2, labels=pool)
    apply(kube, gpu_pod("huge", namespace, gpus=16, node_selector=pool))
    code, report, table = diagnose(control_plane, capsys, nodes[1])
    assert code == exitcodes.FINDINGS
    assert kinds(report, "workloads")["request-too-large"] == "bad"
    assert "requests 16 nvidia.com/gpu but the largest node it may use offers 8" in table


def test_zero_allocatable(
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    namespace: str,
) -> None:
    nodes = fake_gpu_nodes(2, labels={POOL_LABEL: namespace})
    # What the kubelet reports when the device plugin marks every GPU unhealthy.
    kube.patch(Node.Status, nodes[0], {"status": {"allocatable": {"nvidia.com/gpu": "0"}}})
    code, report, table = diagnose(control_plane, capsys, nodes[0])
    assert code == exitcodes.FINDINGS
    assert kinds(report, "gpus")["zero-allocatable"] == "bad"
    assert "allocatable nvidia.com/gpu is 0 while the node should offer 8" in table
    # Its pool peer sees the trouble next door.
    _, peer, _ = diagnose(control_plane, capsys, nodes[1])
    assert "1 zero allocatable" in text_of(peer, "pool-degraded")


def test_maintenance_taint_left_behind(
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    namespace: str,
) -> None:
    (node,) = fake_gpu_nodes(1, labels={POOL_LABEL: namespace})
    taint(kube, node, {"key": "gpuheal.io/maintenance", "effect": "NoSchedule"})
    code, report, table = diagnose(control_plane, capsys, node)
    assert code == exitcodes.FINDINGS
    assert kinds(report, "gpus")["stale-maintenance-taint"] == "bad"
    assert "a maintenance taint was left behind" in table
    assert f"gpuheal maintenance finish {node}" in table


def test_a_pdb_holds_the_pods_of_a_cordoned_node(
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    namespace: str,
) -> None:
    pool = {POOL_LABEL: namespace}
    (node,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_deployment("serve", namespace, replicas=2, node_selector=pool))
    wait_pods_running(kube, namespace, count=2, labels={"app": "serve"})
    apply(
        kube,
        pod_disruption_budget("serve", namespace, match_labels={"app": "serve"}, min_available=2),
    )
    kube.patch(Node, node, {"spec": {"unschedulable": True}})

    def budget_seen() -> dict[str, Any] | None:
        report: dict[str, Any] = json.loads(doctor(control_plane, capsys, node, "json")[1])
        return report if "pdb-blocks" in kinds(report) else None

    report = wait_for("the PodDisruptionBudget's status", budget_seen, timeout_s=60)
    assert report is not None
    assert f"PodDisruptionBudget {namespace}/serve allows 0 disruptions" in text_of(
        report, "pdb-blocks"
    )
    assert kinds(report, "ready")["cordoned"] == "warn"


def test_our_fault_taint_is_explained_by_its_record(
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    kube: Client,
    crds: None,
    fake_gpu_nodes: FakeNodes,
    namespace: str,
) -> None:
    (node,) = fake_gpu_nodes(1, labels={POOL_LABEL: namespace})
    taint(kube, node, {"key": TAINT_KEY, "value": "f-1", "effect": "NoSchedule"})
    code, report, table = diagnose(control_plane, capsys, node)
    assert code == exitcodes.FINDINGS and report["unread"] == []
    assert kinds(report, "gpus")["stale-fault-taint"] == "bad"
    assert f"kubectl taint node {node} {TAINT_KEY}-" in table

    name = fault_record_name(node, "f-1")
    spec = {
        "node": node,
        "faultID": "f-1",
        "scope": "node",
        "source": "test",
        "reason": "XidCritical79",
        "severity": "P0",
    }
    kube.create(
        GPUFault.from_dict(
            {
                "apiVersion": "gpuheal.io/v1alpha1",
                "kind": "GPUFault",
                "metadata": {"name": name, "labels": {"gpuheal.io/node": node}},
                "spec": spec,
            }
        )
    )
    try:
        kube.patch(
            GPUFault.Status, name, {"status": {"phase": "Quarantined"}}, patch_type=PatchType.MERGE
        )
        code, report, table = diagnose(control_plane, capsys, node)
        assert kinds(report, "gpus")["quarantined"] == "bad"
        assert "fault f-1 (XidCritical79, phase Quarantined)" in table
        assert f"kubectl get gpufault {name}" in table
        # The node's fault history, from the records that remain (a closed one too).
        past = PastFault(node, "f-0", dt.datetime.now(dt.UTC) - dt.timedelta(days=3))
        create_past_faults(control_plane.kubeconfig, [past])
        code, report, table = diagnose(control_plane, capsys, node)
        assert [(h["faultId"], h["phase"]) for h in report["history"]] == [
            ("f-1", "Quarantined"),
            ("f-0", "Resolved"),
        ]
        assert report["history"][1]["done"] == "detected, tainted, untainted"
        assert "Fault history (newest first)" in table
    finally:
        kube.delete(GPUFault, name)
        kube.delete(GPUFault, fault_record_name(node, "f-0"))
