"""Informer cache rules that need no server: write-through against watch order."""

from __future__ import annotations

import json
import logging
from typing import Any, cast

import pytest

from gpuheal.kube.api import KubeApi, gpufault_path, node_path
from gpuheal.kube.informer import Informer
from gpuheal.kube.projections import (
    FaultJson,
    NodeJson,
    decode_fault,
    decode_node,
    fault_record,
    node_view,
)
from gpuheal.model import FaultRecord, NodeView, fault_record_name
from tests import corpus
from tests.helpers import gpufault_spec


def informer() -> Informer[NodeJson, NodeView]:
    # The API is never called here: only the store's rules are exercised.
    api = cast(KubeApi, None)
    return Informer(api, node_path(), NodeJson, node_view, lambda n: n.name, name="unit")


def test_a_late_write_through_cannot_resurrect_an_object_the_watch_deleted() -> None:
    # Found by bench/quarantine.py under a storm: the eviction's answer arrived after
    # the watch had delivered the pod's deletion, and the write-through of "pod
    # leaving" (at its pre-eviction version) brought it back, forever draining.
    cache = informer()
    seen: list[Any] = []
    cache.handlers.append(lambda old, new: seen.append((old, new)))
    cache.upsert(NodeView("n1", "10"), "10")
    cache._apply("n1", None, "12")  # the watch's DELETED
    cache.upsert(NodeView("n1", "10", annotations={"late": "write"}), "10")
    assert cache.get("n1") is None
    assert len(seen) == 2
    # Created again later (a newer version): accepted.
    cache.upsert(NodeView("n1", "13"), "13")
    assert cache.get("n1") == NodeView("n1", "13")


def test_tombstones_are_bounded() -> None:
    cache = informer()
    for i in range(10_050):
        cache._apply(f"n{i}", None, str(i))
    cache.upsert(NodeView("n0", "0"), "0")  # its tombstone was dropped: accepted
    assert cache.get("n0") is not None
    cache.upsert(NodeView("n10049", "1"), "1")
    assert cache.get("n10049") is None


# -- decoding one object at a time ---------------------------------------------------


def gpufault(node: str, fault_id: str, rv: str, **status: Any) -> dict[str, Any]:
    """A GPUFault as the API server lists it."""
    return {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "GPUFault",
        "metadata": {
            "name": fault_record_name(node, fault_id),
            "resourceVersion": rv,
            "creationTimestamp": "2026-12-01T02:30:14Z",
            "labels": {"gpuheal.io/node": node},
        },
        "spec": gpufault_spec(node, fault_id),
        "status": {"phase": "Quarantined", **status},
    }


def page(items: list[dict[str, Any]], rv: str = "900") -> bytes:
    body = {"kind": "GPUFaultList", "metadata": {"resourceVersion": rv}, "items": items}
    return json.dumps(body).encode()


def records() -> tuple[Informer[FaultJson, FaultRecord], list[str]]:
    counted: list[str] = []
    cache = Informer(
        cast(KubeApi, None),  # never called: pages and events are fed in as bytes
        gpufault_path(),
        FaultJson,
        fault_record,
        lambda r: r.name,
        name="gpufaults",
        on_decode_error=lambda: counted.append("gpufaults"),
    )
    return cache, counted


EKS, GKE, AKS = corpus.EKS_NODE, corpus.GKE_NODE, corpus.AKS_NODE
# A shape the projection cannot take: what a record stored under an older schema
# (the API server does not re-validate stored objects) can look like.
BAD = gpufault(GKE, f"{GKE}-20261201T023012Z-3f9c2a", "512", evictedPods="ml-training/x")


def test_a_list_page_skips_the_object_it_cannot_decode_and_keeps_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache, counted = records()
    good = [
        gpufault(EKS, f"{EKS}-20261201T023012Z-a1b2c3", "510"),
        # The CRD declares these nullable: a person's kubectl (or an older
        # controller) may store nulls, and they mean "not set".
        gpufault(AKS, f"{AKS}-20261201T023013Z-d4e5f6", "511", recoveringSince=None, expiry=None),
    ]
    seen: dict[str, tuple[Any, str]] = {}
    skipped: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="gpuheal.kube.informer"):
        meta = cache._take_page(page([good[0], BAD, good[1]]), seen, skipped)
    assert meta.resourceVersion == "900"
    names = {g["metadata"]["name"] for g in good}
    assert set(seen) == names
    assert seen[good[1]["metadata"]["name"]][0].recovering_since == ""
    assert skipped == {BAD["metadata"]["name"]}
    assert counted == ["gpufaults"]
    (line,) = [r for r in caplog.records if r.getMessage() == "object skipped: cannot decode it"]
    assert vars(line)["object"] == BAD["metadata"]["name"]
    assert vars(line)["informer"] == "gpufaults"
    assert vars(line)["resource_version"] == "512"
    assert "evictedPods" in vars(line)["error"]

    # The next relist meets the same version again: not reported again.
    cache._take_page(page([BAD]), {}, set())
    assert counted == ["gpufaults"]
    # A new version that is still bad is news.
    cache._take_page(
        page([{**BAD, "metadata": {**BAD["metadata"], "resourceVersion": "530"}}]), {}, set()
    )
    assert counted == ["gpufaults", "gpufaults"]


def test_a_watch_event_it_cannot_decode_is_skipped_and_the_cache_keeps_the_last_good_version() -> (
    None
):
    cache, counted = records()
    name = BAD["metadata"]["name"]
    fine = {
        **BAD,
        "status": {"phase": "Quarantined"},
        "metadata": {**BAD["metadata"], "resourceVersion": "500"},
    }

    def event(kind: str, obj: dict[str, Any]) -> bytes:
        return json.dumps({"type": kind, "object": obj}).encode()

    assert cache._take_event(event("ADDED", fine))
    assert cache._take_event(event("MODIFIED", BAD))
    assert counted == ["gpufaults"]
    kept = cache.get(name)
    assert kept is not None and kept.resource_version == "500"
    assert cache.resource_version == "512"  # the watch resumes after the bad version

    other = gpufault(EKS, f"{EKS}-20261201T023012Z-a1b2c3", "513", recoveringSince=None)
    assert cache._take_event(event("ADDED", other))
    assert cache.get(other["metadata"]["name"]) is not None

    # Its deletion still applies, undecodable as it is, and is not reported again.
    gone = {**BAD, "metadata": {**BAD["metadata"], "resourceVersion": "514"}}
    assert cache._take_event(event("DELETED", gone))
    assert cache.get(name) is None
    assert counted == ["gpufaults"]
    assert cache.resource_version == "514"


def test_nulls_the_api_may_send_decode_as_not_set() -> None:
    record = decode_fault(
        json.dumps(gpufault(EKS, "xid-79", "7", recoveringSince=None, expiry=None)).encode()
    )
    assert (record.recovering_since, record.expiry) == ("", "")
    # A metav1.Time is serialized as null when zero: a condition some detector
    # wrote without lastTransitionTime, an object without creationTimestamp.
    node = {
        "metadata": {"name": EKS, "resourceVersion": "8", "creationTimestamp": None},
        "status": {
            "conditions": [
                {"type": "GPUHealthy", "status": "False", "reason": "XidCritical79",
                 "lastTransitionTime": None, "lastHeartbeatTime": None},
            ]
        },
    }  # fmt: skip
    view = decode_node(json.dumps(node).encode())
    assert view.conditions[0].last_transition_time == ""
    assert view.conditions[0].reason == "XidCritical79"
