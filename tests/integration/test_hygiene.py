"""Fleet hygiene as a loop, against the real control plane and a real Prometheus:
the controller's gpuheal_hygiene_findings from its caches, the chart's
gpuheal-hygiene alerts on them, `gpuheal audit` agreeing with the metric, and a
configured finding as a fault signal that ends with the finding."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.cli import main
from gpuheal.model import CUDA_VERSION, DRIVER_VERSION, GPU_PROCESSES, VBIOS_VERSION
from gpuheal.policy.hygiene import KINDS
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.monitoring import Monitoring
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes, wait_nodes_ready
from gpuheal.sim.workloads import gpu_pod, wait_pods_running
from tests.corpus import eks_node_names
from tests.helpers import FakeNodes, unique, wait_for
from tests.integration.chart import alert_rules
from tests.integration.conftest import (
    StartController,
    annotate,
    controller_config,
    events_for,
    faults_of,
    our_taint,
    record_phase,
)
from tests.integration.test_failures import metric

pytestmark = pytest.mark.timeout(300)

POOL_LABEL = "gpuheal.io/pool"
ZONE = "topology.kubernetes.io/zone"
PLUGIN = {"app": "nvidia-device-plugin-daemonset"}
KEEP = "gpuheal.test/keep"  # a finalizer nobody removes: the pod stays Terminating
LAST_RUN = "gpuheal_hygiene_last_run_timestamp_seconds"
GONE_UID = "0b9d6c1e-2f3a-4b5c-8d7e-6f5a4b3c2d1e"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def findings(controller_metrics: str, pool: str) -> dict[str, int]:
    """gpuheal_hygiene_findings of one pool, by kind (every kind, 0 included)."""
    counts = {}
    for line in controller_metrics.splitlines():
        if line.startswith("gpuheal_hygiene_findings{") and f'pool="{pool}"' in line:
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            counts[kind] = int(float(line.rsplit(" ", 1)[1]))
    return counts


def alerts(prometheus_url: str, pool: str) -> dict[str, set[str]]:
    """Firing alerts of one pool: alertname -> the kinds it names ("" when none)."""
    with urllib.request.urlopen(f"{prometheus_url}/api/v1/alerts", timeout=5) as response:  # noqa: S310
        data = json.load(response)["data"]["alerts"]
    found: dict[str, set[str]] = {}
    for a in data:
        if a["state"] == "firing" and a["labels"].get("pool") == pool:
            found.setdefault(a["labels"]["alertname"], set()).add(a["labels"].get("kind", ""))
    return found


def query(prometheus_url: str, expr: str) -> list[Any]:
    url = f"{prometheus_url}/api/v1/query?query={urllib.parse.quote(expr)}"
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310
        return list(json.load(response)["data"]["result"])


def run_audit(kubeconfig: Path, config: Path, pool: str, capsys: Any) -> dict[str, Any]:
    capsys.readouterr()
    selector = f"{POOL_LABEL}={pool}"
    args = ["--kubeconfig", str(kubeconfig), "--config", str(config), "-l", selector]
    code = main(["audit", *args, "-o", "json"])
    out = capsys.readouterr().out
    assert code in (0, 3), out
    data: dict[str, Any] = json.loads(out)
    return data


def test_each_finding_is_its_metric_and_alert_and_the_audit_agrees(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fleet_pool = unique("hyg")
    labels = {**pool, POOL_LABEL: fleet_pool, ZONE: "z1"}
    n0, n1, n2, n3, n4 = fake_gpu_nodes(5, labels=labels)
    # A GPU node the controller's nodeSelector misses: unmanaged.
    (outside,) = eks_node_names(1)
    create_gpu_nodes(kube, [outside], labels={POOL_LABEL: fleet_pool, ZONE: "z1"})
    wait_nodes_ready(kube, [outside])
    config = controller_config(
        pool,
        pools={
            "expectedLabels": {ZONE: "*"},
            "expectedTaints": ["nvidia.com/gpu=present:NoSchedule"],
        },
        # The audit reads this file: the same stuckAfterSeconds as the controller's.
        hygiene={"intervalSeconds": 1, "devicePluginGraceSeconds": 0, "stuckAfterSeconds": 1},
    )
    config_file = tmp_path / "gpuheal.yaml"
    config_file.write_text(yaml.safe_dump(config))
    for node in (n0, n1, n2, n3, n4, outside):
        versions: dict[str, str | None] = {DRIVER_VERSION: "550.54.15", CUDA_VERSION: "12.4"}
        annotate(kube, node, versions | {VBIOS_VERSION: "96.00.89.00.01"})
        kube.patch(Node, node, {"spec": {"taints": [GPU_TAINT]}})
    # The device plugin on all but n4.
    for i, node in enumerate((n0, n1, n2, n3, outside)):
        plugin = gpu_pod(f"nvidia-device-plugin-{i}", namespace, gpus=0, node_name=node)
        plugin["metadata"]["labels"] = PLUGIN
        kube.create(codecs.from_dict(plugin))
    stuck = gpu_pod("stuck", namespace, gpus=1, node_name=n0)
    stuck["metadata"]["finalizers"] = [KEEP]
    kube.create(codecs.from_dict(stuck))
    wait_pods_running(kube, namespace, count=6)

    controller = start_controller(config).wait_leading()
    token = tmp_path / "token"
    token.write_text("unused\n")
    monitoring = Monitoring(
        tmp_path / "monitoring", targets=[f"127.0.0.1:{controller.port}"],
        rules=alert_rules(control_plane, "gpuheal-hygiene"),
        webhook_url="http://127.0.0.1:9/unused", token_file=token, job="gpuheal-controller",
    ).start()  # fmt: skip
    try:
        wait_for("examined", lambda: findings(controller.metrics(), fleet_pool) != {})
        clean = {k: v for k, v in findings(controller.metrics(), fleet_pool).items() if v}
        assert clean == {"unmanaged": 1, "device-plugin-missing": 1}, clean

        kube.delete(Pod, "stuck", namespace=namespace, grace_period=0)  # leak
        annotate(kube, n1, {GPU_PROCESSES: f"4242@{GONE_UID},4244@"})  # zombie, host
        kube.patch(Node.Status, n2, {"status": {"allocatable": {"nvidia.com/gpu": "0"}}})
        kube.patch(Node.Status, n3, {"status": {"allocatable": {"nvidia.com/gpu": "6"}}})
        annotate(kube, n4, {DRIVER_VERSION: "535.104.05"})  # skew
        annotate(kube, n0, {CUDA_VERSION: "12.2"})
        annotate(kube, n3, {VBIOS_VERSION: "96.00.74.00.0D"})  # flashed other than the pool
        kube.patch(Node, n1, {"metadata": {"labels": {ZONE: None}}})  # missing-label
        kube.patch(Node, n2, {"spec": {"taints": []}})  # missing-taint
        expected = {
            "leak": 1,
            "zombie-process": 1,
            "host-process": 1,
            "zero-allocatable": 1,
            "allocatable-drop": 1,
            "device-plugin-missing": 1,
            "driver-skew": 1,
            "cuda-skew": 1,
            "vbios-skew": 1,
            "missing-label": 1,
            "missing-taint": 1,
            "unmanaged": 1,
        }
        assert set(expected) == set(KINDS)  # every kind as its metric (host-process: no alert)

        def counted() -> dict[str, int]:
            return {k: v for k, v in findings(controller.metrics(), fleet_pool).items() if v}

        time.sleep(1.5)  # the stuck pod past --stuck-after 1, then seen so by the loop
        wait_for("every finding counted", lambda: counted() == expected, timeout_s=30)
        data = run_audit(control_plane.kubeconfig, config_file, fleet_pool, capsys)
        assert data["counts"] == expected == counted()  # the command agrees with the metric
        assert data["nodes"] == 6

        wanted_alerts = {
            "GPUHealLeakedGPUs": {""},
            "GPUHealZombieGPUProcesses": {""},
            "GPUHealGPUsUnusable": {
                "zero-allocatable",
                "allocatable-drop",
                "device-plugin-missing",
            },
            "GPUHealVersionSkew": {"driver-skew", "cuda-skew", "vbios-skew"},
            "GPUHealNodeConfigDrift": {"missing-label", "missing-taint", "unmanaged"},
        }
        wait_for(
            "every alert firing",
            lambda: alerts(monitoring.prometheus_url, fleet_pool) == wanted_alerts,
            timeout_s=60,
        )
        # One series per kind and pool from the controller (no node label).
        series = query(
            monitoring.prometheus_url, f'gpuheal_hygiene_findings{{pool="{fleet_pool}"}}'
        )
        assert {s["metric"]["kind"] for s in series} >= set(expected)
        assert all("node" not in s["metric"] for s in series)
        assert not query(monitoring.prometheus_url, "ALERTS{alertname='GPUHealHygieneStale'}")
    finally:
        monitoring.stop()
        try:
            kube.patch(Pod, "stuck", {"metadata": {"finalizers": None}}, namespace=namespace)
        except ApiError as err:
            if err.status.code != 404:
                raise
        delete_nodes(kube, [outside])


def test_a_configured_finding_quarantines_once_it_lasts_and_returns_the_node_after(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    config = controller_config(
        pool,
        hygiene={
            "intervalSeconds": 1,
            "signals": {"zero-allocatable": "P0"},
            "signalAfterSeconds": 3,
        },
    )
    start_controller(config).wait_leading()
    lost = time.time()
    kube.patch(Node.Status, node, {"status": {"allocatable": {"nvidia.com/gpu": "0"}}})
    wait_for("quarantined", lambda: our_taint(kube, node) is not None, timeout_s=30)
    assert time.time() - lost >= 3  # not before signalAfterSeconds
    (record,) = wait_for("its record", lambda: faults_of(kube, node))  # just after the taint
    assert record.spec["source"] == "hygiene/zero-allocatable"
    assert record.spec["reason"] == "GPUsNotAllocatable"
    assert record.spec["faultID"].startswith("hygiene-zero-allocatable-")
    assert our_taint(kube, node) == record.spec["faultID"]

    time.sleep(3)  # more runs: the same fault, no second record
    assert len(faults_of(kube, node)) == 1
    kube.patch(Node.Status, node, {"status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    wait_for("returned", lambda: our_taint(kube, node) is None, timeout_s=30)
    wait_for("Resolved", lambda: [record_phase(r) for r in faults_of(kube, node)] == ["Resolved"])


def test_the_loop_reads_only_the_caches(
    kube: Client,
    control_plane: ControlPlane,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    audited_controller_user: str,
    start_controller: StartController,
) -> None:
    """No request of its own: each run examines what the informers hold."""
    fleet_pool = unique("hyg")
    nodes = fake_gpu_nodes(3, labels={**pool, POOL_LABEL: fleet_pool})
    kube.patch(Node.Status, nodes[0], {"status": {"allocatable": {"nvidia.com/gpu": "0"}}})
    config = controller_config(pool, hygiene={"intervalSeconds": 1})
    controller = start_controller(config, user=audited_controller_user).wait_leading()
    wait_for(
        "examined",
        lambda: findings(controller.metrics(), fleet_pool).get("zero-allocatable") == 1,
    )
    time.sleep(2)  # the start's lists and watches are behind us
    since, first = audit.offset(control_plane.audit_log), metric(controller, LAST_RUN)
    time.sleep(5)
    assert metric(controller, LAST_RUN) - first >= 3  # runs went on meanwhile
    made = audit.requests(control_plane.audit_log, user=audited_controller_user, since=since)
    assert [f"{r.verb} {r.resource}" for r in made if r.resource != "leases"] == []


def test_a_restarted_controller_keeps_the_fault_of_a_present_finding(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    """The next leader adopts the open record's fault at once: no release while it
    would time the finding anew, no second record (the DCGM source's lesson)."""
    (node,) = fake_gpu_nodes(1, labels=pool)
    config = controller_config(
        pool,
        hygiene={
            "intervalSeconds": 1,
            "signals": {"zero-allocatable": "P0"},
            "signalAfterSeconds": 2,
        },
    )
    kube.patch(Node.Status, node, {"status": {"allocatable": {"nvidia.com/gpu": "0"}}})
    first = start_controller(config).wait_leading()
    wait_for("quarantined", lambda: our_taint(kube, node) is not None, timeout_s=30)
    (record,) = wait_for("its record", lambda: faults_of(kube, node))
    first.stop()

    second = start_controller(config).wait_leading()
    wait_for("examined", lambda: "gpuheal_hygiene_gpu_nodes" in second.metrics())
    time.sleep(4)  # past signalAfterSeconds: runs and reconciles enough for a mistake
    (again,) = faults_of(kube, node)
    assert again.metadata.name == record.metadata.name
    assert our_taint(kube, node) == record.spec["faultID"]
    assert len(events_for(kube, node, "GPUFaultQuarantined", at_least=1)) == 1
