"""Checkpoint before eviction on the fault path, on the real control plane: the
controller asks a matching fault's GPU pods to checkpoint, evicts each when it
says done or at its deadline, says which in the record, and keeps the deadline
across a restart (it lives on the pod). The API server's audit log is the
witness of what the controller asked, and when."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpuheal.clock import iso, parse_time
from gpuheal.model import CHECKPOINT_DONE, CHECKPOINT_REQUESTED
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from gpuheal.vocabulary import Entry, Reason
from tests.conftest import AUDITED_CONTROLLER
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    pods_on,
    record_entries,
    record_of,
    report_fault,
)

pytestmark = pytest.mark.timeout(300)

REASON = "XidCritical79"


def checkpointing(pool: dict[str, str], wait_s: float) -> dict[str, Any]:
    return controller_config(pool, checkpoint={"reasons": [REASON], "waitSeconds": wait_s})


def requested(kube: Client, namespace: str, pod: str) -> str:
    """The pod's checkpoint request ("" when not asked, or gone)."""
    found = [
        p for p in kube.list(Pod, namespace=namespace) if p.metadata and p.metadata.name == pod
    ]
    meta = found[0].metadata if found else None
    return str(((meta.annotations if meta else None) or {}).get(CHECKPOINT_REQUESTED, ""))


def asks_and_evictions(
    control_plane: ControlPlane, since: int
) -> tuple[dict[str, list[int]], dict[str, list[dt.datetime]]]:
    """Per pod, the controller's PATCHes (response codes) and accepted evictions (times)."""
    patches: dict[str, list[int]] = {}
    evicted: dict[str, list[dt.datetime]] = {}
    for r in audit.requests(control_plane.audit_log, user=AUDITED_CONTROLLER, since=since):
        if r.verb == "patch" and r.resource == "pods":
            patches.setdefault(r.name, []).append(r.code)
        if r.verb == "create" and r.resource == "pods/eviction" and r.code == 201:
            at = parse_time(r.at)
            assert at is not None
            evicted.setdefault(r.name, []).append(at)
    return patches, evicted


