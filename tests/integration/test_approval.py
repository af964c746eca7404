"""Approval mode on the real control plane: nothing moves until a person approves,
an approval acts exactly once, a rejection and an expiry are recorded, and an
approval for a fault that cleared meanwhile does nothing (docs/controller.md#approval)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client

from gpuheal.sim import ControlPlane
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.controlplane import ADMIN
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    clear_fault,
    controller_config,
    entries_of,
    events_for,
    faults_of,
    in_process_cli,
    our_taint,
    pods_on,
    report_fault,
)
from tests.integration.test_controller_resilience import one_leader

pytestmark = pytest.mark.timeout(240)

TOKEN = "approval-test-token-4f1c2a9e"


def status_of(kube: Client, name: str) -> dict[str, Any]:
    return dict(kube.get(GPUFault, name).get("status") or {})


def the_record(kube: Client, node: str, phase: str) -> str:
    """Wait for the node's one record to reach `phase`; its name."""

    def reached() -> bool:
        records = faults_of(kube, node)
        return len(records) == 1 and (records[0].status or {}).get("phase") == phase

    wait_for(f"the record {phase}", reached, timeout_s=30)
    return str(faults_of(kube, node)[0].metadata.name)


def gpuheal(
    control_plane: ControlPlane, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    """`gpuheal ARGS... -o json` in this process, as the admin: (exit code, stdout, stderr)."""
    return in_process_cli(control_plane.kubeconfig, capsys, "-o", "json")(*args)


def post(controller: ControllerProcess, path: str) -> tuple[int, Any]:
    request = urllib.request.Request(controller.url + path, data=b"", method="POST")  # noqa: S310
    request.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def approving(pool: dict[str, str], tmp_path: Path, expiry_s: float) -> dict[str, Any]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    approval = {"byReason": {"XidCritical79": True}, "expirySeconds": expiry_s}
    return controller_config(pool, approval=approval, apiTokenFile=str(token_file))


def test_nothing_moves_until_approved_then_exactly_one_remediation(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    for i in range(2):
        apply(kube, gpu_pod(f"trainer-{i}", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=2)
    start_controller(approving(pool, tmp_path, 600)).wait_leading()
    report_fault(kube, node, "xid-79-gpu-fell-off-the-bus")

    name = the_record(kube, node, "AwaitingApproval")
    plan = status_of(kube, name)["plan"]
    assert plan["evict"] == [f"{namespace}/trainer-0", f"{namespace}/trainer-1"]
    assert plan["node"] == node and plan["taint"].startswith("gpuheal.io/gpu-fault=")
    wait_for("the Event", lambda: events_for(kube, node, "GPUFaultAwaitingApproval"))
    time.sleep(2)  # whatever the controller would do unasked, it would have done by now
    assert our_taint(kube, node) is None
    assert pods_on(kube, namespace, node) == {"trainer-0", "trainer-1"}
    assert the_record(kube, node, "AwaitingApproval") == name

    code, out, err = gpuheal(control_plane, capsys, "approve", name)
    assert code == 0, err
    answered = json.loads(out)
    assert (answered["decision"], answered["by"], answered["node"]) == ("approved", ADMIN, node)
    assert answered["plan"] == plan  # as the controller wrote it, whole

    wait_for("the taint", lambda: our_taint(kube, node) is not None, timeout_s=30)
    wait_for("the drain", lambda: not pods_on(kube, namespace, node), timeout_s=30)
    the_record(kube, node, "Drained")
    (approved,) = entries_of(kube, "approved", name=name)
    assert f"by {ADMIN}" in approved["detail"]
    assert len(entries_of(kube, "taint", name=name)) == 1
    assert len(events_for(kube, node, "GPUFaultApproved", at_least=1)) == 1
    # Answered and acted on: a second answer is refused, and changes nothing.
    code, _, err = gpuheal(control_plane, capsys, "approve", "xid-79-gpu-fell-off-the-bus")
    assert code == 2 and "not awaiting approval" in err
    assert len(entries_of(kube, "approved", name=name)) == 1


def test_a_rejection_and_an_expiry_are_recorded_and_nothing_moves(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    rejected, ignored, by_api = fake_gpu_nodes(3, labels=pool)
    for i, node in enumerate((rejected, ignored, by_api)):
        apply(kube, gpu_pod(f"job-{i}", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=3)
    controller = start_controller(approving(pool, tmp_path, 8)).wait_leading()
    for node in (rejected, ignored, by_api):
        report_fault(kube, node, "xid-79-row-remap-failure")
    nodes = (rejected, ignored, by_api)
    names = {node: the_record(kube, node, "AwaitingApproval") for node in nodes}

    code, out, err = gpuheal(control_plane, capsys, "reject", names[rejected])
    assert code == 0, err
    assert json.loads(out)["decision"] == "rejected"
    # The fault id names three records: the API wants the one meant.
    assert post(controller, "/api/v1/faults/xid-79-row-remap-failure/reject")[0] == 409
    code, body = post(controller, f"/api/v1/faults/{names[by_api]}/reject")
    assert code == 200 and body["by"] == "api-token"

    the_record(kube, rejected, "Resolved")
    the_record(kube, by_api, "Resolved")
    (entry,) = entries_of(kube, "rejected", name=names[rejected])
    assert f"by {ADMIN}" in entry["detail"]
    assert "by api-token" in entries_of(kube, "rejected", name=names[by_api])[0]["detail"]
    assert events_for(kube, rejected, "GPUFaultRejected", at_least=1)

    the_record(kube, ignored, "Failed")  # expirySeconds: 8
    (expired,) = entries_of(kube, "approval-expired", name=names[ignored])
    assert expired["result"] == "expired"
    assert events_for(kube, ignored, "GPUFaultApprovalExpired", at_least=1)
    for i, node in enumerate((rejected, ignored, by_api)):
        assert our_taint(kube, node) is None
        assert pods_on(kube, namespace, node) == {f"job-{i}"}
    assert post(controller, f"/api/v1/faults/{names[ignored]}/approve")[0] == 409


def test_an_approval_for_a_fault_that_cleared_meanwhile_does_nothing(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_pod("trainer-0", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)
    controller = start_controller(approving(pool, tmp_path, 600)).wait_leading()
    report_fault(kube, node, "xid-79-transient")
    name = the_record(kube, node, "AwaitingApproval")
    clear_fault(kube, node)
    the_record(kube, node, "Resolved")
    (cleared,) = entries_of(kube, "recovered", name=name)
    assert "before approval" in cleared["detail"]

    code, _, err = gpuheal(control_plane, capsys, "approve", name)
    assert code == 2 and "Resolved, not awaiting approval" in err
    assert post(controller, f"/api/v1/faults/{name}/approve")[0] == 409
    time.sleep(1)
    assert "approval" not in status_of(kube, name)
    assert our_taint(kube, node) is None
    assert pods_on(kube, namespace, node) == {"trainer-0"}


def test_an_approval_sent_to_the_standby_is_the_leaders_once(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_pod("trainer-0", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)
    config = approving(pool, tmp_path, 600)
    group = [start_controller(config, identity=f"replica-{i}") for i in range(2)]
    (leader,) = wait_for("one leader", lambda: one_leader(group))
    (standby,) = [r for r in group if r is not leader]
    report_fault(kube, node, "xid-79-gpu-fell-off-the-bus")
    name = the_record(kube, node, "AwaitingApproval")

    code, body = post(standby, f"/api/v1/faults/{name}/approve")
    assert code == 200, body
    assert body["decision"] == "approved"
    wait_for("the drain", lambda: not pods_on(kube, namespace, node), timeout_s=30)
    assert (
        len(entries_of(kube, "approved", name=name)) == 1
        and len(entries_of(kube, "taint", name=name)) == 1
    )
    # Again through the standby: the leader's answer, passed back as it came.
    code, body = post(standby, f"/api/v1/faults/{name}/approve")
    assert code == 409, body
    assert len(entries_of(kube, "approved", name=name)) == 1
    # Unauthenticated, the standby refuses it itself: nothing reaches the leader.
    request = urllib.request.Request(  # noqa: S310
        f"{standby.url}/api/v1/faults/{name}/reject", data=b"", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310
    assert refused.value.code == 401
    assert standby.log().count('"forwarded to the leader"') == 2
