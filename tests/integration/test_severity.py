"""Severity on the main path: the real agent reports a P1 finding (a GPU at
96 °C on the fake NVML) and the controller gives it the P1 window — recorded
and notified at once, pods moved only if it is still there after
`p1EscalationSeconds`, or at once when it worsens to P0."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal.clock import parse_time
from gpuheal.model import FAULT_ID, FAULT_SEVERITY, STATUS, TAINT_KEY
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartAgent,
    StartController,
    controller_config,
    events_for,
    faults_of,
    node_annotations,
    our_taint,
    pods_on,
    pods_told_evicted,
    record_entries,
    record_of,
    record_phase,
)

pytestmark = pytest.mark.timeout(240)

WINDOW_S = 12  # p1EscalationSeconds
XID79 = "NVRM: Xid (PCI:0000:1c:00): 79, pid=2843, name=python3, GPU has fallen off the bus."


def seconds_between(first: dict[str, str], then: dict[str, str]) -> float:
    start, end = parse_time(first["time"]), parse_time(then["time"])
    assert start is not None and end is not None
    return (end - start).total_seconds()


def test_a_hot_gpu_is_watched_for_the_p1_window_then_drained_once_or_resolved_when_it_cools(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_agent: StartAgent,
    start_controller: StartController,
    sink: tuple[str, list[dict[str, Any]]],
) -> None:
    # Before: the agent's annotations carried no severity and every annotated fault
    # was P0, so each of these nodes was tainted and its training job evicted at once.
    stays_hot, cools, worsens = nodes = fake_gpu_nodes(3, labels=pool)
    for node in nodes:
        apply(kube, gpu_pod(f"trainer-{nodes.index(node)}", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=3)
    url, received = sink
    start_controller(
        controller_config(pool, p1EscalationSeconds=WINDOW_S, notificationSinks=[{"url": url}])
    ).wait_leading()
    agents = {n: start_agent(n, {"failRounds": 2, "healthyRounds": 2}) for n in nodes}
    for agent in agents.values():
        agent.set_device(4, temperature=96)  # temperatureCriticalC 95: Thermal, P1

    wait_for("a record for each hot node", lambda: all(faults_of(kube, n) for n in nodes))
    for node in nodes:
        record = record_of(kube, node)
        assert record.spec["severity"] == "P1" and record.spec["reason"] == "Thermal"
        assert node_annotations(kube, node)[FAULT_SEVERITY] == "P1"
    wait_for(
        "a notification for each",
        lambda: {m["node"] for m in received if "CreateRecord" in m["actions"]} == set(nodes),
    )
    first = {n: next(m for m in received if m["node"] == n) for n in nodes}
    assert all(not {"AddTaint", "Evict"} & set(first[n]["actions"]) for n in nodes), first

    # One cools inside the window, one throws Xid 79 on top of the heat.
    agents[cools].set_device(4, temperature=41)
    agents[worsens].kernel(XID79)
    wait_for(
        "the cooled fault resolved", lambda: record_phase(record_of(kube, cools)) == "Resolved"
    )
    wait_for("the worse one tainted", lambda: our_taint(kube, worsens) is not None)
    hot = record_of(kube, stays_hot)
    opened = parse_time(record_entries(hot, "detect")[0]["time"])
    assert opened is not None
    inside = (dt.datetime.now(dt.UTC) - opened).total_seconds()
    assert inside < WINDOW_S, f"the cooling and the Xid took {inside:.1f}s: no window left to test"
    assert record_phase(hot) == "Detected" and our_taint(kube, stays_hot) is None
    assert pods_on(kube, namespace, stays_hot) == {"trainer-0"}

    worse = record_of(kube, worsens)
    escalated = record_entries(worse, "escalate")[0]
    assert escalated["detail"] == "now reported P0"
    assert seconds_between(record_entries(worse, "detect")[0], escalated) < WINDOW_S
    assert node_annotations(kube, worsens)[FAULT_SEVERITY] == "P0"
    wait_for("its pod evicted", lambda: not pods_on(kube, namespace, worsens))

    # The one still hot: drained once, after the window.
    wait_for("the hot node tainted", lambda: our_taint(kube, stays_hot) is not None, 60)
    wait_for("its pod evicted", lambda: not pods_on(kube, namespace, stays_hot), 60)
    wait_for("drained", lambda: record_phase(record_of(kube, stays_hot)) == "Drained", 60)
    hot = record_of(kube, stays_hot)
    assert record_entries(hot, "escalate")[0]["detail"] == f"still present after {WINDOW_S}s"
    assert (
        seconds_between(record_entries(hot, "detect")[0], record_entries(hot, "escalate")[0])
        >= WINDOW_S - 1
    )
    assert (hot.status or {})["evictedPods"] == [f"{namespace}/trainer-0"]
    time.sleep(2)  # let any repeat show itself
    for node in (stays_hot, worsens):
        assert len(events_for(kube, node, "GPUFaultEscalated", at_least=1)) == 1
        assert len(events_for(kube, node, "GPUFaultQuarantined", at_least=1)) == 1
        assert len(pods_told_evicted(kube, node, at_least=1)) == 1

    # The cooled one: never touched, past its window too.
    left = WINDOW_S - (dt.datetime.now(dt.UTC) - opened).total_seconds()
    time.sleep(max(0.0, left + 2))
    cooled = record_of(kube, cools)
    assert record_phase(cooled) == "Resolved" and not record_entries(cooled, "taint")
    assert record_entries(cooled, "recovered")[0]["detail"] == "fault cleared before quarantine"
    assert our_taint(kube, cools) is None and pods_on(kube, namespace, cools) == {"trainer-1"}
    assert events_for(kube, cools, "GPUFaultQuarantined") == []
    assert FAULT_SEVERITY not in node_annotations(kube, cools)  # cleared with the fault


def taint_of(kube: Client, node: str) -> tuple[str, str] | None:
    """(value, effect) of our taint on the node."""
    taints = kube.get(Node, node).spec.taints or []  # type: ignore[union-attr]
    return next(((str(t.value), str(t.effect)) for t in taints if t.key == TAINT_KEY), None)


def test_p1_taint_fences_a_watched_fault_with_noschedule_then_applies_the_taint_effect(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_pod("trainer", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)
    window = 6
    config = controller_config(
        pool, p1EscalationSeconds=window, p1Taint=True, taintEffect="NoExecute"
    )
    start_controller(config).wait_leading()
    # As a person (or another detector) writes it: kubectl annotate node N
    # gpuheal.io/status=faulty gpuheal.io/fault-id=... gpuheal.io/fault-severity=P1
    annotations = {STATUS: "faulty", FAULT_ID: "npd-gpu-hot-7", FAULT_SEVERITY: "P1"}
    kube.patch(Node, node, {"metadata": {"annotations": annotations}})

    wait_for(
        "the NoSchedule fence", lambda: taint_of(kube, node) == ("npd-gpu-hot-7", "NoSchedule")
    )
    assert pods_on(kube, namespace, node) == {"trainer"}
    # The taint is written before the record's status (the executor's order), so
    # the phase may lag the fence by one write.
    wait_for("the record quarantined", lambda: record_phase(record_of(kube, node)) == "Quarantined")
    wait_for(
        "the configured effect", lambda: taint_of(kube, node) == ("npd-gpu-hot-7", "NoExecute"), 30
    )
    wait_for("the drain", lambda: not pods_on(kube, namespace, node), 30)
    record = record_of(kube, node)
    assert (
        seconds_between(record_entries(record, "detect")[0], record_entries(record, "escalate")[0])
        >= window - 1
    )
    assert len(events_for(kube, node, "GPUFaultQuarantined", at_least=1)) == 1