def test_pods_are_asked_once_and_evicted_when_done_or_at_their_deadline_across_a_restart(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    control_plane: ControlPlane,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    audited_controller_user: str,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    for name in ("trainer-0", "trainer-1"):
        apply(kube, gpu_pod(name, namespace, node_name=node))
    wait_pods_running(kube, namespace, count=2)
    since = audit.offset(control_plane.audit_log)
    # Long enough for a restart and a lease takeover (leaseSeconds 4) inside the wait.
    config = checkpointing(pool, wait_s=20)
    first = start_controller(config, user=AUDITED_CONTROLLER).wait_leading()
    report_fault(kube, node, "xid-79-ckpt")

    def both_asked() -> dict[str, str]:
        found = {p: requested(kube, namespace, p) for p in ("trainer-0", "trainer-1")}
        return found if all(found.values()) else {}

    asked = wait_for("both pods asked", both_asked)
    deadline = parse_time(asked["trainer-1"])
    assert deadline is not None
    assert asked["trainer-0"] == asked["trainer-1"]  # one request round, one deadline
    wait_for(
        "the request recorded",
        lambda: record_entries(record_of(kube, node), Entry.CHECKPOINT_REQUESTED),
    )
    wait_for("its Event", lambda: events_for(kube, node, Reason.CHECKPOINT_REQUESTED))
    assert pods_on(kube, namespace, node) == {"trainer-0", "trainer-1"}  # none moved yet

    # trainer-0 saves its state and says so: it goes at once, well before the deadline.
    done = {"metadata": {"annotations": {CHECKPOINT_DONE: iso(dt.datetime.now(dt.UTC))}}}
    kube.patch(Pod, "trainer-0", done, namespace=namespace)
    wait_for("trainer-0 evicted", lambda: pods_on(kube, namespace, node) == {"trainer-1"})

    # The controller dies mid-wait; the next one has nothing but the cluster to go by.
    first.kill()
    start_controller(config, user=AUDITED_CONTROLLER).wait_leading()
    wait_for("trainer-1 evicted", lambda: not pods_on(kube, namespace, node))

    patches, evicted = asks_and_evictions(control_plane, since)
    # Asked once each: the restarted controller did not ask again (nor move the deadline).
    assert patches == {"trainer-0": [200], "trainer-1": [200]}, patches
    assert len(evicted["trainer-0"]) == 1 and len(evicted["trainer-1"]) == 1, evicted
    assert evicted["trainer-0"][0] < deadline
    assert evicted["trainer-1"][0] >= deadline  # the first request's deadline, kept

    said = [(e["action"], e["result"], e["detail"]) for e in record_entries(record_of(kube, node))]
    assert [a for a, _, _ in said].count(Entry.CHECKPOINT_REQUESTED) == 1, said
    assert (Entry.CHECKPOINTED, "ok", f"{namespace}/trainer-0: said done") in said
    assert (
        Entry.CHECKPOINT_TIMEOUT,
        "timed-out",
        f"{namespace}/trainer-1: not done by {asked['trainer-1']}",
    ) in said
    assert len(events_for(kube, node, Reason.CHECKPOINT_REQUESTED, at_least=1)) == 1


def test_killed_between_a_request_and_its_record_the_next_controller_does_not_ask_again(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    control_plane: ControlPlane,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    audited_controller_user: str,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    for name in ("trainer-0", "trainer-1"):
        apply(kube, gpu_pod(name, namespace, node_name=node))
    wait_pods_running(kube, namespace, count=2)
    since = audit.offset(control_plane.audit_log)
    config = checkpointing(pool, wait_s=8)
    doomed = start_controller(
        config, user=AUDITED_CONTROLLER, env={"GPUHEAL_CRASH_AFTER": "RequestCheckpoint"}
    )
    report_fault(kube, node, "xid-79-crash")
    assert doomed.wait_exit(30) == -9, "the crashpoint was not reached"
    before = {p: requested(kube, namespace, p) for p in ("trainer-0", "trainer-1")}
    assert any(before.values())

    start_controller(config, user=AUDITED_CONTROLLER)
    wait_for(
        "the request recorded",
        lambda: record_entries(record_of(kube, node), Entry.CHECKPOINT_REQUESTED),
    )
    for pod, value in before.items():
        if value:  # asked before the kill: that request (and its deadline) stands
            assert requested(kube, namespace, pod) in (value, "")  # "" once evicted
    wait_for("drained at the deadline", lambda: not pods_on(kube, namespace, node))

    patches, evicted = asks_and_evictions(control_plane, since)
    for pod, value in before.items():
        asks = patches.get(pod, [])
        if value:
            # Asked before the kill, and never again. A request the kill cut short
            # may be logged 504 by the API server and still have been carried out.
            assert len(asks) == 1, patches
        else:
            assert asks.count(200) == 1, patches  # asked by the next controller
        assert len(evicted[pod]) == 1, evicted
    said = [e["action"] for e in record_entries(record_of(kube, node))]
    assert said.count(Entry.CHECKPOINT_TIMEOUT) == 2, said


def test_a_fault_that_does_not_match_evicts_at_once_and_asks_nothing(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    control_plane: ControlPlane,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    audited_controller_user: str,
    tmp_path: Path,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    for name in ("trainer-0", "trainer-1"):
        apply(kube, gpu_pod(name, namespace, node_name=node))
    wait_pods_running(kube, namespace, count=2)
    since = audit.offset(control_plane.audit_log)
    # A wait far beyond this test's: only moving at once can drain the node in time.
    start_controller(checkpointing(pool, wait_s=3600), user=AUDITED_CONTROLLER)
    report_fault(kube, node, "xid-48-dbe", reason="XidCritical48")
    wait_for("drained", lambda: not pods_on(kube, namespace, node))

    patches, evicted = asks_and_evictions(control_plane, since)
    assert patches == {}
    assert sorted(evicted) == ["trainer-0", "trainer-1"]
    said = [e["action"] for e in record_entries(record_of(kube, node))]
    assert Entry.CHECKPOINT_REQUESTED not in said and "evict" in said
