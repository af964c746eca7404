"""Repair after the drain, end to end on the real control plane: the controller
requests, the real agent (fake NVML backend) resets its GPU or asks for a reboot
(the sim's reboot: new boot id, fresh kernel log, agent restart), the normal path
returns the node; exactly once through a controller SIGKILL and an agent restart;
escalation to a person; the budget in a storm; propose mode; a repair that waits
for `gpuheal approve` (or is rejected)."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal.model import (
    DISRUPTION_GUARD,
    DO_NOT_DISRUPT,
    FAULT_DEVICES,
    FAULT_ID,
    FAULT_REASON,
    FAULT_SEVERITY,
    FAULT_TIME,
    REPAIR_REQUEST,
    REPAIR_RESULT,
    SCALE_DOWN_DISABLED,
    STATUS,
)
from gpuheal.policy.repairwire import Outcome, decode_request, decode_result, fault_digest
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.controlplane import ADMIN
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from gpuheal.xid import Action
from tests.corpus import GPU_UUIDS
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    node_annotations,
    our_taint,
    pods_on,
    record_entries,
)
from tests.integration.test_approval import TOKEN, gpuheal, post

pytestmark = pytest.mark.timeout(240)

# NVIDIA: an uncontained ECC error, RESET_GPU (a contained one, 94, restarts the application).
XID_95 = (
    "NVRM: Xid (PCI:0000:18:00): 95, pid=2843, name=python3, Uncontained: SM MMU (0x1). "
    "RST: Yes, D-RST: No"
)
XID_79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=2843, name=python3, GPU has fallen off the bus."
GUARD_KEYS = (SCALE_DOWN_DISABLED, DO_NOT_DISRUPT)  # autoscalers.doNotDisrupt's default
AGENT = {"repairEnabled": True, "repairPollSeconds": 0.2, "repairRebootMethod": "sentinel"}


def repair_config(pool: dict[str, str], **repair: Any) -> dict[str, Any]:
    return controller_config(
        pool,
        p1EscalationSeconds=0,  # a P1 fault is acted on at once here
        repair={"enabled": True, "mode": "act", "settleSeconds": 1, **repair},
    )


def phase(kube: Client, name: str) -> str:
    status: Any = kube.get(GPUFault, name).status or {}
    return str(status.get("phase", ""))


def one_record(kube: Client, node: str) -> Any:
    (record,) = faults_of(kube, node)
    return record


def held(kube: Client, node: str) -> Any:
    """The node's record once it says contact support."""
    records = faults_of(kube, node)  # none yet until the controller sees the report
    ok = len(records) == 1 and (records[0].status or {}).get("contactSupport")
    return records[0] if ok else None


def proposed(kube: Client, node: str) -> Any:
    records = faults_of(kube, node)  # none yet until the controller sees the report
    return records[0] if len(records) == 1 and record_entries(records[0], "would-repair") else None


