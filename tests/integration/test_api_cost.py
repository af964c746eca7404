"""What one remediation costs the API server, counted on the server's side.

A node with 8 GPU pods reports a fault; the controller (as the audited user)
taints it, evicts the pods and marks the fault handled. Its requests are read
back from the API server's audit log (the Lease heartbeat aside): the taint
reaches the server first and alone (the fence's pass); the drain's pass makes the
record that locks the fault, evicts, writes the record's status once and sends
its Events (one per step on the Node, one for all the pods it evicted); the last
pass marks the node handled and the record Drained. docs/BENCHMARKS.md has the
table.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from lightkube import Client

from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.resources import GPUFault
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
MAX_BEFORE_TAINT = 1  # the taint itself: the record (the fault's lock) follows it
# The whole remediation, by verb (27 requests before each pass wrote its record
# once and Events stopped coming per pod and per object).
EXPECTED = {
    "create gpufaults": 1,  # the lock
    "patch nodes": 2,  # taint + state label; the handled mark once drained
    "create pods/eviction": GPU_PODS,  # each pod once
    # The eviction pass (detect, taint and evict entries: the fence's pass left
    # them to it), Drained.
    "patch gpufaults/status": 2,
    "create events": 3,  # Detected, Quarantined, one for the 8 evictions
}
# No request of the controller's (the Lease aside) for this long: what it had queued
# (Events, the start's lists and watches) has landed. A condition, not a sleep: under
# load a late request starts the wait again (fixed 2 s sleeps failed once so).
QUIET_S = 2.0


def _phase(kube: Client, name: str) -> str:
    status: Any = kube.get(GPUFault, name).status or {}
    return str(status.get("phase", ""))


def _made(control_plane: ControlPlane, user: str, since: int) -> list[audit.Request]:
    """The user's requests since `since`, the Lease heartbeat aside."""
    found = audit.requests(control_plane.audit_log, user=user, since=since)
    return [r for r in found if r.resource != "leases"]


def _quiet(control_plane: ControlPlane, user: str, since: int) -> list[audit.Request]:
    """The user's requests since `since`, once none has come for QUIET_S."""
    deadline = time.monotonic() + 60
    made = _made(control_plane, user, since)
    changed = time.monotonic()
    while time.monotonic() - changed < QUIET_S:
        assert time.monotonic() < deadline, f"the controller never went quiet: {made[-5:]}"
        time.sleep(0.2)
        now = _made(control_plane, user, since)
        if len(now) != len(made):
            made, changed = now, time.monotonic()
    return made


def _reached(control_plane: ControlPlane, user: str, since: int, wanted: dict[str, int]) -> None:
    """Wait until the requests counted reach `wanted`, each at least: the rest of the
    remediation's writes (Events are sent behind a queue) have landed."""

    def counted() -> bool:
        counts = Counter(f"{r.verb} {r.resource}" for r in _made(control_plane, user, since))
        return all(counts[k] >= n for k, n in wanted.items())

    wait_for(f"the requests {wanted}", counted)


def _up_to_taint(made: list[audit.Request], node: str) -> Counter[str]:
    """The requests the server completed up to (and with) the first node PATCH."""
    at = next(
        i for i, r in enumerate(made) if (r.verb, r.resource, r.name) == ("patch", "nodes", node)
    )
    return Counter(f"{r.verb} {r.resource}" for r in made[: at + 1])


def test_one_remediation_of_a_node_with_8_gpu_pods_costs_16_requests(
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
    started = audit.offset(control_plane.audit_log)
    start_controller(controller_config(pool), user=audited_controller_user).wait_leading()
    _quiet(control_plane, audited_controller_user, started)  # its start's requests are behind
    since = audit.offset(control_plane.audit_log)

    report_fault(kube, node, "xid-79-gpu-fell-off-the-bus")
    wait_for("the taint", lambda: our_taint(kube, node) is not None, timeout_s=30)
    wait_for("the GPU pods gone", lambda: not pods_on(kube, namespace, node))
    wait_for("handled", lambda: handled_fault(kube, node) == "xid-79-gpu-fell-off-the-bus")
    (record,) = faults_of(kube, node)
    wait_for("record Drained", lambda: _phase(kube, str(record.metadata.name)) == "Drained")
    _reached(control_plane, audited_controller_user, since, EXPECTED)
    made = _quiet(control_plane, audited_controller_user, since)
    counts = Counter(f"{r.verb} {r.resource}" for r in made)
    before_taint = _up_to_taint(made, node)
    print(f"remediation: {len(made)} requests {dict(sorted(counts.items()))}")
    print(f"up to the taint: {sum(before_taint.values())} {dict(sorted(before_taint.items()))}")

    assert sum(before_taint.values()) <= MAX_BEFORE_TAINT, before_taint
    assert counts == EXPECTED, counts
    # The audit trail is whole: the entries the fence's pass left, written once.
    status: Any = kube.get(GPUFault, str(record.metadata.name)).status or {}
    said = [a["action"] for a in status.get("actions", [])]
    assert said == ["detect", "taint", "evict", "drain"], said


def test_in_quarantine_mode_the_taint_carries_the_handled_mark(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    audited_controller_user: str,
    start_controller: StartController,
) -> None:
    """Nothing to move: the node is handled once it is fenced, and one PATCH says both."""
    (node,) = fake_gpu_nodes(1, labels=pool)
    config = controller_config(pool, mode="quarantine")
    started = audit.offset(control_plane.audit_log)
    start_controller(config, user=audited_controller_user).wait_leading()
    _quiet(control_plane, audited_controller_user, started)
    since = audit.offset(control_plane.audit_log)

    report_fault(kube, node, "xid-79-quarantine-only")
    wait_for("handled", lambda: handled_fault(kube, node) == "xid-79-quarantine-only")
    assert our_taint(kube, node) is not None
    # The taint (with the handled mark) goes first, the record after it: wait for it.
    (record,) = wait_for("the record", lambda: faults_of(kube, node))
    wait_for("record Quarantined", lambda: _phase(kube, str(record.metadata.name)) == "Quarantined")
    expected = {
        "create gpufaults": 1,
        "patch nodes": 1,  # taint, state label and handled mark together
        "patch gpufaults/status": 1,
        "create events": 2,  # Detected, Quarantined
    }
    _reached(control_plane, audited_controller_user, since, expected)
    made = _quiet(control_plane, audited_controller_user, since)
    counts = Counter(f"{r.verb} {r.resource}" for r in made)
    print(f"remediation: {len(made)} requests {dict(sorted(counts.items()))}")
    assert sum(_up_to_taint(made, node).values()) <= MAX_BEFORE_TAINT
    assert counts == expected, counts
