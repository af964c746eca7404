"""`gpuheal status` and `gpuheal audit`: the pure analysis of a snapshot of slim
projections (the objects built here are decoded as the CLI decodes the API's)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pytest
from rich.console import Console

from gpuheal.config import Config, parse_config
from gpuheal.kube.projections import FaultJson, NodeJson, PodJson, fault_record
from gpuheal.kube.snapshot import Snapshot
from gpuheal.model import (
    CUDA_VERSION,
    DRIVER_VERSION,
    GPU_PROCESSES,
    MANAGED_LABEL,
    STATE_LABEL,
    STATUS,
    SUSPECT_DEVICES,
    TAINT_KEY,
    VBIOS_VERSION,
    FaultRecord,
)
from gpuheal.ops.audit import audit
from gpuheal.ops.output import render
from gpuheal.ops.selector import SelectorError, parse_selector, selected
from gpuheal.ops.status import age, fleet_status
from tests.corpus import EKS_NODE

NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)


def stamp(seconds_ago: float) -> str:
    return (NOW - dt.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(
    name: str,
    *,
    pool: str | None = "a",
    gpus: int = 8,
    allocatable: int | None = None,
    ready: str = "True",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> NodeJson:
    base = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(gpus)}
    if pool:
        base["gpuheal.io/pool"] = pool
    alloc = gpus if allocatable is None else allocatable
    return msgspec.convert(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {**base, **(labels or {})},
                "annotations": dict(annotations or {}),
            },
            "spec": {"taints": [dict(t) for t in taints]},
            "status": {
                "capacity": {"cpu": "8", "nvidia.com/gpu": str(gpus)},
                "allocatable": {"cpu": "8", "nvidia.com/gpu": str(alloc)},
                "conditions": [{"type": "Ready", "status": ready}],
            },
        },
        NodeJson,
    )


def pod(
    name: str,
    on: str,
    *,
    gpus: int = 1,
    phase: str = "Running",
    uid: str = "",
    deleted_ago: float | None = None,
    finalizers: Sequence[str] = (),
) -> PodJson:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": uid or f"uid-{name}"}
    if deleted_ago is not None:
        meta["deletionTimestamp"] = stamp(deleted_ago)
        meta["deletionGracePeriodSeconds"] = 30
    if finalizers:
        meta["finalizers"] = list(finalizers)
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return msgspec.convert(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "nodeName": on,
                "containers": [{"name": "c", "image": "x", "resources": resources}],
            },
            "status": {"phase": phase},
        },
        PodJson,
    )


def fault(
    node_name: str, phase: str | None, *, scope: str = "node", ago: float = 300
) -> FaultRecord:
    body: dict[str, Any] = {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "GPUFault",
        "metadata": {"name": f"{node_name}-f", "creationTimestamp": stamp(ago)},
        "spec": {
            "node": node_name,
            "faultID": f"{node_name}-1",
            "scope": scope,
            "source": "agent",
            "reason": "XidCritical79",
            "severity": "P0",
        },
    }
    if phase:
        body["status"] = {"phase": phase}
    return fault_record(msgspec.convert(body, FaultJson))


def snap(
    nodes: Sequence[NodeJson], pods: Sequence[PodJson] = (), faults: Sequence[FaultRecord] = ()
) -> Snapshot:
    return Snapshot(nodes=list(nodes), pods=list(pods), faults=list(faults))


# -- status ------------------------------------------------------------------------


def test_node_states_follow_their_precedence() -> None:
    maintenance = {STATE_LABEL: "maintenance"}
    taint = [{"key": TAINT_KEY, "value": "f", "effect": "NoSchedule"}]
    nodes = [
        node("n0"),
        node("n1", ready="False", labels=maintenance),  # not ready beats maintenance
        node("n2", labels=maintenance, taints=taint),  # maintenance beats quarantined
        node("n3"),  # held record
        node("n4", taints=taint),  # draining beats quarantined
        node("n5", taints=taint),
        node("n6"),  # record Recovering, taint already gone
        node("n7", annotations={SUSPECT_DEVICES: "GPU-1"}),
        node("n8", annotations={STATUS: "faulty"}),  # reported, not acted on
        node("n9"),  # P1 watched: record Detected
        node("n10", ready="Unknown"),
        node("n11"),  # a resolved record is history
    ]
    records = [
        fault("n3", "Held"),
        fault("n4", "Draining"),
        fault("n6", "Recovering"),
        fault("n9", "Detected"),
        fault("n11", "Resolved"),
    ]
    report = fleet_status(snap(nodes, faults=records), Config(), NOW)
    states = {n.node: n.state for n in report.nodes}
    assert states == {
        "n0": "healthy",
        "n1": "not-ready",
        "n2": "maintenance",
        "n3": "held",
        "n4": "draining",
        "n5": "quarantined",
        "n6": "quarantined",
        "n7": "suspect",
        "n8": "suspect",
        "n9": "suspect",
        "n10": "not-ready",
        "n11": "healthy",
    }
    assert report.by_state() == {
        "healthy": 2,
        "suspect": 3,
        "quarantined": 2,
        "draining": 1,
        "held": 1,
        "maintenance": 1,
        "not-ready": 2,
    }
    # Only our fault taint counts against the breaker (n2's maintenance hides its state,
    # not its taint); 12 nodes at 10 %: capacity 1.
    assert report.data()["breaker"] == {
        "capacity": 1,
        "quarantined": 3,
        "rolling": 0,
        "remaining": 0,
    }
    assert [f["node"] for f in report.data()["faults"]] == ["n3", "n4", "n6", "n9"]


def test_a_device_record_makes_a_node_suspect_not_quarantined() -> None:
    report = fleet_status(
        snap([node("n0")], faults=[fault("n0", "Quarantined", scope="device")]), Config(), NOW
    )
    assert report.nodes[0].state == "suspect"


def test_gpus_per_pool_count_live_pods_only() -> None:
    nodes = [
        node("a0"),
        node("a1", allocatable=6),
        node("b0", pool="b", gpus=4),
        node("cpu", pool=None, gpus=0, labels={"nvidia.com/gpu.present": "false"}),
    ]
    pods = [
        pod("p0", "a0", gpus=4),
        pod("p1", "a1", gpus=2),
        pod("done", "a1", gpus=8, phase="Succeeded"),
        pod("p2", "b0", gpus=1),
        pod("cpu-only", "b0", gpus=0),
        pod("elsewhere", "cpu", gpus=0),
    ]
    data = fleet_status(snap(nodes, pods), Config(), NOW).data()
    assert data["pools"] == [
        {"pool": "a", "nodes": 2, "capacity": 16, "allocatable": 14, "allocated": 6},
        {"pool": "b", "nodes": 1, "capacity": 4, "allocatable": 4, "allocated": 1},
    ]
    assert data["nodes"]["total"] == 3


def test_status_renders_tables_and_stable_json() -> None:
    report = fleet_status(snap([node("a0")], faults=[fault("a0", "Held", ago=7200)]), Config(), NOW)
    console = Console(record=True, width=200)
    render(report, "table", console)
    text = console.export_text()
    for expected in ("GPU nodes by state (1)", "held", "GPUs per pool", "Open faults", "2h"):
        assert expected in text
    assert "1 of 1 quarantine slots left" in text
    data = report.data()
    assert set(data) == {
        "nodes", "nodeStates", "pools", "faults", "breaker", "wouldHave", "agentAccess",
    }  # fmt: skip
    assert data["faults"][0]["ageSeconds"] == 7200
    assert data["faults"][0]["phase"] == "Held"


def test_age_is_short() -> None:
    assert age(NOW - dt.timedelta(seconds=42), NOW) == "42s"
    assert age(NOW - dt.timedelta(minutes=5), NOW) == "5m"
    assert age(NOW - dt.timedelta(hours=3), NOW) == "3h"
    assert age(NOW - dt.timedelta(days=4), NOW) == "4d"
    assert age(None, NOW) == "?"


# -- audit -------------------------------------------------------------------------


def kinds(report: Any) -> list[tuple[str, str]]:
    return [(f.kind, f.node) for f in report.findings]


def test_a_clean_fleet_has_no_findings() -> None:
    nodes = [node(f"a{i}", annotations={DRIVER_VERSION: "550.54.15"}) for i in range(3)]
    report = audit(snap(nodes, [pod("p", "a0", uid="u1")]), Config(), NOW)
    assert report.findings == () and report.nodes == 3
    assert report.data() == {"findings": [], "counts": {}, "nodes": 3}


def test_gpu_nodes_outside_the_node_selector_are_reported() -> None:
    """A GPU node without nvidia.com/gpu.present (the default nodeSelector) is ignored
    by the controller: audit says so, with the label to add; an opt-out is meant."""
    bare = node(EKS_NODE, labels={"nvidia.com/gpu.present": "false"})
    opted_out = node(
        "opted-out", labels={"nvidia.com/gpu.present": "false", MANAGED_LABEL: "false"}
    )
    managed = node("managed", annotations={DRIVER_VERSION: "550.54.15"})
    report = audit(snap([bare, opted_out, managed]), Config(), NOW)
    found = [f for f in report.findings if f.kind == "unmanaged"]
    assert [f.node for f in found] == [EKS_NODE]
    assert "nvidia.com/gpu.present=true" in found[0].detail
    assert "has 8 GPU(s)" in found[0].detail
    # No labels at all, only capacity: still a GPU node, still reported.
    unlabelled = node("no-labels", pool=None, labels={"nvidia.com/gpu.present": "x"})
    unlabelled.metadata.labels = {}
    assert ("unmanaged", "no-labels") in kinds(audit(snap([unlabelled]), Config(), NOW))


def test_leaks_stuck_terminating_pods_not_ready_nodes_and_overallocation() -> None:
    nodes = [node("a0"), node("a1", ready="Unknown"), node("a2", allocatable=2)]
    pods = [
        pod("stuck", "a0", gpus=2, deleted_ago=600, finalizers=["example.com/keep"]),
        pod("ending", "a0", gpus=2, deleted_ago=10),  # within its grace: not a leak
        pod("orphan", "a1", gpus=8),
        pod("over", "a2", gpus=4),
    ]
    report = audit(snap(nodes, pods), Config(), NOW)
    # a2's device plugin withdrew 6 GPUs under its pods: the drop is said too.
    assert kinds(report) == [
        ("leak", "a0"),
        ("leak", "a1"),
        ("leak", "a2"),
        ("allocatable-drop", "a2"),
    ]
    stuck, orphan, over, _drop = (f.detail for f in report.findings)
    assert "ml/stuck holds 2 GPU(s)" in stuck and "10m past its grace period" in stuck
    assert "example.com/keep" in stuck
    assert "Unknown and still counts 8 GPU(s) for ml/orphan (8)" in orphan
    assert "4 GPU(s) allocated to live pods but only 2 allocatable" in over


def test_zombie_and_host_gpu_processes() -> None:
    processes = "10@live,11@gone,12@gone,13@,14@done,15@?"  # 15: the agent could not tell
    nodes = [node("a0", annotations={GPU_PROCESSES: processes})]
    pods = [pod("p", "a0", uid="live"), pod("d", "a0", uid="done", phase="Failed")]
    report = audit(snap(nodes, pods), Config(), NOW)
    assert kinds(report) == [
        ("zombie-process", "a0"),
        ("zombie-process", "a0"),
        ("host-process", "a0"),
    ]
    done, gone, host = report.findings
    assert "process 14 of pod UID done" in done.detail
    assert "processes 11, 12 of pod UID gone" in gone.detail
    assert "process 13 runs outside any pod" in host.detail and host.severity == "warning"


def test_a_malformed_process_report_is_a_warning_not_a_crash() -> None:
    nodes = [node("a0", annotations={GPU_PROCESSES: "garbage,,x@y,15@gone"})]
    report = audit(snap(nodes), Config(), NOW)
    assert kinds(report) == [("zombie-process", "a0")]
    assert len(report.warnings) == 1 and "2 malformed entries" in report.warnings[0]


def test_zero_allocatable_gpu_nodes_even_without_capacity() -> None:
    nodes = [
        node("a0", allocatable=0),
        node("a1", gpus=0, labels={"nvidia.com/gpu.count": "8"}),  # plugin never came up
        node("a2", allocatable=0, labels={STATE_LABEL: "maintenance"}),  # expected there
        node("cpu", pool=None, gpus=0, labels={"nvidia.com/gpu.present": "false"}),
    ]
    nodes[3].metadata.labels.pop("nvidia.com/gpu.count")
    report = audit(snap(nodes), Config(), NOW)
    assert kinds(report) == [("zero-allocatable", "a0"), ("zero-allocatable", "a1")]
    assert report.nodes == 3
    assert "gpuheal doctor a0" in report.findings[0].detail


def test_a_nodes_vbios_other_than_its_pools_is_skew_its_own_gpus_disagreeing_is_not() -> None:
    def flashed(name: str, pool: str, vbios: str) -> NodeJson:
        return node(
            name, pool=pool, annotations={DRIVER_VERSION: "550.54.15", VBIOS_VERSION: vbios}
        )

    nodes = [
        flashed("a0", "a", "96.00.89.00.01"),
        flashed("a1", "a", "96.00.89.00.01"),
        flashed("a2", "a", "96.00.74.00.0D"),
        flashed("a3", "a", "96.00.74.00.0D,96.00.89.00.01"),  # the agent's own warning
        node("a4", pool="a"),  # unknown: not a finding
    ]
    report = audit(snap(nodes), Config(), NOW)
    assert kinds(report) == [("vbios-skew", "a2")]
    assert "VBIOS 96.00.74.00.0D differs from 96.00.89.00.01" in report.findings[0].detail
    pinned = parse_config({"pools": {"byName": {"a": {"vbiosVersion": "96.00.74.00.0D"}}}})
    assert kinds(audit(snap(nodes), pinned, NOW)) == [("vbios-skew", "a0"), ("vbios-skew", "a1")]


def test_driver_and_cuda_skew_against_the_prevailing_or_configured_version() -> None:
    def versioned(name: str, pool: str, driver: str, cuda: str = "12.4") -> NodeJson:
        return node(name, pool=pool, annotations={DRIVER_VERSION: driver, CUDA_VERSION: cuda})

    nodes = [
        versioned("a0", "a", "550.54.15"),
        versioned("a1", "a", "550.54.15"),
        versioned("a2", "a", "535.104.05", "12.2"),
        versioned("b0", "b", "550.54.15"),
        versioned("b1", "b", "550.90.07"),
        node("b2", pool="b"),  # version unknown: not a finding
    ]
    report = audit(snap(nodes), Config(), NOW)
    assert kinds(report) == [("driver-skew", "a2"), ("driver-skew", "b0"), ("cuda-skew", "a2")]
    assert "driver 535.104.05 differs from 550.54.15" in report.findings[0].detail
    assert "2 of 3 nodes" in report.findings[0].detail
    configured = parse_config({"pools": {"byName": {"b": {"driverVersion": "550.90.07"}}}})
    report = audit(snap(nodes), configured, NOW)
    assert ("driver-skew", "b0") in kinds(report) and ("driver-skew", "b1") not in kinds(report)
    assert "configured" in next(f.detail for f in report.findings if f.node == "b0")


def test_missing_labels_and_taints_fleet_wide_and_per_pool() -> None:
    config = parse_config(
        {
            "pools": {
                "expectedLabels": {"topology.kubernetes.io/zone": "*"},
                "expectedTaints": ["nvidia.com/gpu:NoSchedule"],
                "byName": {
                    "a": {
                        "expectedLabels": {"example.com/tier": "training"},
                        "expectedTaints": ["example.com/dedicated=ml:NoExecute"],
                    }
                },
            }
        }
    )
    gpu_taint = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    ml_taint = {"key": "example.com/dedicated", "value": "ml", "effect": "NoExecute"}
    zone = {"topology.kubernetes.io/zone": "z1"}
    nodes = [
        node("a0", labels={**zone, "example.com/tier": "training"}, taints=[gpu_taint, ml_taint]),
        node("a1", labels={**zone, "example.com/tier": "serving"}, taints=[gpu_taint]),
        node("x0", pool=None, labels=zone, taints=[gpu_taint]),  # pools configured: needs one
    ]
    report = audit(snap(nodes), config, NOW)
    assert kinds(report) == [
        ("missing-label", "a1"),
        ("missing-label", "x0"),
        ("missing-taint", "a1"),
    ]
    tier, pool_label, taint = (f.detail for f in report.findings)
    assert "label example.com/tier is 'serving', expected 'training'" in tier
    assert "label gpuheal.io/pool is missing" in pool_label
    assert "taint example.com/dedicated=ml:NoExecute is missing" in taint


def test_audit_renders_grouped_by_kind_with_counts() -> None:
    nodes = [node("a0", allocatable=0), node("a1", allocatable=0)]
    report = audit(snap(nodes), Config(), NOW)
    console = Console(record=True, width=200)
    render(report, "table", console)
    text = console.export_text()
    assert "zero-allocatable (2)" in text
    assert "2 finding(s) on 2 of 2 GPU node(s): 2 zero-allocatable" in text
    assert report.data()["counts"] == {"zero-allocatable": 2}


@pytest.mark.timeout(60)
def test_status_and_audit_stay_fast_at_a_thousand_nodes() -> None:
    nodes = [
        node(f"n{i}", pool=f"p{i % 4}", annotations={DRIVER_VERSION: "550.54.15"})
        for i in range(1000)
    ]
    pods = [pod(f"p{i}", f"n{i % 1000}", uid=f"u{i}") for i in range(8000)]
    snapshot = snap(nodes, pods)
    started = time.monotonic()
    fleet_status(snapshot, Config(), NOW)
    audit(snapshot, Config(), NOW)
    assert time.monotonic() - started < 5  # linear: well under a second on a laptop


# -- label selectors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("", {}, True),
        ("pool=a", {"pool": "a"}, True),
        ("pool==a", {"pool": "b"}, False),
        ("pool!=a", {}, True),
        ("pool=a, zone", {"pool": "a", "zone": "z"}, True),
        ("pool=a,zone", {"pool": "a"}, False),
        ("!zone", {"pool": "a"}, True),
        ("!zone", {"zone": ""}, False),
        ("pool=", {"pool": ""}, True),
    ],
)
def test_label_selectors_like_kubectl(text: str, labels: dict[str, str], expected: bool) -> None:
    assert selected(labels, parse_selector(text)) is expected


@pytest.mark.parametrize("text", ["=a", "pool=a=b", "a,,b", "pool in (a,b)", "!"])
def test_unreadable_selectors_are_refused(text: str) -> None:
    with pytest.raises(SelectorError, match="cannot read the label selector"):
        parse_selector(text)


def test_a_selector_narrows_status_and_audit_but_not_the_breaker() -> None:
    taint = [{"key": TAINT_KEY, "value": "f", "effect": "NoSchedule"}]
    nodes = [node("a0", taints=taint), node("b0", pool="b", allocatable=0)]
    only_a = parse_selector("gpuheal.io/pool=a")
    report = fleet_status(snap(nodes, faults=[fault("b0", "Held")]), Config(), NOW, only_a)
    assert [n.node for n in report.nodes] == ["a0"] and report.faults == ()
    assert report.breaker.quarantined == 1 and report.breaker.capacity == 1
    assert audit(snap(nodes), Config(), NOW, selector=only_a).findings == ()
    assert kinds(audit(snap(nodes), Config(), NOW)) == [("zero-allocatable", "b0")]


def test_the_stuck_threshold_is_adjustable() -> None:
    nodes = [node("a0")]
    pods = [pod("stuck", "a0", deleted_ago=20)]
    assert audit(snap(nodes, pods), Config(), NOW).findings == ()
    assert kinds(audit(snap(nodes, pods), Config(), NOW, stuck_after_s=5)) == [("leak", "a0")]
