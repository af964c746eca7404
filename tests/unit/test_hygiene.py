"""Fleet hygiene: the checks the controller runs from its caches (policy/hygiene.py),
its loop's signals (controller/hygiene.py) and its metrics (metrics/hygiene.py).
`gpuheal audit`'s own tests (test_ops_status_audit.py) cover the kinds it had."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuheal.clock import iso
from gpuheal.config import Config, HealthGateConfig, HygieneConfig, parse_config
from gpuheal.controller.hygiene import HygieneLoop
from gpuheal.metrics.hygiene import HygieneCollector
from gpuheal.model import (
    STATE_LABEL,
    STATE_MAINTENANCE,
    Condition,
    FaultRecord,
    FaultSignal,
    NodeView,
    Phase,
    PodView,
    Severity,
)
from gpuheal.policy.hygiene import KINDS, examine
from gpuheal.sources import hygiene as source
from tests.corpus import unique_eks_node
from tests.port import Port

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 12, 4, 10, 0, 0, tzinfo=dt.UTC)
PLUGIN = {"app": "nvidia-device-plugin-daemonset"}


def gpu_node(
    name: str,
    *,
    capacity: int = 8,
    allocatable: int | None = None,
    ready_since: dt.datetime = NOW - dt.timedelta(hours=1),
    labels: Mapping[str, str] | None = None,
) -> NodeView:
    offered = capacity if allocatable is None else allocatable
    return NodeView(
        name=name,
        resource_version="1",
        labels={"nvidia.com/gpu.present": "true", "gpuheal.io/pool": "h100", **(labels or {})},
        conditions=(Condition("Ready", "True", last_transition_time=iso(ready_since)),),
        gpus=capacity,
        capacity=(("nvidia.com/gpu", capacity),),
        allocatable=(("nvidia.com/gpu", offered),),
    )


def plugin_pod(node: str) -> PodView:
    return PodView(
        "gpu-operator",
        f"nvidia-device-plugin-daemonset-{node[:5]}",
        f"uid-{node}",
        node,
        "Running",
        daemonset=True,
        device_plugin=True,
    )


def kinds(
    nodes: Iterable[NodeView], pods: Mapping[str, list[PodView]], config: Config
) -> list[tuple[str, str]]:
    return [(f.kind, f.node) for f in examine(nodes, pods, config, NOW).findings]


# -- the checks the audit did not have -------------------------------------------------------


def test_gpus_the_device_plugin_withdrew_and_a_gpu_the_pool_misses_are_allocatable_drops() -> None:
    withdrawn, lost, fine = unique_eks_node(), unique_eks_node(), unique_eks_node()
    nodes = [
        gpu_node(withdrawn, allocatable=6),
        gpu_node(lost, capacity=7, labels={"nvidia.com/gpu.count": "8"}),
        gpu_node(fine),
    ]
    seen = examine(nodes, {}, Config(), NOW)
    assert [(f.kind, f.node) for f in seen.findings] == sorted(
        [("allocatable-drop", withdrawn), ("allocatable-drop", lost)], key=lambda k: k[1]
    )
    details = {f.node: f.detail for f in seen.findings}
    assert details[withdrawn].startswith("offers 6 of its 8 GPU(s): the device plugin withdrew 2")
    assert details[lost].startswith("has 7 GPU(s), its pool expects 8")


def test_a_node_in_maintenance_has_no_allocatable_finding() -> None:
    """Its GPUs are down on purpose: a driver upgrade, a reboot."""
    node = gpu_node(unique_eks_node(), allocatable=0, labels={STATE_LABEL: STATE_MAINTENANCE})
    assert kinds([node], {}, Config()) == []


def test_a_ready_gpu_node_without_the_device_plugin_the_others_run_is_a_finding() -> None:
    covered, bare = unique_eks_node(), unique_eks_node()
    pods = {covered: [plugin_pod(covered)]}
    seen = examine([gpu_node(covered), gpu_node(bare)], pods, Config(), NOW)
    (finding,) = seen.findings
    assert (finding.kind, finding.node, finding.pool) == ("device-plugin-missing", bare, "h100")
    assert "though 1 other GPU node(s) run one" in finding.detail
    assert "app=nvidia-device-plugin-daemonset" in finding.detail


def test_no_device_plugin_finding_while_the_node_starts_or_where_the_selector_finds_none() -> None:
    """A node Ready for less than the grace is starting its DaemonSet's pod; a fleet
    where the selector matches no pod at all names its plugin otherwise (GKE): no
    finding either way, unless the config requires the plugin."""
    covered, young = unique_eks_node(), unique_eks_node()
    started = gpu_node(young, ready_since=NOW - dt.timedelta(seconds=299))
    assert kinds([gpu_node(covered), started], {covered: [plugin_pod(covered)]}, Config()) == []
    bare = [gpu_node(unique_eks_node()), gpu_node(unique_eks_node())]
    assert kinds(bare, {}, Config()) == []
    required = Config(health_gate=HealthGateConfig(device_plugin_required=True))
    assert [k for k, _ in kinds(bare, {}, required)] == ["device-plugin-missing"] * 2
    ending = replace(plugin_pod(covered), deleting=True)
    assert kinds([gpu_node(covered)], {covered: [ending]}, required) == [
        ("device-plugin-missing", covered)
    ]


def test_a_pods_gpus_are_the_schedulers_count_for_leaks() -> None:
    """An init container with more GPUs than the containers' sum holds that many."""
    node = unique_eks_node()
    pod = PodView("ml", "trainer-0", "u1", node, "Running", gpu=True, gpu_count=8)
    found = examine([gpu_node(node, capacity=8, allocatable=4)], {node: [pod]}, Config(), NOW)
    assert ("leak", node) in [(f.kind, f.node) for f in found.findings]


