"""Concepts every layer reads, each defined once: which nodes are GPU nodes, which
are in maintenance, a node's readiness, severity order, how times are written.
The controller's view and the commands' views of one Node agree on each."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import msgspec
import pytest

from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.controller.fleet import Fleet
from gpuheal.kube.details import Node
from gpuheal.kube.projections import NodeJson, decode_node
from gpuheal.model import MAINTENANCE_TAINT_KEY, STATE_LABEL, STATE_MAINTENANCE, NodeView, Severity
from gpuheal.ops.fleet import gpu_node, node_ready
from gpuheal.policy.nodes import in_maintenance
from gpuheal.sim.nodes import gpu_node as gpu_node_manifest
from tests.corpus import EKS_NODE

NO_SELECTOR = Config(node_selector={})


def _node(**changes: Any) -> dict[str, Any]:
    manifest = gpu_node_manifest(EKS_NODE, gpus=changes.pop("gpus", 8))
    manifest["metadata"]["labels"].update(changes.pop("labels", {}))
    if "mig" in changes:  # MIG's mixed strategy: profiles, and no nvidia.com/gpu at all
        resources = {"cpu": "96", **changes.pop("mig")}
        manifest["status"].update(capacity=resources, allocatable=resources)
    if "ready" in changes:
        manifest["status"]["conditions"] = [{"type": "Ready", "status": changes.pop("ready")}]
    return manifest


def _views(manifest: dict[str, Any]) -> tuple[NodeView, NodeJson, Node]:
    raw = json.dumps(manifest).encode()
    return (
        decode_node(raw),
        msgspec.json.decode(raw, type=NodeJson),
        msgspec.json.decode(raw, type=Node),
    )


@pytest.mark.parametrize(
    ("config", "changes", "expected"),
    [
        (Config(), {}, True),  # the default selector: nvidia.com/gpu.present=true
        (Config(), {"labels": {"nvidia.com/gpu.present": "false"}}, False),
        (Config(), {"gpus": 0}, True),  # the labels decide, not the capacity
        (NO_SELECTOR, {"labels": {"nvidia.com/gpu.present": "false"}}, True),
        (NO_SELECTOR, {"gpus": 0}, False),  # no selector: GPU capacity decides
        # Every GPU resource counts, MIG profiles too: a MIG-only node is a GPU node.
        (
            NO_SELECTOR,
            {"mig": {"nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "1"}},
            True,
        ),
        (NO_SELECTOR, {"mig": {"example.com/fpga": "2"}}, False),
    ],
)
def test_the_controller_and_the_commands_agree_on_which_nodes_are_gpu_nodes(
    config: Config, changes: dict[str, Any], expected: bool
) -> None:
    view, slim, full = _views(_node(**changes))
    assert Fleet(lambda: config).selected(view) is expected
    assert gpu_node(slim, config) is expected
    assert gpu_node(full, config) is expected


@pytest.mark.parametrize(
    ("status", "expected"), [("True", True), ("False", False), ("Unknown", None)]
)
def test_readiness_is_one_reading_of_the_ready_condition(
    status: str, expected: bool | None
) -> None:
    view, slim, full = _views(_node(ready=status))
    assert view.ready is expected
    assert node_ready(slim) is expected
    assert node_ready(full) is expected


def test_no_ready_condition_is_not_known() -> None:
    view, slim, full = _views({"metadata": {"name": EKS_NODE}})
    assert view.ready is None and node_ready(slim) is None and node_ready(full) is None


def test_in_maintenance_is_the_state_label_alone() -> None:
    assert in_maintenance({STATE_LABEL: STATE_MAINTENANCE})
    assert not in_maintenance({STATE_LABEL: "quarantined"})
    assert not in_maintenance({MAINTENANCE_TAINT_KEY: ""})  # a taint key is no label
    assert not in_maintenance({})


def test_severities_rank_worst_first() -> None:
    assert sorted([Severity.P2, Severity.P0, Severity.P1], key=lambda s: s.rank) == [
        Severity.P0,
        Severity.P1,
        Severity.P2,
    ]


def test_times_are_written_in_utc_with_a_z_at_each_precision() -> None:
    moment = dt.datetime(2026, 11, 29, 13, 4, 5, 678901, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert iso(moment) == "2026-11-29T12:04:05.678Z"
    assert iso(moment, "seconds") == "2026-11-29T12:04:05Z"
    # Kubernetes MicroTime (Lease renewTime, Event eventTime), as client-go writes it.
    assert iso(moment, "microseconds") == "2026-11-29T12:04:05.678901Z"
    for precision in ("seconds", "milliseconds", "microseconds"):
        assert parse_time(iso(moment, precision)) is not None


def test_a_severity_gpuheal_wrote_reads_back_and_anything_else_is_p0() -> None:
    assert [Severity.written(s) for s in ("P0", "P1", "P2")] == [
        Severity.P0,
        Severity.P1,
        Severity.P2,
    ]
    assert Severity.written("") is Severity.P0
    assert Severity.written("p1") is Severity.P0  # case is sources/annotations' business