def test_xid_95_is_reset_by_the_agent_once_through_a_controller_kill_and_an_agent_restart(
    control_plane: ControlPlane,
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    agents: list[AgentProcess],
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_pod("train-0", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)
    config = repair_config(pool)
    # Killed right after it writes the request, before the record says so.
    doomed = start_controller(config, env={"GPUHEAL_CRASH_AFTER": "RequestRepair"})
    agent = AgentProcess(tmp_path, control_plane.kubeconfig, node, AGENT).start()
    agents.append(agent)
    gpu = agent.spec["devices"][0]["uuid"]

    agent.kernel(XID_95)
    wait_for("the node quarantined", lambda: our_taint(kube, node) is not None, timeout_s=30)
    wait_for("drained", lambda: not pods_on(kube, namespace, node), timeout_s=60)
    assert doomed.wait_exit(60) == -9, "the controller was not killed after its request"
    fault_id = node_annotations(kube, node)[FAULT_ID]
    request = decode_request(node_annotations(kube, node).get(REPAIR_REQUEST))
    assert request is not None and request.action is Action.RESET_GPU
    assert request.fault == fault_digest(fault_id) and request.attempt == 1
    # The agent is restarted during the repair, and a new controller takes over.
    agent.kill()
    agent.start()
    start_controller(config)

    wait_for("the node returned", lambda: our_taint(kube, node) is None, timeout_s=90)
    record = one_record(kube, node)
    wait_for("record Resolved", lambda: phase(kube, record.metadata.name) == "Resolved")
    record = one_record(kube, node)
    assert agent.resets() == [(gpu, "ok")]  # one reset, of the fault's GPU
    final = node_annotations(kube, node)
    assert decode_request(final[REPAIR_REQUEST]) == request  # never asked again
    result = decode_result(final[REPAIR_RESULT])
    assert result is not None and result.answers(request) and result.outcome is Outcome.DONE
    assert len(record_entries(record, "repair-requested")) == 1
    (repaired,) = record_entries(record, "repaired")
    assert repaired["detail"].startswith("reset-gpu attempt 1:") and gpu in repaired["detail"]
    assert not record_entries(record, "repair-failed")
    assert len(events_for(kube, node, "GPUFaultRepaired", at_least=1)) == 1
    assert len(events_for(kube, node, "GPUFaultRecovered", at_least=1)) == 1
    assert FAULT_ID not in final  # the agent's next rounds cleared the fault


def test_xid_79_is_repaired_by_a_reboot_and_the_node_returned(
    control_plane: ControlPlane,
    kube: Client,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    agents: list[AgentProcess],
    start_controller: StartController,
    audited_controller_user: str,
) -> None:
    """The autoscalers are kept off the node from the request until it is returned
    (the reboot, the recovery window, the gate): one write sets the guard, one takes
    it back, as the API server's audit log has the controller's node patches."""
    (node,) = fake_gpu_nodes(1, labels=pool)
    since = audit.offset(control_plane.audit_log)
    # The agent's healthy rounds after the reboot come within settleSeconds: the
    # repair is not taken for an ineffective one (which ends the ladder of one reboot).
    config = repair_config(pool) | {"repair": repair_config(pool)["repair"] | {"settleSeconds": 30}}
    start_controller(config, user=audited_controller_user).wait_leading()
    agent = AgentProcess(tmp_path, control_plane.kubeconfig, node, AGENT).start()
    agents.append(agent)

    agent.kernel(XID_79)
    wait_for("the reboot asked for", agent.reboot_sentinel.exists, timeout_s=60)
    asked = node_annotations(kube, node)
    request = decode_request(asked[REPAIR_REQUEST])
    assert request is not None and request.action is Action.REBOOT
    # Set before the request, in the same pass: the node carries both while it reboots.
    assert {k: asked.get(k) for k in GUARD_KEYS} == dict.fromkeys(GUARD_KEYS, "true")
    assert asked[DISRUPTION_GUARD] == ",".join(GUARD_KEYS)
    assert REPAIR_RESULT not in node_annotations(kube, node)  # answered once the node is back
    # The reboot daemon's part.
    agent.stop()
    agent.reboot()
    agent.start()

    wait_for("the node returned", lambda: our_taint(kube, node) is None, timeout_s=90)
    record = one_record(kube, node)
    wait_for("record Resolved", lambda: phase(kube, record.metadata.name) == "Resolved")
    record = one_record(kube, node)
    result = decode_result(node_annotations(kube, node)[REPAIR_RESULT])
    assert result is not None and result.outcome is Outcome.DONE and "rebooted" in result.detail
    assert [e["detail"].split(":")[0] for e in record_entries(record, "repaired")] == [
        "reboot attempt 1"
    ]
    assert agent.resets() == []
    # Taken back with the node's return, and only then.
    wait_for("the guard taken back", lambda: DISRUPTION_GUARD not in node_annotations(kube, node))
    assert not set(GUARD_KEYS) & set(node_annotations(kube, node))
    patches = [
        (r.body or {}).get("metadata", {}).get("annotations", {})
        for r in audit.requests(control_plane.audit_log, user=audited_controller_user, since=since)
        if r.verb == "patch" and r.resource == "nodes" and r.name == node and r.code == 200
    ]
    guard_writes = [p[DISRUPTION_GUARD] for p in patches if DISRUPTION_GUARD in p]
    assert guard_writes == [",".join(GUARD_KEYS), None], guard_writes


def test_a_reset_that_fails_twice_escalates_to_a_reboot_then_to_a_person(
    control_plane: ControlPlane,
    kube: Client,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    agents: list[AgentProcess],
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    start_controller(repair_config(pool))
    agent = AgentProcess(tmp_path, control_plane.kubeconfig, node, AGENT)
    agents.append(agent)
    # A pending row remap that no reset of this GPU clears, nor a reboot.
    agent.set_device(0, remappedRows={"pending": True, "failure": False}, resetFailures=2)
    agent.start()
    gpu = agent.spec["devices"][0]["uuid"]

    wait_for("the reboot asked for", agent.reboot_sentinel.exists, timeout_s=90)
    assert agent.resets() == [(gpu, "failed"), (gpu, "failed")]
    agent.stop()
    agent.reboot()
    agent.start()

    record = wait_for("contact support", lambda: held(kube, node), timeout_s=60)
    steps = [
        (e["action"], e["result"], e["detail"].split(":")[0])
        for e in record.status["actions"]
        if e["action"].startswith("repair")
    ]
    assert steps == [
        ("repair-requested", "waiting", "reset-gpu attempt 1"),
        ("repair-failed", "failed", "reset-gpu attempt 1"),
        ("repair-requested", "waiting", "reset-gpu attempt 2"),
        ("repair-failed", "failed", "reset-gpu attempt 2"),
        ("repair-requested", "waiting", "reboot attempt 3"),
        ("repaired", "ok", "reboot attempt 3"),
        ("repair-failed", "ineffective", "reboot attempt 3"),
        ("repair-exhausted", "contact-support", "3 repair attempt(s) did not clear the fault"),
    ]
    assert len(events_for(kube, node, "GPUContactSupport", at_least=1)) == 1
    assert len(events_for(kube, node, "GPUFaultRepairFailed", at_least=3)) == 3
    time.sleep(2)  # held: no more requests, the taint stays
    last = decode_request(node_annotations(kube, node)[REPAIR_REQUEST])
    assert last is not None and last.attempt == 3
    assert our_taint(kube, node) is not None
    assert agent.resets() == [(gpu, "failed"), (gpu, "failed")]


REPORT_KEYS = (STATUS, FAULT_ID, FAULT_TIME, FAULT_REASON, FAULT_DEVICES, FAULT_SEVERITY)


def report(kube: Client, node: str, fault_id: str) -> None:
    """The agent's report of a reset-worthy fault on one GPU, written by hand."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    said = {
        STATUS: "faulty",
        FAULT_ID: fault_id,
        FAULT_TIME: now,
        FAULT_REASON: "EccUncontained95",
        FAULT_DEVICES: GPU_UUIDS[0],
        FAULT_SEVERITY: "P0",
    }
    kube.patch(Node, node, {"metadata": {"annotations": said}})


def test_a_storm_of_repairable_faults_never_exceeds_the_repair_budget(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    """No agent answers on its own here: the test answers each request, one at a time,
    and counts the requests in flight all along."""
    nodes = fake_gpu_nodes(20, labels=pool)
    start_controller(repair_config(pool, maxConcurrent=2))
    most = 0
    stop = threading.Event()

    def in_flight() -> list[str]:
        flying = []
        selector: dict[str, Any] = dict(pool)
        for node in kube.list(Node, labels=selector):
            said = dict((node.metadata.annotations if node.metadata else None) or {})
            request = decode_request(said.get(REPAIR_REQUEST))
            result = decode_result(said.get(REPAIR_RESULT))
            if request is not None and (result is None or not result.answers(request)):
                flying.append(str(node.metadata.name))  # type: ignore[union-attr]
        return flying

    def count() -> None:
        nonlocal most
        while not stop.is_set():
            most = max(most, len(in_flight()))
            time.sleep(0.05)

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    try:
        for i, node in enumerate(nodes):
            report(kube, node, f"storm-{i}")
        answered: set[str] = set()
        while len(answered) < len(nodes):
            flying = wait_for("a request", in_flight, timeout_s=30)
            time.sleep(0.5)  # room for a request past the budget, if one were made
            assert len(in_flight()) <= 2
            node = flying[0]
            request = decode_request(node_annotations(kube, node)[REPAIR_REQUEST])
            assert request is not None and request.attempt == 1
            done = f"{request.action.value};{request.fault};1;done;{request.time};reset by the test"
            # As the agent: the result, and (its next rounds healthy) the fault cleared.
            cleared: dict[str, str | None] = {k: None for k in REPORT_KEYS}
            body = {"metadata": {"annotations": {**cleared, REPAIR_RESULT: done}}}
            kube.patch(Node, node, body)
            answered.add(node)
    finally:
        stop.set()
        counter.join(5)
    assert most == 2


def test_propose_mode_records_what_would_be_done_and_asks_nothing_of_the_agent(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    start_controller(repair_config(pool, mode="propose"))
    report(kube, node, "proposed-fault")
    record = wait_for("the proposal", lambda: proposed(kube, node), timeout_s=30)
    (proposal,) = record_entries(record, "would-repair")
    assert proposal["detail"] == f"reset-gpu attempt 1: reset {GPU_UUIDS[0]}"
    time.sleep(1.5)
    assert REPAIR_REQUEST not in node_annotations(kube, node)
    assert len(record_entries(one_record(kube, node), "would-repair")) == 1
    assert len(events_for(kube, node, "GPUFaultRepairProposed", at_least=1)) == 1


def awaiting(kube: Client, node: str) -> Any:
    """The node's record once its repair awaits approval."""
    records = faults_of(kube, node)
    return (
        records[0] if records and record_entries(records[0], "repair-awaiting-approval") else None
    )


def test_an_approval_required_reset_waits_for_gpuheal_approve_then_is_done_once(
    control_plane: ControlPlane,
    kube: Client,
    pool: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake_gpu_nodes: FakeNodes,
    agents: list[AgentProcess],
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    # settleSeconds: time for the agent's healthy rounds after the reset (no attempt 2).
    start_controller(repair_config(pool, approval=["reset-gpu"], settleSeconds=30))
    agent = AgentProcess(tmp_path, control_plane.kubeconfig, node, AGENT).start()
    agents.append(agent)
    gpu = agent.spec["devices"][0]["uuid"]

    agent.kernel(XID_95)
    record = wait_for("the approval asked", lambda: awaiting(kube, node), timeout_s=60)
    name = record.metadata.name
    assert record.status["repairApproval"]["attempt"] == 1
    assert record.status["repairApproval"]["action"] == "reset-gpu"
    (asked,) = record_entries(record, "repair-awaiting-approval")
    assert asked["detail"] == f"reset-gpu attempt 1: reset {gpu}"
    wait_for("the Event", lambda: events_for(kube, node, "GPUFaultRepairAwaitingApproval"))
    time.sleep(2)  # whatever the controller would do unasked, it would have done by now
    assert REPAIR_REQUEST not in node_annotations(kube, node)
    assert agent.resets() == [] and our_taint(kube, node) is not None

    code, out, err = gpuheal(control_plane, capsys, "approve", name)
    assert code == 0, err
    answered = json.loads(out)
    assert (answered["decision"], answered["by"]) == ("approved", ADMIN)
    assert answered["repair"] == {"action": "reset-gpu", "attempt": 1}

    wait_for("the node returned", lambda: our_taint(kube, node) is None, timeout_s=90)
    wait_for("record Resolved", lambda: phase(kube, name) == "Resolved")
    record = one_record(kube, node)
    assert agent.resets() == [(gpu, "ok")]  # one reset, after the approval
    assert len(record_entries(record, "repair-requested")) == 1
    (approved,) = record_entries(record, "repair-approved")
    assert approved["detail"].startswith(f"reset-gpu attempt 1: approved by {ADMIN} at ")
    assert record.status["repairApproval"]["by"] == ADMIN
    assert len(events_for(kube, node, "GPUFaultRepairApproved", at_least=1)) == 1
    assert len(record_entries(record, "repaired")) == 1
    # Answered and acted on: a second answer is refused, and changes nothing.
    code, _, err = gpuheal(control_plane, capsys, "approve", name)
    assert code == 2 and "not awaiting approval" in err, err


def test_a_repair_rejected_through_the_api_is_recorded_nothing_is_asked_and_the_node_stays_held(
    kube: Client,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = repair_config(pool, approval=["reset-gpu", "reboot"])
    controller = start_controller(config | {"apiTokenFile": str(token_file)})
    controller.wait_leading()
    report(kube, node, "rejected-repair")
    record = wait_for("the approval asked", lambda: awaiting(kube, node), timeout_s=30)
    name = record.metadata.name

    code, body = post(controller, f"/api/v1/faults/{name}/reject")
    assert code == 200, body
    assert body["repair"] == {"action": "reset-gpu", "attempt": 1}
    record = wait_for("contact support", lambda: held(kube, node), timeout_s=30)
    (rejected,) = record_entries(record, "repair-rejected")
    assert rejected["detail"].startswith("reset-gpu attempt 1: rejected by api-token at ")
    (exhausted,) = record_entries(record, "repair-exhausted")
    assert exhausted["result"] == "contact-support"
    assert len(events_for(kube, node, "GPUFaultRepairRejected", at_least=1)) == 1
    assert len(events_for(kube, node, "GPUContactSupport", at_least=1)) == 1
    time.sleep(1.5)
    assert REPAIR_REQUEST not in node_annotations(kube, node)  # nothing asked of the node
    assert our_taint(kube, node) is not None
    assert not record_entries(one_record(kube, node), "repair-requested")
    # Answered once: a second answer is refused.
    code, body = post(controller, f"/api/v1/faults/{name}/approve")
    assert code == 409 and "already rejected" in body["error"]
