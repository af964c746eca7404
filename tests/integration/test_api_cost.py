"""What one remediation costs the API server, counted on the server's side.

A node with 8 GPU pods reports a fault; the controller (as the audited user)
taints it, evicts the pods and marks the fault handled. Its requests are read
back from the API server's audit log: the Lease heartbeat aside, the whole
remediation takes at most 12 requests, and at most 2 (the record that locks
the fault, then the taint) reach the server before the taint does.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from lightkube import Client

from gpuheal.kube.resources import GPUFault
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    faults_of,
    handled_fault,
    our_taint,
    pods_on,
    report_fault,
)

pytestmark = pytest.mark.timeout(180)

GPU_PODS = 8
MAX_REQUESTS = 12  # the whole remediation, Lease heartbeat aside (issue 17)
MAX_BEFORE_TAINT = 2  # the record (the fault's lock), then the taint itself
QUIET_S = 2.0  # after the record says Drained: anything still queued (Events) lands


def _phase(kube: Client, name: str) -> str:
    status: Any = kube.get(GPUFault, name).status or {}
    return str(status.get("phase", ""))


def test_one_remediation_of_a_node_with_8_gpu_pods_costs_at_most_12_requests(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    audited_controller_user: str,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    for i in range(GPU_PODS):
        apply(kube, gpu_pod(f"llama-70b-{i}", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=GPU_PODS)
    start_controller(controller_config(pool), user=audited_controller_user).wait_leading()
    time.sleep(QUIET_S)  # the start's lists and watches are behind us
    since = audit.offset(control_plane.audit_log)

    report_fault(kube, node, "xid-79-gpu-fell-off-the-bus")
    wait_for("the taint", lambda: our_taint(kube, node) is not None, timeout_s=30)
    wait_for("the GPU pods gone", lambda: not pods_on(kube, namespace, node))
    wait_for("handled", lambda: handled_fault(kube, node) == "xid-79-gpu-fell-off-the-bus")
    (record,) = faults_of(kube, node)
    wait_for("record Drained", lambda: _phase(kube, str(record.metadata.name)) == "Drained")
    time.sleep(QUIET_S)

    made = [
        r
        for r in audit.requests(control_plane.audit_log, user=audited_controller_user, since=since)
        if r.resource != "leases"
    ]
    counts = Counter(f"{r.verb} {r.resource}" for r in made)
    taint_at = next(
        i for i, r in enumerate(made) if (r.verb, r.resource, r.name) == ("patch", "nodes", node)
    )
    before_taint = Counter(f"{r.verb} {r.resource}" for r in made[: taint_at + 1])
    print(f"remediation: {len(made)} requests {dict(sorted(counts.items()))}")
    print(f"up to the taint: {taint_at + 1} {dict(sorted(before_taint.items()))}")

    assert counts["create pods/eviction"] == GPU_PODS  # each pod once, none twice
    assert sum(before_taint.values()) <= MAX_BEFORE_TAINT, before_taint
    assert len(made) <= MAX_REQUESTS, counts