# -- the loop's signals -----------------------------------------------------------------------


class Fleet:
    """What the loop reads from the caches, and what it submits and resolves."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.nodes: dict[str, NodeView] = {}
        self.pods: dict[str, PodView] = {}
        self.records: list[FaultRecord] = []
        self.submitted: list[FaultSignal] = []
        self.resolved: list[tuple[str, str]] = []
        self.unmanaged: set[str] = set()
        self.looked = 0
        self.now = NOW

    def loop(self) -> HygieneLoop:
        by_node: dict[str, set[str]] = {}
        for key, pod in self.pods.items():
            by_node.setdefault(pod.node, set()).add(key)
        return HygieneLoop(
            lambda: self.config,
            nodes=self.nodes.values,
            pod=self.pods.get,
            pods_by_node=by_node,
            records=lambda: self.records,
            port=Port(
                submit=self._submit,
                resolve=self._resolve,
                managed=lambda node: node not in self.unmanaged,
                settled=self._looked,
            ),
            clock=lambda: self.now,
        )

    def _looked(self) -> None:
        self.looked += 1

    def _submit(self, signal: FaultSignal) -> bool:
        self.submitted.append(signal)
        return True

    def _resolve(self, node: str, fault: str) -> int:
        self.resolved.append((node, fault))
        return 1


def signalling(**hygiene: object) -> Config:
    return parse_config({"hygiene": {"signals": {"zero-allocatable": "P1"}, **hygiene}})


def test_a_configured_finding_is_a_signal_once_it_has_lasted_and_ends_with_the_finding() -> None:
    fleet = Fleet(signalling(signalAfterSeconds=600))
    node = unique_eks_node()
    fleet.nodes[node] = gpu_node(node, allocatable=0)
    loop = fleet.loop()
    loop.examine_once()
    assert fleet.submitted == [] and fleet.looked == 1  # seen, not yet long enough
    fleet.now = NOW + dt.timedelta(seconds=599)
    loop.examine_once()
    assert fleet.submitted == []
    fleet.now = NOW + dt.timedelta(seconds=600)
    loop.examine_once()
    (signal,) = fleet.submitted
    assert signal == FaultSignal(
        node,
        "hygiene-zero-allocatable-20261204100000",
        "GPUsNotAllocatable",
        "hygiene/zero-allocatable",
        Severity.P1,
        "2026-12-04T10:00:00Z",
    )
    fleet.now += dt.timedelta(seconds=60)
    loop.examine_once()
    assert fleet.submitted == [signal, signal]  # again each run: the held signal stays fresh
    fleet.nodes[node] = gpu_node(node)
    loop.examine_once()
    assert fleet.resolved == [(node, signal.fault_id)]
    assert len(fleet.submitted) == 2


def test_no_signal_unless_configured_nor_for_an_unmanaged_node() -> None:
    """The default: findings are metrics and alerts, never a drain."""
    fleet = Fleet(Config())
    node, other = unique_eks_node(), unique_eks_node()
    fleet.nodes = {node: gpu_node(node, allocatable=0), other: gpu_node(other, allocatable=0)}
    loop = fleet.loop()
    for minutes in (0, 20, 60):
        fleet.now = NOW + dt.timedelta(minutes=minutes)
        loop.examine_once()
    assert fleet.submitted == [] and fleet.looked == 3
    assert len(loop.last.examination.findings) == 2 if loop.last else False
    fleet.config = signalling(signalAfterSeconds=0)
    fleet.unmanaged = {other}
    loop.examine_once()
    assert [s.node for s in fleet.submitted] == [node]


def test_a_restarted_controller_adopts_the_open_records_fault_at_once() -> None:
    """Not a second record, and no new wait: the finding is that fault still."""
    fleet = Fleet(signalling(signalAfterSeconds=600))
    node = unique_eks_node()
    fleet.nodes[node] = gpu_node(node, allocatable=0)
    fault = "hygiene-zero-allocatable-20261204083000"
    fleet.records = [
        FaultRecord(
            "gpufault-1",
            node,
            fault,
            Phase.QUARANTINED,
            source="hygiene/zero-allocatable",
            detected_at="2026-12-04T08:30:00Z",
        ),
        FaultRecord("old", node, "hygiene-zero-allocatable-2025", Phase.RESOLVED,
                    source="hygiene/zero-allocatable"),
    ]  # fmt: skip
    fleet.loop().examine_once()
    (signal,) = fleet.submitted
    assert (signal.fault_id, signal.detected_at) == (fault, "2026-12-04T08:30:00Z")


def test_a_finding_whose_kind_is_no_longer_configured_is_resolved() -> None:
    fleet = Fleet(signalling(signalAfterSeconds=0))
    node = unique_eks_node()
    fleet.nodes[node] = gpu_node(node, allocatable=0)
    loop = fleet.loop()
    loop.examine_once()
    (signal,) = fleet.submitted
    fleet.config = Config()
    loop.examine_once()
    assert fleet.resolved == [(node, signal.fault_id)]


def test_signal_kinds_are_only_the_ones_that_leave_gpus_unusable() -> None:
    with pytest.raises(ValueError, match=r"hygiene\.signals: must be zero-allocatable"):
        parse_config({"hygiene": {"signals": {"driver-skew": "P0"}}})
    with pytest.raises(ValueError, match=r"hygiene\.signals"):
        parse_config({"hygiene": {"signals": {"zero-allocatable": "P3"}}})
    assert HygieneConfig().signals == {}


def test_fault_ids_are_label_values_and_name_the_start() -> None:
    since = dt.datetime(2026, 12, 4, 10, 15, tzinfo=dt.UTC)
    for kind in source.REASONS:
        fault = source.fault_id(kind, since)
        assert fault == f"hygiene-{kind}-20261204101500" and len(fault) <= 63


# -- metrics ---------------------------------------------------------------------------------


def test_the_metric_counts_each_kind_per_pool_from_zero() -> None:
    fleet = Fleet(Config())
    withdrawn, fine = unique_eks_node(), unique_eks_node()
    fleet.nodes = {
        withdrawn: gpu_node(withdrawn, allocatable=6),
        fine: gpu_node(fine, labels={"gpuheal.io/pool": "a100"}),
    }
    loop = fleet.loop()
    registry = CollectorRegistry()
    registry.register(HygieneCollector(lambda: loop.last))
    assert generate_latest(registry) == b""  # nothing before the first examination
    loop.examine_once()
    text = generate_latest(registry).decode()
    assert 'gpuheal_hygiene_findings{kind="allocatable-drop",pool="h100"} 1.0' in text
    assert 'gpuheal_hygiene_findings{kind="allocatable-drop",pool="a100"} 0.0' in text
    series = [line for line in text.splitlines() if line.startswith("gpuheal_hygiene_findings{")]
    assert len(series) == 2 * len(KINDS)
    assert "gpuheal_hygiene_gpu_nodes 2.0" in text
    assert "gpuheal_hygiene_last_run_timestamp_seconds 1.7963784e+09" in text


def test_gpuheals_own_work_or_a_driver_upgrade_explains_a_finding_and_times_it_from_after() -> None:
    """A node gpuheal drains or repairs (an open fault of another source) loses its
    GPUs for that fault; one gpu-operator upgrades restarts its device plugin. Neither
    is a second fault; the wait starts once nothing explains the finding."""
    fleet = Fleet(signalling(signalAfterSeconds=600))
    node, upgrading = unique_eks_node(), unique_eks_node()
    fleet.nodes = {
        node: gpu_node(node, allocatable=0),
        upgrading: gpu_node(
            upgrading,
            allocatable=0,
            labels={"nvidia.com/gpu-driver-upgrade-state": "pod-restart-required"},
        ),
    }
    xid = FaultRecord(
        "gpufault-xid", node, "xid-79-20261204095500", Phase.RECOVERING, source="node-annotation"
    )
    fleet.records = [xid]
    loop = fleet.loop()
    for minutes in (0, 20):
        fleet.now = NOW + dt.timedelta(minutes=minutes)
        loop.examine_once()
    assert fleet.submitted == []
    fleet.records = [replace(xid, phase=Phase.RESOLVED)]
    fleet.nodes[upgrading] = gpu_node(
        upgrading,
        allocatable=0,
        labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"},
    )
    loop.examine_once()  # at 20 min: the wait starts now
    fleet.now = NOW + dt.timedelta(minutes=29)
    loop.examine_once()
    assert fleet.submitted == []
    fleet.now = NOW + dt.timedelta(minutes=30)
    loop.examine_once()
    assert sorted((s.node, s.detected_at) for s in fleet.submitted) == sorted(
        [(node, "2026-12-04T10:20:00Z"), (upgrading, "2026-12-04T10:20:00Z")]
    )
