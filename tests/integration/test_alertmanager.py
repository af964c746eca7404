"""The alert path with the real monitoring stack: a fake dcgm-exporter, real
Prometheus (scrape + alerting rule) and real Alertmanager (grouping, short
repeat interval) posting to the controller, which quarantines exactly once."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from lightkube import Client

from gpuheal.sim.monitoring import FakeDcgmExporter, Monitoring
from gpuheal.sim.secretvolume import SecretVolume
from tests.corpus import GPU_UUIDS, dcgm_labels
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    our_taint,
)

pytestmark = pytest.mark.timeout(240)

XID_RULE = {
    "alert": "GPUXidError",
    "expr": "DCGM_FI_DEV_XID_ERRORS > 0",
    "for": "0s",
    "labels": {"severity": "critical", "gpuheal_reason": "DcgmXidError"},
    "annotations": {
        "summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} reported Xid {{ $value }}"
    },
}


def series(node: str, gpu: int = 0) -> dict[str, str]:
    """A per-GPU series as dcgm-exporter exposes it (Prometheus adds instance and job)."""
    return {k: v for k, v in dcgm_labels(node, gpu).items() if k not in ("instance", "job")}


def test_an_alert_from_real_prometheus_and_alertmanager_quarantines_once(
    kube: Client,
    tmp_path: Path,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    node, healthy = fake_gpu_nodes(2, labels=pool)
    token_file = tmp_path / "token"
    token_file.write_text("alertmanager-token\n")
    controller = start_controller(controller_config(pool, apiTokenFile=str(token_file)))
    controller.wait_leading()
    exporter = FakeDcgmExporter().start()
    for name, gpu in ((node, 3), (healthy, 0)):
        exporter.set("DCGM_FI_DEV_XID_ERRORS", series(name, gpu), 0)
    monitoring = Monitoring(
        tmp_path / "monitoring",
        targets=[f"127.0.0.1:{exporter.port}"],
        rules=[XID_RULE],
        webhook_url=f"{controller.url}/api/v1/alerts",
        token_file=token_file,
        repeat_interval="2s",
    ).start()
    try:
        exporter.set("DCGM_FI_DEV_XID_ERRORS", series(node, 3), 79)
        started = time.monotonic()
        wait_for("the quarantine", lambda: our_taint(kube, node) is not None, timeout_s=60)
        print(
            f"exporter value -> taint through Prometheus and Alertmanager: {time.monotonic() - started:.1f}s"
        )

        # Alertmanager repeats the firing alert every 2s: nothing more happens.
        metrics = controller.metrics
        wait_for(
            "3 repeats",
            lambda: 'gpuheal_alerts_total{result="duplicate"} 3.0' in metrics(),
            timeout_s=60,
        )
        # The GPU recovers: the resolved notification changes nothing either.
        exporter.set("DCGM_FI_DEV_XID_ERRORS", series(node, 3), 0)
        wait_for(
            "the resolved notification",
            lambda: 'gpuheal_alerts_total{result="resolved"}' in metrics(),
            timeout_s=60,
        )
        time.sleep(2)
    finally:
        monitoring.stop()
        exporter.stop()
    (record,) = faults_of(kube, node)
    assert record.spec["source"] == "alertmanager" and record.spec["reason"] == "DcgmXidError"
    assert record.spec["devices"] == [GPU_UUIDS[3]]
    # Alertmanager's own fingerprint and startsAt: a short id, valid as a taint value as is.
    assert re.fullmatch(r"am-[0-9a-f]{16}-[0-9]{14}", record.spec["faultID"])
    assert len(events_for(kube, node, "GPUFaultQuarantined", at_least=1)) == 1
    assert 'gpuheal_alerts_total{result="accepted"} 1.0' in controller.metrics()
    assert 'gpuheal_alerts_total{result="invalid"}' not in controller.metrics()
    assert (
        'gpuheal_remediations_total{action="AddTaint",result="tainted"} 1.0' in controller.metrics()
    )
    assert our_taint(kube, healthy) is None and faults_of(kube, healthy) == []


def test_the_api_token_rotates_under_a_real_alertmanager_without_a_refusal_or_a_restart(
    kube: Client,
    tmp_path: Path,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    """The overlapping rotation of docs/security.md, each side with its own
    Secret volume as the kubelet updates them: the controller's takes old and new,
    Alertmanager's switches, the controller's drops the old."""
    (node,) = fake_gpu_nodes(1, labels=pool)
    old, new = "0ld-am-t0ken-7Hq2", "n3w-am-t0ken-9Xw4"
    ours = SecretVolume(tmp_path / "controller-token", {"token": old + "\n"})
    theirs = SecretVolume(tmp_path / "alertmanager-token", {"token": old + "\n"})
    controller = start_controller(controller_config(pool, apiTokenFile=str(ours.path("token"))))
    controller.wait_leading()
    pid = controller.component.pid
    exporter = FakeDcgmExporter().start()
    exporter.set("DCGM_FI_DEV_XID_ERRORS", series(node, 3), 79)
    monitoring = Monitoring(
        tmp_path / "monitoring",
        targets=[f"127.0.0.1:{exporter.port}"],
        rules=[XID_RULE],
        webhook_url=f"{controller.url}/api/v1/alerts",
        token_file=theirs.path("token"),
        repeat_interval="2s",
    ).start()

    def taken() -> float:
        pattern = r'gpuheal_alerts_total\{result="(?:accepted|duplicate)"\} (\S+)'
        return sum(float(v) for v in re.findall(pattern, controller.metrics()))

    def more_taken(than: float) -> bool:
        return taken() >= than + 2

    try:
        wait_for("the quarantine", lambda: our_taint(kube, node) is not None, timeout_s=60)
        ours.update({"token": f"{old}\n{new}\n"})
        wait_for("old and new taken", lambda: controller.log().count("API tokens read") == 2, 10)
        before = taken()
        theirs.update({"token": new + "\n"})  # Alertmanager reads the file at each send
        wait_for("repeats with the new token", lambda: more_taken(before), timeout_s=30)
        ours.update({"token": new + "\n"})
        wait_for("only the new", lambda: controller.log().count("API tokens read") == 3, 10)
        before = taken()
        wait_for("repeats after the old is gone", lambda: more_taken(before), timeout_s=30)
    finally:
        monitoring.stop()
        exporter.stop()
    requests = [
        line
        for line in controller.metrics().splitlines()
        if line.startswith("gpuheal_api_requests_total{") and 'route="/api/v1/alerts"' in line
    ]
    assert any('code="200"' in line for line in requests), requests
    refused = [line for line in requests if 'code="200"' not in line]
    assert refused == []  # no notification was refused at any step
    assert controller.component.pid == pid and controller.component.exit_code() is None
    assert len(faults_of(kube, node)) == 1
