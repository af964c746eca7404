"""An alert's life as docs/api.md tells it: a resolved notification changes
nothing unless `resolvedAlertClears`; a signal that expires wakes its node at
that moment; and every managed node is looked at again every `resyncSeconds`
from the caches, at no API cost."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client

from gpuheal.clock import parse_time
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.controller import ControllerProcess
from tests.conftest import AUDITED_CONTROLLER
from tests.corpus import alert, dcgm_labels, webhook
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    our_taint,
    record_of,
    record_phase,
)
from tests.integration.test_api import TOKEN, call

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def api_config(tmp_path: Path, pool: dict[str, str]) -> dict[str, Any]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    return controller_config(pool, apiTokenFile=str(token_file))


def xid_alert(node: str, status: str = "firing") -> dict[str, Any]:
    """dcgm-exporter's Xid series, alerted on by a rule labelled critical."""
    labels = {**dcgm_labels(node, 3), "alertname": "GPUXidError", "severity": "critical"}
    return webhook([alert(labels, status=status)])


def entry_time(record: Any, action: str) -> float:
    """When the record's first `action` entry was written (epoch seconds)."""
    entry = next(e for e in record.status["actions"] if e["action"] == action)
    when = parse_time(entry["time"])
    assert when is not None
    return when.timestamp()


def quarantine_by_alert(controller: ControllerProcess, kube: Client, node: str) -> None:
    code, answer = call(controller, "/api/v1/alerts", xid_alert(node))
    assert code == 200 and [a["node"] for a in answer["accepted"]] == [node], answer
    wait_for("the taint", lambda: our_taint(kube, node) is not None, timeout_s=30)


@pytest.mark.parametrize("clears", [False, True])
def test_a_resolved_alert_lifts_the_quarantine_only_with_resolved_alert_clears(
    kube: Client,
    api_config: dict[str, Any],
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    clears: bool,
) -> None:
    # Before: the key was never read, and the resolved notification always withdrew
    # the signal: the taint went after the recovery window even with `false`.
    (node,) = fake_gpu_nodes(1, labels=pool)
    config = {**api_config, "resolvedAlertClears": clears, "recoveryWindowSeconds": 1}
    controller = start_controller(config).wait_leading()
    quarantine_by_alert(controller, kube, node)

    code, answer = call(controller, "/api/v1/alerts", xid_alert(node, "resolved"))
    assert code == 200 and [a["node"] for a in answer["resolved"]] == [node]
    assert 'gpuheal_alerts_total{result="resolved"} 1.0' in controller.metrics()
    if clears:
        wait_for("the taint lifted", lambda: our_taint(kube, node) is None, timeout_s=30)
        # The pass writes the record's status after the actions it records.
        wait_for("Resolved", lambda: record_phase(record_of(kube, node)) == "Resolved")
        record = record_of(kube, node)
        assert entry_time(record, "untaint") - entry_time(record, "recovering") >= 1 - 0.01
    else:
        time.sleep(4)  # the recovery window (1 s) four times over
        assert our_taint(kube, node) is not None
        record = record_of(kube, node)
        assert record_phase(record) == "Drained"
        assert "recovering" not in {e["action"] for e in record.status["actions"]}
    assert answer["resolved"][0]["withdrawn"] is clears


def test_an_alert_signal_that_expires_wakes_its_node_which_then_recovers(
    kube: Client,
    api_config: dict[str, Any],
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    # Before: nothing looked at the node when its only signal expired, and the
    # quarantine stayed until an unrelated event touched the node.
    (node,) = fake_gpu_nodes(1, labels=pool)
    ttl = 4
    config = {**api_config, "externalSignalTtlSeconds": ttl, "recoveryWindowSeconds": 1}
    controller = start_controller(config).wait_leading()  # resyncSeconds: 300, not in play
    sent = time.time()
    quarantine_by_alert(controller, kube, node)
    wait_for("drained", lambda: record_phase(record_of(kube, node)) == "Drained", timeout_s=30)

    wait_for("the taint lifted", lambda: our_taint(kube, node) is None, timeout_s=30)
    # The pass writes the record's status after the actions it records.
    wait_for("Resolved", lambda: record_phase(record_of(kube, node)) == "Resolved")
    record = record_of(kube, node)
    woke = entry_time(record, "recovering") - sent
    print(f"the node's recovery began {woke:.2f}s after the alert (ttl {ttl}s)")
    assert ttl - 0.5 <= woke <= ttl + 2  # at the expiry, not before, not at some later event
    assert entry_time(record, "untaint") - entry_time(record, "recovering") >= 1 - 0.01


def reconciles(controller: ControllerProcess) -> float:
    for line in controller.metrics().splitlines():
        if line.startswith("gpuheal_reconcile_duration_seconds_count "):
            return float(line.split()[-1])
    return 0.0


def test_every_managed_node_is_resynced_from_the_caches_without_a_request(
    kube: Client,
    control_plane: ControlPlane,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    audited_controller_user: str,
) -> None:
    nodes = fake_gpu_nodes(3, labels=pool)
    config = controller_config(pool, resyncSeconds=1)
    controller = start_controller(config, user=audited_controller_user).wait_leading()
    wait_for("the first look at each node", lambda: reconciles(controller) >= len(nodes))
    time.sleep(1)
    since = audit.offset(control_plane.audit_log)
    before = reconciles(controller)
    time.sleep(5)
    done = reconciles(controller) - before
    found = list(audit.requests(control_plane.audit_log, user=AUDITED_CONTROLLER, since=since))
    print(f"{done:.0f} reconciles in 5 s; requests: {audit.by_verb_and_resource(iter(found))}")
    assert done >= len(nodes) * 3  # about 5 rounds of 3 idle nodes, with nothing happening
    assert [r for r in found if r.resource != "leases"] == []  # from the caches only
