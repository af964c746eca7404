"""Maintenance's writes and the drain's verdicts, as functions of API objects."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from gpuheal.config import Config
from gpuheal.kube.details import Pod, PodDisruptionBudget
from gpuheal.kube.projections import NodeJson
from gpuheal.model import (
    COUNTERS_SINCE,
    ECC_ERRORS,
    MAINTENANCE_BASELINE,
    MAINTENANCE_CORDONED,
    MAINTENANCE_REASON,
    MAINTENANCE_ROLLOUT,
    MAINTENANCE_SINCE,
    STATE_LABEL,
    XID_ERRORS,
)
from gpuheal.ops.drain import (
    POLL_S,
    finalizer_blocker,
    held_back,
    next_look_s,
    overdue,
    pdb_blocker,
    skip_reason,
)
from gpuheal.ops.maintenance import (
    baseline,
    finish_patch,
    leftovers,
    start_patch,
)
from gpuheal.ops.scheduling import selector_matches
from gpuheal.values import label_text

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)
CONFIG = Config()


def node(
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
) -> NodeJson:
    return msgspec.convert(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "n1",
                "resourceVersion": "42",
                "labels": labels or {},
                "annotations": annotations or {},
            },
            "spec": {"taints": taints or [], "unschedulable": unschedulable},
        },
        NodeJson,
    )


def pod(**spec: Any) -> Pod:
    meta = spec.pop("metadata", {})
    return msgspec.convert(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml", "labels": {"app": "train"}, **meta},
            "spec": {"containers": [{"name": "c", "image": "i"}], **spec},
            "status": {"phase": "Running"},
        },
        Pod,
    )


def owned_by(kind: str) -> dict[str, Any]:
    owner = {"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u", "controller": True}
    return {"ownerReferences": [owner]}


OWNED = owned_by("ReplicaSet")


def test_the_reason_becomes_a_readable_taint_value() -> None:
    assert label_text("driver upgrade to 550.54") == "driver-upgrade-to-550.54"
    assert label_text("  ~~~  ") == ""
    assert label_text("x" * 100) == "x" * 63


@given(st.text(max_size=120))
def test_taint_values_are_always_label_values(reason: str) -> None:
    value = label_text(reason)
    assert len(value) <= 63
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in value)
    assert value == "" or (value[0].isalnum() and value[-1].isalnum())


def test_start_marks_cordons_and_records_the_baseline() -> None:
    counters = {XID_ERRORS: "3", ECC_ERRORS: "1", COUNTERS_SINCE: "2026-11-01T00:00:00Z"}
    patch, warnings = start_patch(node(annotations=counters), "bios update", CONFIG, NOW)
    meta, spec = patch["metadata"], patch["spec"]
    assert meta["resourceVersion"] == "42" and warnings == []
    assert meta["labels"] == {STATE_LABEL: "maintenance"}
    notes = meta["annotations"]
    assert notes[MAINTENANCE_REASON] == "bios update"
    assert notes[MAINTENANCE_SINCE] == "2026-11-29T12:00:00Z"
    assert notes[MAINTENANCE_CORDONED] == "true"
    assert json.loads(notes[MAINTENANCE_BASELINE]) == {
        "xid": 3,
        "ecc": 1,
        "since": "2026-11-01T00:00:00Z",
    }
    assert spec == {
        "taints": [
            {"key": "gpuheal.io/maintenance", "effect": "NoSchedule", "value": "bios-update"}
        ],
        "unschedulable": True,
    }


def test_start_keeps_other_taints_and_someone_elses_cordon() -> None:
    theirs = {"key": "example.com/x", "effect": "NoExecute", "value": "v"}
    patch, _ = start_patch(node(taints=[theirs], unschedulable=True), "r", CONFIG, NOW)
    assert patch["metadata"]["annotations"][MAINTENANCE_CORDONED] is None
    assert theirs in patch["spec"]["taints"] and len(patch["spec"]["taints"]) == 2


def test_start_again_keeps_the_original_start_baseline_and_reason() -> None:
    marked = node(
        labels={STATE_LABEL: "maintenance"},
        annotations={MAINTENANCE_SINCE: "2026-11-29T10:00:00Z", MAINTENANCE_REASON: "first"},
        unschedulable=True,
    )
    patch, _ = start_patch(marked, "second", CONFIG, NOW)
    assert patch["metadata"]["annotations"] == {}
    assert patch["spec"]["taints"][0]["value"] == "first"


def test_unreadable_counters_give_no_baseline_and_a_warning() -> None:
    assert baseline({}) == (None, "the agent reports no error counters")
    patch, warnings = start_patch(node(annotations={XID_ERRORS: "many"}), "r", CONFIG, NOW)
    assert patch["metadata"]["annotations"][MAINTENANCE_BASELINE] is None
    assert warnings and XID_ERRORS in warnings[0]


def test_finish_removes_only_what_start_added() -> None:
    theirs = {"key": "example.com/x", "effect": "NoSchedule"}
    marked = node(
        labels={STATE_LABEL: "maintenance", "keep": "me"},
        annotations={MAINTENANCE_SINCE: "t", MAINTENANCE_CORDONED: "true", "other": "x"},
        taints=[theirs, {"key": "gpuheal.io/maintenance", "effect": "NoSchedule"}],
        unschedulable=True,
    )
    assert leftovers(marked, CONFIG) == [
        f"label {STATE_LABEL}=maintenance",
        "taint gpuheal.io/maintenance",
        f"annotation {MAINTENANCE_SINCE}",
        f"annotation {MAINTENANCE_CORDONED}",
    ]
    patch, uncordon = finish_patch(marked, CONFIG)
    assert uncordon and patch["spec"] == {"taints": [theirs], "unschedulable": False}
    assert patch["metadata"]["labels"] == {STATE_LABEL: None}
    assert set(patch["metadata"]["annotations"]) == {
        MAINTENANCE_REASON,
        MAINTENANCE_SINCE,
        MAINTENANCE_BASELINE,
        MAINTENANCE_CORDONED,
        MAINTENANCE_ROLLOUT,
    }
    assert all(v is None for v in patch["metadata"]["annotations"].values())


def test_finish_never_touches_a_quarantined_label_nor_someone_elses_cordon() -> None:
    quarantined = node(labels={STATE_LABEL: "quarantined"}, unschedulable=True)
    patch, uncordon = finish_patch(quarantined, CONFIG)
    assert not uncordon and "unschedulable" not in patch["spec"]
    assert "labels" not in patch["metadata"]
    assert leftovers(quarantined, CONFIG) == []


def test_what_the_drain_leaves_alone() -> None:
    assert skip_reason(pod(metadata=owned_by("DaemonSet"))) == "DaemonSet pod"
    mirror = {"annotations": {"kubernetes.io/config.mirror": "x"}}
    assert skip_reason(pod(metadata=mirror)) == "static (mirror) pod"
    assert skip_reason(pod(metadata=OWNED)) == ""


def test_what_needs_a_flag() -> None:
    scratch = pod(metadata=OWNED, volumes=[{"name": "tmp", "emptyDir": {}}])
    assert held_back(scratch, delete_emptydir_data=False, force=False) == (
        "local storage: emptyDir volume tmp (pass --delete-emptydir-data)"
    )
    assert held_back(scratch, delete_emptydir_data=True, force=False) == ""
    bare = pod()
    assert held_back(bare, delete_emptydir_data=False, force=False) == (
        "not managed by a controller (pass --force)"
    )
    assert held_back(bare, delete_emptydir_data=False, force=True) == ""


def test_a_finalizer_holding_a_deleted_pod_is_named() -> None:
    meta = {"deletionTimestamp": "2026-11-29T12:00:00Z", "finalizers": ["example.com/cleanup"]}
    assert finalizer_blocker(pod(metadata=meta)) == (
        "being deleted, held by finalizer example.com/cleanup"
    )
    assert finalizer_blocker(pod()) == ""


def pdb(name: str, selector: dict[str, Any] | None, allowed: int = 0) -> PodDisruptionBudget:
    return msgspec.convert(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"selector": selector} if selector is not None else {},
            "status": {
                "disruptionsAllowed": allowed,
                "currentHealthy": 2,
                "desiredHealthy": 2,
                "expectedPods": 2,
            },
        },
        PodDisruptionBudget,
    )


def test_a_refused_eviction_names_the_budgets_that_select_the_pod() -> None:
    budgets = [
        pdb("train", {"matchLabels": {"app": "train"}}),
        pdb("serve", {"matchLabels": {"app": "serve"}}),
        pdb(
            "by-expr",
            {"matchExpressions": [{"key": "app", "operator": "In", "values": ["train"]}]},
        ),
    ]
    assert pdb_blocker(budgets, pod(), "429") == (
        "PodDisruptionBudget ml/train allows 0 disruptions: 2 healthy, 2 required; "
        "PodDisruptionBudget ml/by-expr allows 0 disruptions: 2 healthy, 2 required"
    )
    assert pdb_blocker([], pod(), "Too many requests") == "eviction refused: Too many requests"


def test_label_selectors() -> None:
    labels = {"app": "train", "tier": "gpu"}
    assert not selector_matches(None, labels)
    sel = pdb("x", {}).spec.selector
    assert sel is not None and selector_matches(sel, labels)  # empty: every pod
    cases = {
        ("In", ("train",)): True,
        ("NotIn", ("train",)): False,
        ("Exists", ()): True,
        ("DoesNotExist", ()): False,
    }
    for (operator, values), expected in cases.items():
        expr = {"key": "app", "operator": operator, "values": list(values)}
        budget = pdb("x", {"matchExpressions": [expr]})
        assert selector_matches(budget.spec.selector, labels) is expected, operator


def test_a_pod_terminating_long_past_its_grace_period_is_named() -> None:
    deleting = pod(metadata={"deletionTimestamp": "2026-11-29T12:00:00Z"})
    assert overdue(deleting, NOW + dt.timedelta(seconds=5)) == ""
    assert "grace period" in overdue(deleting, NOW + dt.timedelta(minutes=5))
    assert overdue(pod(), NOW) == ""


def test_a_drain_that_moves_looks_every_half_second() -> None:
    assert next_look_s(4.0, True, None, 5.0) == POLL_S


def test_a_held_drain_looks_less_often_up_to_the_retry_interval() -> None:
    waits, wait_s = [], POLL_S
    for _ in range(6):
        wait_s = next_look_s(wait_s, False, None, 5.0)
        waits.append(wait_s)
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    # Half an hour held by a budget: about 360 looks at the node, not 3,600.
    looks, held_s, wait_s = 0, 0.0, POLL_S
    while held_s < 1800:
        wait_s = next_look_s(wait_s, False, None, 5.0)
        held_s += wait_s
        looks += 1
    assert 355 <= looks <= 365


def test_a_held_drain_still_retries_a_refused_eviction_when_it_is_due() -> None:
    assert next_look_s(4.0, False, 1.5, 5.0) == 1.5
    assert next_look_s(POLL_S, True, 0.2, 5.0) == 0.2
    assert next_look_s(4.0, False, 0.0, 5.0) > 0  # never a busy loop


def test_a_retry_interval_under_the_poll_never_slows_the_drain_below_it() -> None:
    assert next_look_s(POLL_S, False, None, 0.2) == POLL_S
