"""The validation Job on the real control plane: the Job controller makes its pod,
the scheduler places it (or says why not), kwok plays its container
(gpuheal/sim/stages.py). A recovered node returns only after its Job passes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node

from gpuheal.cli import main
from gpuheal.sim import ControlPlane
from gpuheal.sim.audit import offset, requests
from gpuheal.sim.stages import EXIT_CODE_ENV, HANG_ENV, MESSAGE_ENV
from gpuheal.values import node_label
from tests.conftest import AUDITED_CONTROLLER
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    clear_fault,
    controller_config,
    entries_of,
    events_for,
    faults_of,
    our_taint,
    report_fault,
)

pytestmark = pytest.mark.timeout(180)

NAMESPACE = "gpuheal-system"  # the crds fixture makes it
PASS = {"result": "pass", "tool": "dcgmi-diag", "detail": "dcgmi diag -r 2: 8 GPUs, all tests pass"}
FAIL = {
    "result": "fail",
    "tool": "dcgmi-diag",
    "detail": "Memory test failed on GPU 3: HBM row remap",
}


def validating(pool: dict[str, str], env: dict[str, str], **validation: Any) -> dict[str, Any]:
    settings = {"enabled": True, "namespace": NAMESPACE, "timeoutSeconds": 60, **validation}
    return controller_config(pool, healthGate={"validation": {**settings, "env": env}})


def jobs_of(kube: Client, node: str) -> list[Job]:
    return list(kube.list(Job, namespace=NAMESPACE, labels={"gpuheal.io/node": node_label(node)}))


def recover(kube: Client, node: str, fault_id: str) -> None:
    """A fault quarantines the node, then clears: its recovery begins."""
    report_fault(kube, node, fault_id)
    wait_for("tainted", lambda: our_taint(kube, node))
    clear_fault(kube, node)


def test_a_passing_validation_returns_the_node(
    kube: Client, pool: dict[str, str], fake_gpu_nodes: FakeNodes, start_controller: StartController
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    start_controller(validating(pool, {EXIT_CODE_ENV: "0", MESSAGE_ENV: json.dumps(PASS)}))
    recover(kube, node, "f-pass")

    wait_for("untainted", lambda: our_taint(kube, node) is None)
    (started,) = entries_of(kube, "validation-start", node=node)
    assert "on 8 nvidia.com/gpu" in started["detail"]
    (passed,) = wait_for(
        "passed in the record", lambda: entries_of(kube, "validation-passed", node=node)
    )
    assert "dcgmi-diag: dcgmi diag -r 2: 8 GPUs, all tests pass: pass" in passed["detail"]
    assert entries_of(kube, "untaint", node=node)
    assert events_for(kube, node, "GPUValidationStarted", at_least=1)
    assert events_for(kube, node, "GPUValidationPassed", at_least=1)
    wait_for("the Job deleted", lambda: not jobs_of(kube, node))


def test_a_failing_validation_keeps_the_node_out_with_the_failure_in_its_record(
    kube: Client, pool: dict[str, str], fake_gpu_nodes: FakeNodes, start_controller: StartController
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    start_controller(validating(pool, {EXIT_CODE_ENV: "1", MESSAGE_ENV: json.dumps(FAIL)}))
    recover(kube, node, "f-fail")

    (failed,) = wait_for(
        "failed in the record", lambda: entries_of(kube, "validation-failed", node=node)
    )
    assert (
        "dcgmi-diag: Memory test failed on GPU 3: HBM row remap: fail (exited 1"
        in (failed["detail"])
    )
    (event,) = wait_for("the Event", lambda: events_for(kube, node, "GPUHealthGateFailed"))
    assert "validation" in (event.message or "") and "HBM row remap" in (event.message or "")
    wait_for("the Job deleted", lambda: not jobs_of(kube, node))
    time.sleep(2)  # the node is looked at again (holdRetrySeconds): it stays out
    assert our_taint(kube, node) is not None
    (record,) = faults_of(kube, node)
    assert record.status["phase"] == "Recovering"
    assert (
        len(entries_of(kube, "validation-start", node=node)) == 1
    )  # retried after retrySeconds only


def test_a_validation_that_never_finishes_times_out_and_says_so(
    kube: Client, pool: dict[str, str], fake_gpu_nodes: FakeNodes, start_controller: StartController
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    start_controller(validating(pool, {HANG_ENV: "1"}, timeoutSeconds=4))
    recover(kube, node, "f-hang")

    # While it runs: the Job as specified, its pod placed on the node.
    (job,) = wait_for("the Job", lambda: jobs_of(kube, node))
    spec: dict[str, Any] = job.to_dict()["spec"]
    assert spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
    tolerated = {t["key"] for t in pod["tolerations"]}
    assert tolerated >= {"gpuheal.io/gpu-fault", "gpuheal.io/maintenance"}
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}

    (failed,) = wait_for(
        "timed out in the record",
        lambda: entries_of(kube, "validation-failed", node=node),
        timeout_s=30,
    )
    assert "timed out after 4s without a result: its pod Running" in failed["detail"]
    wait_for("the Job deleted", lambda: not jobs_of(kube, node))
    assert our_taint(kube, node) is not None


def test_a_validation_pod_that_cannot_start_keeps_the_node_out_and_says_why(
    kube: Client, pool: dict[str, str], fake_gpu_nodes: FakeNodes, start_controller: StartController
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    # A taint the Job does not tolerate: the scheduler will not place its pod.
    reserved = {"key": "example.com/reserved", "value": "team-a", "effect": "NoSchedule"}
    kube.patch(Node, node, {"spec": {"taints": [reserved]}})
    validation = validating(
        pool, {EXIT_CODE_ENV: "0", MESSAGE_ENV: json.dumps(PASS)}, scheduleTimeoutSeconds=3
    )
    start_controller(validation)
    recover(kube, node, "f-unschedulable")

    (failed,) = wait_for(
        "failed in the record", lambda: entries_of(kube, "validation-failed", node=node)
    )
    assert "the validation pod cannot start after 3s: 0/1 nodes are available" in failed["detail"]
    assert "untolerated taint" in failed["detail"]
    wait_for("the Job deleted", lambda: not jobs_of(kube, node))
    assert our_taint(kube, node) is not None


def test_a_restart_after_the_job_is_created_makes_no_second_job(
    kube: Client,
    control_plane: ControlPlane,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    audited_controller_user: str,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    config = validating(pool, {EXIT_CODE_ENV: "0", MESSAGE_ENV: json.dumps(PASS)})
    since = offset(control_plane.audit_log)
    doomed = start_controller(
        config, user=audited_controller_user, env={"GPUHEAL_CRASH_AFTER": "CreateValidationJob"}
    )
    recover(kube, node, "f-crash")
    assert doomed.wait_exit(60) == -9, "the crashpoint was not reached"
    assert not entries_of(
        kube, "validation-start", node=node
    )  # killed before the record was written

    start_controller(config, user=audited_controller_user)
    wait_for("untainted", lambda: our_taint(kube, node) is None)
    creates = [
        r.code
        for r in requests(control_plane.audit_log, user=AUDITED_CONTROLLER, since=since)
        if r.verb == "create" and r.resource == "jobs" and r.namespace == NAMESPACE
    ]
    # The first controller made it; its successor asked for the same name and found it.
    assert creates == [201, 409]
    assert len(entries_of(kube, "validation-start", node=node)) == 1


def gate(
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    config: Path,
    *argv: str,
) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main([*argv, "--config", str(config), "--kubeconfig", str(control_plane.kubeconfig)])
    said = capsys.readouterr()
    assert said.out, (code, said.err)
    return code, json.loads(said.out)


def cli_config(tmp_path: Path, pool: dict[str, str], env: dict[str, str]) -> Path:
    path = tmp_path / "gpuheal.yaml"
    validation = {"namespace": NAMESPACE, "timeoutSeconds": 60, "env": env}
    path.write_text(
        yaml.safe_dump({"nodeSelector": pool, "healthGate": {"validation": validation}})
    )
    return path


def test_gate_validate_runs_the_job_reads_its_result_and_deletes_it(
    kube: Client,
    control_plane: ControlPlane,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    crds: None,  # and the namespace the Jobs run in
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    failing = cli_config(tmp_path, pool, {EXIT_CODE_ENV: "1", MESSAGE_ENV: json.dumps(FAIL)})
    code, report = gate(control_plane, capsys, failing, "gate", node, "--validate", "-o", "json")
    assert code == 64 | 16
    (validation,) = [c for c in report["checks"] if c["name"] == "validation"]
    assert (
        validation["result"] == "fail" and "HBM row remap: fail (exited 1" in validation["reason"]
    )
    assert not jobs_of(kube, node)  # deleted once read

    passing = cli_config(tmp_path, pool, {EXIT_CODE_ENV: "0", MESSAGE_ENV: json.dumps(PASS)})
    code, report = gate(control_plane, capsys, passing, "gate", node, "--validate", "-o", "json")
    assert code == 0, report
    (validation,) = [c for c in report["checks"] if c["name"] == "validation"]
    assert validation["result"] == "pass" and "dcgmi-diag" in validation["reason"]

    # Without --validate nothing runs: the check is skipped and says how to run it.
    code, report = gate(control_plane, capsys, passing, "gate", node, "-o", "json")
    (validation,) = [c for c in report["checks"] if c["name"] == "validation"]
    assert code == 0 and validation["result"] == "skipped" and "--validate" in validation["reason"]
    assert not jobs_of(kube, node)


def test_maintenance_finish_validate_returns_the_node_only_after_its_job_passes(
    kube: Client,
    control_plane: ControlPlane,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    start_controller: StartController,
) -> None:
    """The controller carries out the finish, so its config says how the Job runs:
    a failing one keeps the node out; after a controller with a passing one takes
    over, the same request returns it."""
    (node,) = fake_gpu_nodes(1, labels=pool)
    failing_env = {EXIT_CODE_ENV: "1", MESSAGE_ENV: json.dumps(FAIL)}
    passing_env = {EXIT_CODE_ENV: "0", MESSAGE_ENV: json.dumps(PASS)}
    first = start_controller(validating(pool, failing_env, enabled=False)).wait_leading()
    failing = cli_config(tmp_path, pool, failing_env)
    start = ("maintenance", "start", node, "--reason", "driver 550.54.15", "--no-drain")
    code, _ = gate(control_plane, capsys, failing, *start, "-o", "json")
    assert code == 0

    code, report = gate(
        control_plane, capsys, failing, "maintenance", "finish", node, "--validate", "-o", "json"
    )
    assert code == 64 | 16 and report["finished"] is False
    assert "gpuheal.io/maintenance" in {t.key for t in kube.get(Node, node).spec.taints or ()}  # type: ignore[union-attr]

    first.stop()
    start_controller(validating(pool, passing_env, enabled=False)).wait_leading()
    code, report = gate(
        control_plane, capsys, failing, "maintenance", "finish", node, "--validate", "-o", "json"
    )
    assert code == 0 and report["finished"] is True, report
    assert not jobs_of(kube, node)
