"""Repeat offenders on the real control plane, at the shipped thresholds (3 faults
of one node within 3 days): the first two faults come and go as any other; the
third is flagged for support when its record is made, and after it clears its
node stays tainted until a person releases the record with `gpuheal release`
(docs/controller.md#repeat-offenders)."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pytest
from lightkube import Client

from gpuheal.sim import ControlPlane
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
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
from tests.integration.test_approval import gpuheal

pytestmark = pytest.mark.timeout(240)


def record_of(kube: Client, node: str, fault_id: str) -> dict[str, Any]:
    (found,) = [r for r in faults_of(kube, node) if r.spec.get("faultID") == fault_id]
    made: dict[str, Any] = found.to_dict()
    return made


def status_of(kube: Client, node: str, fault_id: str) -> dict[str, Any]:
    status: dict[str, Any] = record_of(kube, node, fault_id).get("status") or {}
    return status


def resolved(kube: Client, node: str, fault_id: str) -> bool:
    return phase_of(kube, node, fault_id) == "Resolved"


def phase_of(kube: Client, node: str, fault_id: str) -> str:
    return str(status_of(kube, node, fault_id).get("phase", ""))


def test_the_third_fault_in_three_days_holds_the_node_for_a_person(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_pod("train-0", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)
    config = controller_config(pool)
    assert "repeatOffenders" not in config  # the shipped thresholds
    start_controller(config).wait_leading()

    for fault in ("xid-79-mon", "xid-48-tue"):
        report_fault(kube, node, fault)
        wait_for(f"{fault} quarantined", lambda: our_taint(kube, node) is not None)
        clear_fault(kube, node)
        wait_for(f"{fault} resolved", partial(resolved, kube, node, fault))
        assert our_taint(kube, node) is None
    assert not events_for(kube, node, "GPUContactSupport")

    report_fault(kube, node, "xid-79-wed")
    wait_for("quarantined", lambda: our_taint(kube, node) is not None)
    third = record_of(kube, node, "xid-79-wed")
    name = str(third["metadata"]["name"])
    wait_for("flagged", lambda: entries_of(kube, "repeat-offender", name=name))
    (flag,) = entries_of(kube, "repeat-offender", name=name)
    assert flag["detail"].startswith("3 faults on this node within 3 days")
    assert status_of(kube, node, "xid-79-wed").get("contactSupport") is True
    (told,) = events_for(kube, node, "GPUContactSupport", at_least=1)
    assert "repeat offender" in (told.message or "")

    clear_fault(kube, node)
    wait_for("held for a person", lambda: entries_of(kube, "held-for-a-person", name=name))
    (held,) = events_for(kube, node, "GPUFaultHeld", at_least=1)
    assert f"gpuheal release {name}" in (held.message or "")
    time.sleep(3)  # many more looks (holdRetrySeconds 0.5): it stays out, said once
    assert our_taint(kube, node) is not None
    assert phase_of(kube, node, "xid-79-wed") == "Recovering"
    assert len(entries_of(kube, "held-for-a-person", name=name)) == 1

    code, _, err = gpuheal(control_plane, capsys, "release", name)
    assert code == 0, err
    wait_for("returned", lambda: our_taint(kube, node) is None, timeout_s=30)
    wait_for("Resolved", lambda: phase_of(kube, node, "xid-79-wed") == "Resolved")
    (released,) = entries_of(kube, "released", name=name)
    assert released["detail"].startswith("by ")  # the person as the API server knows them
    assert events_for(kube, node, "GPUFaultReleased", at_least=1)
    # The first two were never flagged.
    for fault in ("xid-79-mon", "xid-48-tue"):
        assert not status_of(kube, node, fault).get("contactSupport")
