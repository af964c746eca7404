"""Acceptance: dcgm-exporter's Xids and row remaps as a user meets them, on the
real control plane with real Prometheus and Alertmanager and the chart's OWN rules
(rendered from deploy/helm/gpuheal by the test helm binary), through both of
gpuheal's controller-side paths: its DCGM poll of Prometheus, and Prometheus ->
Alertmanager -> its webhook. dcgm-exporter with its default counters file, and with
the optional fields enabled (the windowed Xid count, double-bit ECC, the pending
row remap).

Before: the chart's GPUXidError fired on any Xid with `severity: critical`, which
the Alertmanager source took for P0: a user program's Xid 13 tainted and drained
its node in 6 s. The DCGM source made a P1 of every GPU that had ever remapped a
row, which escalated to a drain and never cleared.

What must not taint is watched past every delay on its way (the poll interval, the
rule evaluation, Alertmanager's group wait, interval and a repeat) while the faults
fed at the same instant are taken: the spared cases had their chance.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Event

from gpuheal.sim import ControlPlane
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.monitoring import (
    DEFAULT_COUNTERS,
    OPTIONAL_COUNTERS,
    REMAP_FAILURE,
    REMAP_PENDING,
    UNCORRECTABLE_REMAPPED,
    Counter,
    FakeDcgmExporter,
    Gpu,
    Monitoring,
    exporter_labels,
)
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from tests.corpus import GPU_UUIDS
from tests.helpers import FakeNodes, wait_for
from tests.integration.chart import alert_rules, render
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    our_taint,
)

pytestmark = pytest.mark.timeout(240)

TOKEN = "dcgm-catalogue-token-7f3a"
PER_GPU = 3  # applicationXids.perGpu, in the controller's config and the chart's rule
# How long what must not taint is watched once the faults fed with it were taken:
# the poll (1 s) and its settling (1 s), a rule evaluation (1 s), Alertmanager's
# group wait (1 s), group interval (2 s) and a repeat (3 s), and then some.
HOLD_S = 10.0
PROFILES: dict[str, tuple[Counter, ...]] = {
    "default counters": DEFAULT_COUNTERS,
    "optional fields": OPTIONAL_COUNTERS,
}


@dataclass
class Case:
    """One GPU on its own node: what happens on it, and what must come of it."""

    name: str
    xids: tuple[int, ...] = ()
    fields: tuple[tuple[Counter, float], ...] = ()
    want: str = "spared"  # spared | drained (P0, tainted) | watched (P1, recorded)
    reason: str = ""
    optional: bool = False  # needs a field only the optional counters file exports
    node: str = ""
    gpu: Gpu | None = None


def cases() -> list[Case]:
    remapped = (UNCORRECTABLE_REMAPPED, 4.0)
    return [
        Case("xid13", (13,)),  # NVIDIA: restart the application
        Case("xid31", (31,)),
        Case("xid43", (43,)),  # NVIDIA: ignore
        Case("xid79", (79,), want="drained", reason="XidCritical79"),
        Case("xid48", (48,), want="drained", reason="EccDoubleBit48"),
        Case("xid95", (95,), want="drained", reason="EccUncontained95"),
        # Four rows remapped in the GPU's life, none pending, none failed: healthy.
        Case("remapped", fields=(remapped,)),
        Case(
            "remapfail",
            fields=(remapped, (REMAP_FAILURE, 1.0)),
            want="drained",
            reason="RowRemapFailure",
        ),
        Case(
            "remappend",
            fields=((REMAP_PENDING, 1.0),),
            want="watched",
            reason="RowRemapPending",
            optional=True,
        ),
        # PER_GPU application Xids on one GPU within dcgm-exporter's window.
        Case(
            "appxids",
            (13, 31, 13),
            want="watched",
            reason="RepeatedApplicationXids",
            optional=True,
        ),
    ]


def chart_rules(control_plane: ControlPlane, tmp_path: Path) -> list[dict[str, Any]]:
    """The chart's own DCGM alert rules, as `helm template` renders them."""
    values = tmp_path / "values.yaml"
    chosen = {
        "prometheusRule": {"enabled": True},
        "controller": {"config": {"applicationXids": {"perGpu": PER_GPU}}},
    }
    values.write_text(yaml.safe_dump(chosen))
    objects = render(control_plane, "gh", "gpuheal-system", values)
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    (group,) = [g for g in rule["spec"]["groups"] if g["name"] == "gpuheal-dcgm"]
    rules: list[dict[str, Any]] = group["rules"]
    assert {r["alert"] for r in rules} >= {"GPUXidError", "GPURepeatedApplicationXids"}
    return rules


def prometheus_query(monitoring: Monitoring, expr: str) -> list[dict[str, Any]]:
    url = f"{monitoring.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 -- loopback
        found: list[dict[str, Any]] = json.load(response)["data"]["result"]
        return found


