"""Observe mode on the real control plane: the controller writes nothing to Nodes
or Pods (counted in the API server's audit log), while its records, and
`gpuheal status`'s "would have" report from them, say what it would have done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal.cli import main
from gpuheal.model import FAULT_SEVERITY
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from tests.conftest import AUDITED_CONTROLLER
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    our_taint,
    pods_on,
    report_fault,
)

pytestmark = pytest.mark.timeout(240)

WRITES = {"create", "update", "patch", "delete", "deletecollection"}
NODE_AND_POD = {"nodes", "nodes/status", "pods", "pods/status", "pods/eviction", "pods/binding"}


def noted(kube: Client, node: str) -> bool:
    """The node's record has its would-quarantine entry."""
    records = faults_of(kube, node)
    return len(records) == 1 and any(
        a["action"] == "would-quarantine" for a in (records[0].status or {}).get("actions", [])
    )


def test_observe_mode_writes_no_node_or_pod_and_reports_what_it_would_have_done(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    audited_controller_user: str,
) -> None:
    busy, idle, warm, healthy = fake_gpu_nodes(4, labels=pool)
    pods = {busy: ("trainer-0", "trainer-1"), idle: (), warm: ("notebook-0",), healthy: ("web-0",)}
    for node, names in pods.items():
        for name in names:
            apply(kube, gpu_pod(name, namespace, node_name=node))
    wait_pods_running(kube, namespace, count=4)
    since = audit.offset(control_plane.audit_log)
    start_controller(controller_config(pool, mode="observe"), user=AUDITED_CONTROLLER)
    report_fault(kube, busy, "xid-79-gpu-fell-off-the-bus")
    report_fault(kube, idle, "xid-48-dbe")
    # A P1 inside its observation window: it would not have been acted on yet.
    kube.patch(Node, warm, {"metadata": {"annotations": {FAULT_SEVERITY: "P1"}}})
    report_fault(kube, warm, "thermal-96c", reason="Thermal")

    wait_for("the would-quarantine notes", lambda: noted(kube, busy) and noted(kube, idle))
    wait_for("the P1's record", lambda: len(faults_of(kube, warm)) == 1)
    wait_for("the Events", lambda: events_for(kube, busy, "GPUFaultDetected"))
    assert not noted(kube, warm)
    (record,) = faults_of(kube, busy)
    assert record.status["plan"]["evict"] == [f"{namespace}/trainer-0", f"{namespace}/trainer-1"]

    writes = [
        f"{r.verb} {r.resource} {r.name}"
        for r in audit.requests(control_plane.audit_log, user=AUDITED_CONTROLLER, since=since)
        if r.verb in WRITES and r.resource in NODE_AND_POD
    ]
    fault_writes = [
        r
        for r in audit.requests(control_plane.audit_log, user=AUDITED_CONTROLLER, since=since)
        if r.verb in WRITES and r.resource.startswith("gpufaults")
    ]
    print(f"controller writes to Nodes and Pods: {writes}; to GPUFaults: {len(fault_writes)}")
    assert fault_writes  # the audit log does see this controller's writes
    assert writes == []
    for node, names in pods.items():
        assert our_taint(kube, node) is None
        assert pods_on(kube, namespace, node) == set(names)

    config = tmp_path / "gpuheal.yaml"
    config.write_text(yaml.safe_dump({"nodeSelector": pool}))
    capsys.readouterr()
    selector = ",".join(f"{k}={v}" for k, v in pool.items())
    argv = ["status", "-l", selector, "-o", "json", "--config", str(config)]
    code = main([*argv, "--kubeconfig", str(control_plane.kubeconfig)])
    out = capsys.readouterr().out
    assert code == 0
    would = json.loads(out)["wouldHave"]
    assert (would["quarantinedNodes"], would["evictedPods"], would["faults"]) == (2, 2, 2)
    assert would["nodes"] == sorted([busy, idle])
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps at the terminal width
    capsys.readouterr()
    main([*argv[:3], "--config", str(config), "--kubeconfig", str(control_plane.kubeconfig)])
    said = "would have quarantined 2 node(s), evicted 2 pod(s) in the last 24 h"
    assert said in capsys.readouterr().out
