"""The controller's DRA index: a node's GPU devices and a pod's held GPUs joined into
the views the rest of the controller reads, whichever of the node, pod, slice and
claim events arrives first (their watches keep no order between them). Objects as
NVIDIA's DRA driver and the scheduler write them (sim/dra.py), decoded by the
controller's own projections."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import itertools
from typing import Any, cast

import msgspec
import pytest

from gpuheal.config import Config
from gpuheal.controller.dra import DraIndex
from gpuheal.kube.api import KubeApi
from gpuheal.kube.informer import Informer
from gpuheal.kube.projections import (
    ClaimJson,
    NodeJson,
    PodJson,
    SliceJson,
    claim_view_factory,
    node_view,
    pod_view_factory,
    slice_view_factory,
)
from gpuheal.model import ClaimView, DeviceKey, FenceView, NodeView, PodView, SliceView
from gpuheal.policy.gate import GPU_COUNT, CheckResult, evaluate, facts_from_views
from gpuheal.policy.hygiene import examine
from gpuheal.policy.nodes import gpus, usable_gpus
from gpuheal.sim.agent import gpu_spec
from gpuheal.sim.dra import DRIVER, claim_pod, dra_node, gpu_claim, resource_slice, with_taint
from gpuheal.sim.workloads import gpu_pod

pytestmark = pytest.mark.unit

NODE = "ip-10-0-12-34.us-west-2.compute.internal"
NS = "training"
DRIVERS = frozenset({DRIVER})
CONFIG = Config()
# The caches are fed here by hand: none of them lists or watches.
NO_API = cast(KubeApi, None)


def stored(manifest: dict[str, Any], rv: int = 1) -> dict[str, Any]:
    """A manifest as the API server returns it: a name for generateName, a version."""
    item = copy.deepcopy(manifest)
    meta = item["metadata"]
    meta["name"] = meta.pop("generateName", "") + meta.get("name", "") or "x7k2p"
    meta["resourceVersion"] = str(rv)
    meta.setdefault("uid", f"uid-{meta['name']}")
    return item


def allocated(claim: dict[str, Any], *devices: str) -> dict[str, Any]:
    """The claim as the scheduler leaves it: its devices allocated, on NODE's pool."""
    done = copy.deepcopy(claim)
    done["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpus", "driver": DRIVER, "pool": NODE, "device": d}
                    for d in devices
                ]
            }
        }
    }
    return done


def scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    running = copy.deepcopy(pod)
    running["spec"]["nodeName"] = NODE
    running["status"] = {"phase": "Running"}
    return running


class Controller:
    """The controller's four caches and its DRA index, wired as controller/app.py wires
    them, fed events by hand (the informers' upsert: what a watch event applies)."""

    def __init__(self) -> None:
        self.dra = DraIndex()
        pod_view = pod_view_factory(CONFIG.is_gpu_resource)
        self.nodes: Informer[NodeJson, NodeView] = Informer(
            NO_API, "", NodeJson, node_view, lambda n: n.name, name="nodes",
            join=self.dra.with_node,
        )  # fmt: skip
        self.pods: Informer[PodJson, PodView] = Informer(
            NO_API, "", PodJson, pod_view, lambda p: p.key, name="pods", join=self.dra.with_pod
        )  # fmt: skip
        self.slices: Informer[SliceJson, SliceView] = Informer(
            NO_API, "", SliceJson, slice_view_factory(DRIVERS), lambda s: s.name, name="slices"
        )  # fmt: skip
        self.claims: Informer[ClaimJson, ClaimView] = Informer(
            NO_API, "", ClaimJson, claim_view_factory(DRIVERS), lambda c: c.key, name="claims"
        )  # fmt: skip
        self.dra.watch(
            self.slices,
            self.claims,
            self.pods,
            lambda node: [k for k, p in self.pods.store.items() if p.node == node],
            refresh=(self.nodes.refresh, self.pods.refresh),
        )

    def take(self, informer: Informer[Any, Any], item: dict[str, Any]) -> None:
        decoded = informer._project(msgspec.json.encode(item))
        assert not isinstance(decoded, str), decoded
        _key, view, rv = decoded
        informer.upsert(view, rv)

    def node(self) -> NodeView:
        view = self.nodes.get(NODE)
        assert view is not None
        return view

    def pod(self, name: str) -> PodView:
        view = self.pods.get(f"{NS}/{name}")
        assert view is not None
        return view


