"""A person writes each gpuheal annotation malformed on a managed node, against the
real API server and a real controller: each value is told once (a warning log line
with the node, a Warning Event, the metric), and nothing else happens to the node."""

from __future__ import annotations

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Event, Node

from gpuheal.model import CHECKPOINT_REQUESTED, DISRUPTION_GUARD, TAINT_KEY
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.workloads import apply, gpu_pod
from gpuheal.vocabulary import Reason
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import StartController, controller_config, events_for
from tests.integration.test_failures import log_lines, metric
from tests.unit.test_unreadable import BAD

pytestmark = pytest.mark.integration


REASON = Reason.ANNOTATION_UNREADABLE


def look_again(kube: Client, controller: ControllerProcess, node: str) -> None:
    """Have the controller look at the node again (a change to one of ours: its caches
    keep only gpuheal.io/ annotations), and wait until it has."""
    looks = metric(controller, "gpuheal_reconcile_duration_seconds_count")
    kube.patch(Node, node, {"metadata": {"annotations": {DISRUPTION_GUARD: ""}}})
    wait_for(
        "the node looked at again",
        lambda: metric(controller, "gpuheal_reconcile_duration_seconds_count") > looks,
    )


def test_each_unreadable_annotation_is_told_once_and_changes_nothing_else(
    kube: Client, pool: dict[str, str], fake_gpu_nodes: FakeNodes, start_controller: StartController
) -> None:
    (eks_node,) = fake_gpu_nodes(1, labels=pool)
    controller = start_controller(controller_config(pool))
    controller.wait_leading()
    kube.patch(Node, eks_node, {"metadata": {"annotations": BAD}})

    def counted(annotation: str) -> float:
        return metric(
            controller, f'gpuheal_annotations_unreadable_total{{annotation="{annotation}"}}'
        )

    wait_for("every value counted", lambda: all(counted(a) == 1 for a in BAD))
    told = events_for(kube, eks_node, REASON, at_least=len(BAD))
    assert sorted(str(e.message).split("=", 1)[0] for e in told) == sorted(BAD)
    # Looked at again: nothing is told twice.
    look_again(kube, controller, eks_node)
    lines = [e for e in log_lines(controller) if e["msg"] == "annotation unreadable"]
    assert sorted(e["annotation"] for e in lines) == sorted(BAD)
    assert all(e["node"] == eks_node and e["level"] == "warning" and e["why"] for e in lines)
    assert all(counted(a) == 1 for a in BAD)
    assert len(events_for(kube, eks_node, REASON)) == len(BAD)
    node = kube.get(Node, eks_node)
    assert node.spec is not None and not node.spec.unschedulable
    assert not any(t.key == TAINT_KEY for t in node.spec.taints or ())


def test_a_pods_checkpoint_request_that_is_not_a_time_is_told_once_on_the_pod(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    """A checkpoint request a person or a tool wrote that is not a time: the drain
    would evict without waiting, so the pod's owner is told (before any fault): a
    Warning Event on the pod, the metric, a log line naming the pod, once."""
    (node,) = fake_gpu_nodes(1, labels=pool)
    manifest = gpu_pod("train-0", namespace, node_name=node)
    manifest["metadata"]["annotations"] = {CHECKPOINT_REQUESTED: "in ten minutes"}
    apply(kube, manifest)
    controller = start_controller(controller_config(pool))
    controller.wait_leading()
    series = f'gpuheal_annotations_unreadable_total{{annotation="{CHECKPOINT_REQUESTED}"}}'
    wait_for("the pod's request counted", lambda: metric(controller, series) == 1)

    def on_the_pod(at_least: int = 0) -> list[Event]:
        return events_for(kube, "train-0", REASON, at_least=at_least, namespace=namespace)

    (told,) = on_the_pod(at_least=1)
    assert told.type == "Warning" and "evicted without waiting" in str(told.message)
    look_again(kube, controller, node)
    lines = [e for e in log_lines(controller) if e["msg"] == "annotation unreadable"]
    assert [(e["pod"], e["node"]) for e in lines] == [(f"{namespace}/train-0", node)]
    assert metric(controller, series) == 1 and len(on_the_pod()) == 1
