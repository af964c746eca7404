"""A synthetic fleet as the controller's caches hold it, for the console's unit
tests and its benchmark (bench/console.py): EKS node names in pools, eight GPUs
each, a GPU pod per node, a share of them faulty, quarantined, held, awaiting
approval or in maintenance."""

from __future__ import annotations

from collections import defaultdict

from gpuheal.api.console.views import Cluster
from gpuheal.config import Config, parse_config
from gpuheal.model import (
    FAULT_ID,
    FAULT_REASON,
    MAINTENANCE_REASON,
    MAINTENANCE_SINCE,
    MAINTENANCE_TAINT_KEY,
    STATE_LABEL,
    STATE_MAINTENANCE,
    STATUS,
    TAINT_KEY,
    XID_ERRORS,
    ActionEntry,
    Condition,
    FaultRecord,
    NodeView,
    Phase,
    PodView,
    Taint,
    fault_record_name,
)
from tests.corpus import GPU_UUIDS, eks_node_names

POOLS = ("p5-48xlarge", "p4d-24xlarge", "g6e-12xlarge")
POOL_LABEL = "node.kubernetes.io/instance-type"
DETECTED = "2026-12-01T03:12:45.123456Z"


def config() -> Config:
    return parse_config({"pools": {"label": POOL_LABEL}})


def record(node: str, fault_id: str, phase: Phase, reason: str = "XidCritical79") -> FaultRecord:
    return FaultRecord(
        name=fault_record_name(node, fault_id),
        node=node,
        fault_id=fault_id,
        phase=phase,
        reason=reason,
        source="annotations",
        detected_at=DETECTED,
        created_at=DETECTED,
        actions=(
            ActionEntry(DETECTED, "detected", "ok", f"{reason} on {GPU_UUIDS[0]}"),
            ActionEntry("2026-12-01T03:12:45.401Z", "taint", "ok", "gpuheal.io/gpu-fault"),
        ),
    )


def cluster(nodes: int, *, version: str = "test.1") -> Cluster:
    """`nodes` GPU nodes; one in 50 quarantined, one in 100 faulty and awaiting
    approval, one in 200 held, one in 250 in maintenance."""
    names = [n for start in range(0, nodes, 250) for n in eks_node_names(min(250, nodes - start))]
    views: dict[str, NodeView] = {}
    pods: dict[str, PodView] = {}
    records: dict[str, FaultRecord] = {}
    pods_by_node: dict[str, set[str]] = defaultdict(set)
    records_by_node: dict[str, set[str]] = defaultdict(set)
    quarantined = 0
    for i, name in enumerate(names):
        annotations = {STATUS: "healthy", XID_ERRORS: "{}"}
        labels = {POOL_LABEL: POOLS[i % len(POOLS)]}
        taints: tuple[Taint, ...] = ()
        phase: Phase | None = None
        if i % 50 == 0:
            taints, phase = (Taint(TAINT_KEY, "XidCritical79", "NoSchedule"),), Phase.DRAINED
            quarantined += 1
        elif i % 100 == 1:
            phase = Phase.AWAITING_APPROVAL
        elif i % 200 == 3:
            phase = Phase.HELD
        elif i % 250 == 7:
            # As `gpuheal maintenance start` leaves it: the state label is the mark.
            labels[STATE_LABEL] = STATE_MAINTENANCE
            taints = (Taint(MAINTENANCE_TAINT_KEY, "driver-upgrade", "NoSchedule"),)
            annotations |= {MAINTENANCE_REASON: "driver 550", MAINTENANCE_SINCE: DETECTED}
        if phase is not None:
            fault_id = f"xid-79-{i:05d}"
            annotations |= {STATUS: "faulty", FAULT_ID: fault_id, FAULT_REASON: "XidCritical79"}
            r = record(name, fault_id, phase)
            records[r.name] = r
            records_by_node[name].add(r.name)
        views[name] = NodeView(
            name=name,
            resource_version=str(i),
            labels=labels,
            annotations=annotations,
            taints=taints,
            conditions=(Condition("Ready", "True"),),
            gpus=8,
            capacity=(("nvidia.com/gpu", 8),),
        )
        pod = PodView(
            "ml-train", f"trainer-{i:05d}", f"uid-{i}", name, "Running", gpu=True, gpu_count=4
        )
        pods[pod.key] = pod
        pods_by_node[name].add(pod.key)
    return Cluster(
        nodes=views,
        pods=pods,
        records=records,
        pods_by_node=pods_by_node,
        records_by_node=records_by_node,
        gpu_nodes=set(names),
        quarantined=quarantined,
        config=config(),
        leading=True,
        version=version,
    )