def events() -> list[tuple[str, dict[str, Any]]]:
    claim = gpu_claim("train-gpus", NS)
    return [
        ("nodes", stored(dra_node(NODE))),
        ("slices", stored(resource_slice(NODE, gpu_spec(NODE)))),
        ("claims", stored(allocated(claim, "gpu-3"), rv=2)),
        ("pods", stored(scheduled(claim_pod("train", NS, "train-gpus")), rv=3)),
    ]


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_the_join_is_the_same_whatever_order_the_events_come_in(order: tuple[int, ...]) -> None:
    controller = Controller()
    listed = events()
    for i in order:
        name, item = listed[i]
        controller.take(getattr(controller, name), item)
    node, pod = controller.node(), controller.pod("train")
    assert [d.key.device for d in node.devices] == [f"gpu-{i}" for i in range(8)]
    assert gpus(node, CONFIG) == 8 and usable_gpus(node, CONFIG) == 8
    assert pod.gpu and pod.gpu_count == 1
    (held,) = pod.held
    assert held.key == DeviceKey(DRIVER, NODE, "gpu-3")
    assert held.uuid == gpu_spec(NODE)["devices"][3]["uuid"]


def test_the_node_s_handlers_hear_of_its_devices_when_the_slice_comes() -> None:
    controller = Controller()
    heard: list[int] = []
    controller.nodes.handlers.append(lambda _old, new: heard.append(len(new.devices)))
    controller.take(controller.nodes, stored(dra_node(NODE)))
    controller.take(controller.slices, stored(resource_slice(NODE, gpu_spec(NODE))))
    assert heard == [0, 8]
    # Again, unchanged: nothing to tell.
    controller.take(controller.slices, stored(resource_slice(NODE, gpu_spec(NODE)), rv=5))
    assert heard == [0, 8]


def test_a_claim_not_yet_allocated_makes_no_gpu_pod_and_its_release_unmakes_one() -> None:
    controller = Controller()
    claim = gpu_claim("train-gpus", NS)
    for name, item in events()[:2]:
        controller.take(getattr(controller, name), item)
    controller.take(controller.claims, stored(claim, rv=2))
    controller.take(controller.pods, stored(scheduled(claim_pod("train", NS, "train-gpus")), 3))
    assert not controller.pod("train").gpu and controller.pod("train").gpu_count == 0
    controller.take(controller.claims, stored(allocated(claim, "gpu-5"), rv=4))
    assert controller.pod("train").gpu_count == 1
    assert controller.pod("train").held[0].key.device == "gpu-5"
    controller.take(controller.claims, stored(claim, rv=6))  # deallocated
    assert not controller.pod("train").gpu and controller.pod("train").held == ()


