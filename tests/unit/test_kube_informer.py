"""Informer cache rules that need no server: write-through against watch order."""

from __future__ import annotations

from typing import Any, cast

from gpuheal.kube.api import KubeApi, node_path
from gpuheal.kube.informer import Informer
from gpuheal.kube.projections import NodeJson, node_view
from gpuheal.model import NodeView


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