def readyz(controller: ControllerProcess) -> tuple[int, dict[str, Any]]:
    with urllib.request.urlopen(f"{controller.url}/readyz", timeout=5) as response:  # noqa: S310
        return response.status, json.load(response)


def observed(controller: ControllerProcess, source: str, xid: int) -> float:
    prefix = 'gpuheal_xids_observed_total{kind="'
    total = 0.0
    for line in controller.metrics().splitlines():
        if line.startswith(prefix) and f'source="{source}"' in line and f'xid="{xid}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def exporter(request: pytest.FixtureRequest) -> Iterator[FakeDcgmExporter]:
    started = FakeDcgmExporter(PROFILES[request.param]).start()
    yield started
    started.stop()


@pytest.mark.parametrize("path", ["dcgm", "alertmanager"])
@pytest.mark.parametrize("exporter", list(PROFILES), indirect=True)
def test_application_xids_and_remapped_rows_never_taint_node_faults_do_once(
    kube: Client,
    control_plane: ControlPlane,
    tmp_path: Path,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    exporter: FakeDcgmExporter,
    path: str,
) -> None:
    optional = exporter.counters is OPTIONAL_COUNTERS
    fleet = [c for c in cases() if optional or not c.optional]
    for i, (case, node) in enumerate(zip(fleet, fake_gpu_nodes(len(fleet), labels=pool),
                                         strict=True)):  # fmt: skip
        case.node = node
        user = (namespace, POD) if case.name == "xid13" else None
        case.gpu = exporter.add_gpu(exporter_labels(node, 0, GPU_UUIDS[i % 8], pod=user))
    apply(kube, gpu_pod(POD, namespace, node_name=fleet[0].node))
    wait_pods_running(kube, namespace, count=1)

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = controller_config(
        pool,
        apiTokenFile=str(token_file),
        p1EscalationSeconds=600,
        applicationXids={"perGpu": PER_GPU},
    )
    rules: list[dict[str, Any]] = []
    webhook = "http://127.0.0.1:9/unused"
    controller: ControllerProcess | None = None
    if path == "alertmanager":
        controller = start_controller(config).wait_leading()
        rules, webhook = chart_rules(control_plane, tmp_path), f"{controller.url}/api/v1/alerts"
    monitoring = Monitoring(
        tmp_path / "monitoring",
        targets=[f"127.0.0.1:{exporter.port}"],
        rules=rules,
        webhook_url=webhook,
        token_file=token_file,
        repeat_interval="3s",
    ).start()
    try:
        if controller is None:
            config |= {"dcgmPrometheusUrl": monitoring.prometheus_url, "dcgmIntervalSeconds": 1}
            controller = start_controller(config).wait_leading()
        # Every GPU healthy and scraped first, then everything happens at once.
        scraped = "count(DCGM_FI_DEV_XID_ERRORS == 0)"
        wait_for("the GPUs scraped", lambda: prometheus_query(monitoring, scraped))
        time.sleep(2)
        taken, held = happen(kube, exporter, fleet)
        settled(kube, fleet, path)
        if path == "dcgm":
            told_not_acted(kube, controller, namespace, optional=optional)
        else:
            # The chart's rules never alerted on what must not taint.
            alerted = {a["metric"]["Hostname"] for a in prometheus_query(monitoring, "ALERTS")}
            assert alerted == {c.node for c in fleet if c.want != "spared"}
            assert 'gpuheal_alerts_total{result="accepted"}' in controller.metrics()
        print(
            f"\n{path}, {'optional fields' if optional else 'default counters'}: "
            + ", ".join(f"{name} at {at:.1f}s" for name, at in taken.items())
            + f"; {', '.join(c.name for c in fleet if c.want == 'spared')}: never tainted"
            f" nor recorded, watched until {held:.1f}s"
        )
    finally:
        monitoring.stop()


POD = "trainer-0"  # the user program on the Xid 13 GPU, as dcgm-exporter names it


def happen(
    kube: Client, exporter: FakeDcgmExporter, fleet: list[Case]
) -> tuple[dict[str, float], float]:
    """Every case's Xids and fields at once; wait for the faults, then watch what
    must not taint for HOLD_S more. When each fault was taken, and until when the
    rest was watched (seconds after it all happened)."""
    started = time.monotonic()
    for case in fleet:
        assert case.gpu is not None
        for code in case.xids:
            exporter.xid(case.gpu, code)
        for counter, number in case.fields:
            exporter.set_field(case.gpu, counter, number)
    when: dict[str, float] = {}

    def taken() -> bool:
        for case in fleet:
            if case.name in when or case.want == "spared":
                continue
            if our_taint(kube, case.node) if case.want == "drained" else faults_of(kube, case.node):
                when[case.name] = time.monotonic() - started
        return len(when) == len([c for c in fleet if c.want != "spared"])

    wait_for("every fault taken", taken, timeout_s=60)
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        for case in fleet:
            if case.want != "drained":
                assert our_taint(kube, case.node) is None, case.name  # watched, not drained
            if case.want == "spared":
                assert faults_of(kube, case.node) == [], case.name
        time.sleep(0.5)
    return when, time.monotonic() - started


