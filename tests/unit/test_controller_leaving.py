"""A pod we evicted stays leaving for the policy until the watch shows it leaving,
even when a watch event older than the eviction arrives after it."""

from __future__ import annotations

from dataclasses import replace

from gpuheal.controller.leaving import LeavingPods
from gpuheal.model import PodView
from tests.corpus import EKS_NODE

POD = PodView("ml-training", "llama-70b-worker-3", "7f3c1d2e-uid", EKS_NODE, "Running", gpu=True)


def test_a_stale_watch_event_after_our_eviction_does_not_bring_the_pod_back() -> None:
    leaving = LeavingPods()
    leaving.add(POD.key, POD.uid)
    stale = replace(POD, resource_version="102")  # written before the eviction, seen after
    leaving.on_pod(POD, stale)
    assert leaving.seen(stale).deleting


def test_the_memory_ends_when_the_cache_shows_the_pod_leaving_gone_or_replaced() -> None:
    for new in (replace(POD, deleting=True), None, replace(POD, uid="a-new-pod-same-name")):
        leaving = LeavingPods()
        leaving.add(POD.key, POD.uid)
        leaving.on_pod(POD, new)
        assert len(leaving) == 0
    leaving = LeavingPods()
    leaving.add(POD.key, POD.uid)
    successor = replace(POD, uid="a-new-pod-same-name")
    assert not leaving.seen(successor).deleting  # a StatefulSet's next pod is not leaving