def test_a_pod_asking_both_ways_counts_both_and_keeps_its_own_count_through_rejoins() -> None:
    controller = Controller()
    for name, item in events()[:3]:
        controller.take(getattr(controller, name), item)
    both = gpu_pod("mixed", NS, gpus=2)
    both["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "train-gpus"}]
    controller.take(controller.pods, stored(scheduled(both), rv=3))
    assert controller.pod("mixed").gpu_count == 3
    # The slice republished (a new generation): the pod is joined again, not added to.
    newer = stored(resource_slice(NODE, gpu_spec(NODE), generation=2), rv=7)
    controller.take(controller.slices, newer)
    assert controller.pod("mixed").gpu_count == 3
    controller.take(controller.claims, stored(gpu_claim("train-gpus", NS), rv=8))
    assert controller.pod("mixed").gpu_count == 2 and controller.pod("mixed").gpu


def test_a_driver_taint_makes_the_card_unusable_and_the_gate_and_hygiene_say_which() -> None:
    controller = Controller()
    controller.take(controller.nodes, stored(dra_node(NODE)))
    tainted = with_taint(resource_slice(NODE, gpu_spec(NODE)), "gpu-3", f"{DRIVER}/xid", "79")
    controller.take(controller.slices, stored(tainted))
    node = controller.node()
    assert gpus(node, CONFIG) == 8 and usable_gpus(node, CONFIG) == 7
    labelled = dataclasses.replace(node, labels={**node.labels, "nvidia.com/gpu.count": "8"})
    check = next(
        c
        for c in evaluate(facts_from_views(labelled, (), {}), CONFIG, _now(), None).checks
        if c.name == GPU_COUNT
    )
    assert check.result == CheckResult.FAIL
    assert check.reason == (
        f"7 of 8 DRA GPU devices usable, expected 8; tainted: gpu-3 ({DRIVER}/xid)"
    )
    seen = examine([labelled], {NODE: []}, CONFIG, _now())
    (finding,) = [f for f in seen.findings if f.node == NODE]
    assert (
        f"offers 7 of its 8 GPU(s): taints ({DRIVER}/xid) keep new claims off 1;" in finding.detail
    )


def test_a_healthy_dra_only_node_passes_the_gate_s_gpu_count() -> None:
    controller = Controller()
    for name, item in events()[:2]:
        controller.take(getattr(controller, name), item)
    node = controller.node()
    labelled = dataclasses.replace(node, labels={**node.labels, "nvidia.com/gpu.count": "8"})
    check = next(
        c
        for c in evaluate(facts_from_views(labelled, (), {}), CONFIG, _now(), None).checks
        if c.name == GPU_COUNT
    )
    assert (check.result, check.reason) == (
        CheckResult.PASS,
        "8 DRA GPU devices usable, as expected",
    )


def test_slices_of_other_drivers_count_nothing() -> None:
    controller = Controller()
    controller.take(controller.nodes, stored(dra_node(NODE)))
    other = resource_slice(NODE, gpu_spec(NODE))
    other["spec"]["driver"] = "net.example.com"
    controller.take(controller.slices, stored(other))
    assert controller.node().devices == ()
    assert controller.slices.get(stored(other)["metadata"]["name"]) is not None


def _now() -> dt.datetime:
    return dt.datetime(2026, 12, 7, 8, 0, tzinfo=dt.UTC)


def test_our_own_writes_written_through_keep_the_join() -> None:
    """The effects write a node's or pod's API answer back into the cache (decoded
    without DRA): the stored view is joined all the same, so the device plan that
    follows a mark on the node still sees the node's devices."""
    controller = Controller()
    for name, item in events():
        controller.take(getattr(controller, name), item)
    answer = msgspec.json.decode(msgspec.json.encode(stored(dra_node(NODE), rv=9)), type=NodeJson)
    controller.nodes.upsert(node_view(answer), "9")
    assert len(controller.node().devices) == 8
    pod = stored(scheduled(claim_pod("train", NS, "train-gpus")), rv=10)
    plain = pod_view_factory(CONFIG.is_gpu_resource)(
        msgspec.json.decode(msgspec.json.encode(pod), type=PodJson)
    )
    assert plain.held == ()
    controller.pods.upsert(plain, "10")
    assert controller.pod("train").gpu_count == 1


def test_gpuheal_s_own_fence_makes_its_card_unusable_until_it_goes() -> None:
    """The scheduler reads DeviceTaintRules beside the slices; so does the count of
    usable GPUs (the console's "8 (7 usable)", the gate)."""
    controller = Controller()
    fences: Informer[Any, FenceView] = Informer(
        NO_API, "", msgspec.Raw, lambda r: r, lambda f: f.name, name="fences"
    )
    fences.handlers.append(controller.dra.on_fence)
    for name, item in events()[:2]:
        controller.take(getattr(controller, name), item)
    rule = FenceView("gpuheal-x", NODE, "x", DeviceKey(DRIVER, NODE, "gpu-5"), "NoSchedule")
    fences.upsert(rule, "3")
    node = controller.node()
    assert (gpus(node, CONFIG), usable_gpus(node, CONFIG)) == (8, 7)
    assert node.devices[5].fencing == ("gpuheal.io/gpu-fault",)
    fences._apply(rule.name, None, "4")  # the watch's deletion
    assert usable_gpus(controller.node(), CONFIG) == 8