def settled(kube: Client, fleet: list[Case], path: str) -> None:
    """Each fault taken exactly once, as the catalogue (or NVIDIA's remap guide) says."""
    for case in fleet:
        if case.want == "spared":
            continue
        (record,) = faults_of(kube, case.node)  # exactly once
        spec, status = record.spec, record.status or {}
        severity = "P0" if case.want == "drained" else "P1"
        assert (spec["reason"], spec["severity"]) == (case.reason, severity), case.name
        assert spec["source"].split("/")[0] == path
        if case.want == "drained":
            assert len(events_for(kube, case.node, "GPUFaultQuarantined", at_least=1)) == 1, (
                case.name
            )
        else:
            assert status.get("phase") == "Detected", case.name  # watched: pods stay


def told_not_acted(
    kube: Client, controller: ControllerProcess, namespace: str, *, optional: bool
) -> None:
    """The DCGM source saw the application Xids, counted them and told the user
    program's pod; it says which queries cannot see anything, and stays ready."""
    for code in (13, 31, 43):
        assert observed(controller, "dcgm", code) >= 1, code
    told = [
        e
        for e in kube.list(Event, namespace=namespace, fields={"involvedObject.name": POD})
        if e.reason == "GPUApplicationXid"
    ]
    assert len(told) == 1 and "Xid 13" in str(told[0].message), told
    status, ready = readyz(controller)
    assert status == 200 and ready["ready"]
    blind = {r.split(" ")[2] for r in ready["reasons"] if r.startswith("dcgm: query")}
    assert blind == (
        set()
        if optional
        else {
            "dbe",
            "remappend",
            "nvreplay",
            "nvrecover",
            "hwslow",
            "hwthermal",
            "hwbrake",
            "appxids",
        }
    )


def test_usage_alerts_name_the_pod_and_reach_gpuheal_as_no_fault(
    kube: Client,
    control_plane: ControlPlane,
    tmp_path: Path,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    """dcgm-exporter's default fields: a GPU a pod holds at 0 % (a stalled job) and a GPU
    nearly out of memory alert, named with the pod; a GPU idle without a pod does not.
    Routed to gpuheal's webhook, neither is a fault: nothing is tainted or recorded."""
    stalled, full, idle = fake_gpu_nodes(3, labels=pool)
    exporter = FakeDcgmExporter().start()
    exporter.add_gpu(exporter_labels(stalled, 0, GPU_UUIDS[0], pod=(namespace, POD)), **{
        "DCGM_FI_DEV_GPU_UTIL": 0.0})  # fmt: skip
    exporter.add_gpu(exporter_labels(full, 0, GPU_UUIDS[1], pod=(namespace, "infer-0")), **{
        "DCGM_FI_DEV_FB_USED": 78_000.0, "DCGM_FI_DEV_FB_FREE": 3_920.0})  # fmt: skip
    exporter.add_gpu(exporter_labels(idle, 0, GPU_UUIDS[2]), **{"DCGM_FI_DEV_GPU_UTIL": 0.0})
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    controller = start_controller(controller_config(pool, apiTokenFile=str(token_file)))
    controller.wait_leading()
    usage = {"GPUMemoryHigh", "GPUStalledJob"}
    rules = [r for r in alert_rules(control_plane, "gpuheal-dcgm") if r["alert"] in usage]
    assert {r["alert"] for r in rules} == usage
    monitoring = Monitoring(
        tmp_path / "monitoring", targets=[f"127.0.0.1:{exporter.port}"], rules=rules,
        webhook_url=f"{controller.url}/api/v1/alerts", token_file=token_file,
        repeat_interval="3s",
    ).start()  # fmt: skip
    try:

        def alerting() -> set[tuple[str, str, str]]:
            found = prometheus_query(monitoring, 'ALERTS{alertstate="firing"}')
            return {
                (a["metric"]["alertname"], a["metric"]["Hostname"], a["metric"].get("pod", ""))
                for a in found
            }

        wanted = {("GPUStalledJob", stalled, POD), ("GPUMemoryHigh", full, "infer-0")}
        wait_for("the usage alerts", lambda: alerting() == wanted, timeout_s=60)
        wait_for(
            "told to gpuheal",
            lambda: 'gpuheal_alerts_total{result="skipped"}' in controller.metrics(),
            timeout_s=60,
        )
        time.sleep(3)  # the controller's passes over what it was told
        for node in (stalled, full, idle):
            assert our_taint(kube, node) is None
        assert faults_of(kube, stalled) == faults_of(kube, full) == []
    finally:
        monitoring.stop()
        exporter.stop()
