"""Exactly once for the device fence under chaos: a storm of bad cards on DRA-only
nodes (NVIDIA's DRA driver tainting one card of each, Xid 48) while the controller is
SIGKILLed at random moments. Afterwards, per the API server's audit log: each bad
card one DeviceTaintRule made, one record, the pod holding it evicted once, the pod
on the node's good card never; no node tainted.

This plane runs no scheduler and no kube-controller-manager: each claim is allocated
here, as the scheduler would allocate it (its status written), the pod bound to its
node, and the node's registration taint lifted.
GPUHEAL_CHAOS_SEED (default: random, printed) replays a run.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from gpuheal.model import TAINT_KEY
from gpuheal.policy.drivertaints import XID_KEY
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.agent import gpu_spec
from gpuheal.sim.dra import (
    DRIVER,
    claim_pod,
    device_classes,
    dra_node,
    gpu_claim,
    resource_slice,
    with_taint,
)
from gpuheal.sim.nodes import delete_nodes, wait_nodes_ready
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, create_namespace, wait_pods_running
from tests.chaos.storm import Replicas
from tests.corpus import eks_node_names
from tests.helpers import unique, wait_for

NODES = 30
HELD = ("gpu-0", "gpu-1")  # the cards the node's two pods hold; gpu-0 goes bad


class DraStorm:
    """DRA-only nodes, each with its driver's slice and two pods on two cards."""

    def __init__(self, cp: ControlPlane, kube: Client) -> None:
        self.cp, self.kube = cp, kube
        self.pool = {"gpuheal.chaos/pool": unique("drapool")}
        self.namespace = unique("drachaos")
        create_namespace(kube, self.namespace)
        for manifest in device_classes():
            try:
                apply(kube, manifest)
            except ApiError as err:
                if err.status.code != 409:
                    raise
        self.nodes = eks_node_names(NODES)
        for node in self.nodes:
            apply(kube, dra_node(node, labels=self.pool))
        wait_nodes_ready(kube, self.nodes)
        # The not-ready taint a node registers with is the node lifecycle controller's to
        # lift, and this plane runs no kube-controller-manager: lifted here, or the
        # device path would rightly hold back on nodes that look unreachable.
        for node in self.nodes:
            kube.patch(Node, node, {"spec": {"taints": []}}, patch_type=PatchType.MERGE)
        for node in self.nodes:
            apply(kube, resource_slice(node, gpu_spec(node)))
            for card in HELD:
                self._claim_pod(node, card)
        wait_pods_running(kube, self.namespace, count=2 * NODES, timeout_s=120)

    def _claim_pod(self, node: str, card: str) -> None:
        """A pod on `card` of `node` through its own claim, allocated and bound here."""
        name = f"{card}-{node}"
        claim = gpu_claim(f"{name}-gpus", self.namespace)
        apply(self.kube, claim)
        result = {"request": "gpus", "driver": DRIVER, "pool": node, "device": card}
        self.kube.patch(
            ResourceClaim.Status, f"{name}-gpus",
            {"status": {"allocation": {"devices": {"results": [result]}}}},
            namespace=self.namespace, patch_type=PatchType.MERGE,
        )  # fmt: skip
        pod = claim_pod(name, self.namespace, f"{name}-gpus")
        pod["spec"]["nodeName"] = node
        apply(self.kube, pod)

    def taint_bad_cards(self) -> None:
        """The driver's health check on every node: Xid 48 on gpu-0."""
        for node in self.nodes:
            (item,) = [
                i.to_dict() for i in self.kube.list(ResourceSlice, fields={"spec.nodeName": node})
            ]
            devices = with_taint(item, HELD[0], XID_KEY, "48")["spec"]["devices"]
            self.kube.patch(
                ResourceSlice, item["metadata"]["name"], {"spec": {"devices": devices}},
                patch_type=PatchType.MERGE,
            )  # fmt: skip

    def pods_left(self, card: str) -> set[str]:
        names = (
            p.to_dict()["metadata"]["name"] for p in self.kube.list(Pod, namespace=self.namespace)
        )
        return {str(n) for n in names if str(n).startswith(f"{card}-")}

    def delete(self) -> None:
        for node in self.nodes:
            for item in self.kube.list(ResourceSlice, fields={"spec.nodeName": node}):
                assert item.metadata is not None and item.metadata.name is not None
                self.kube.delete(ResourceSlice, item.metadata.name)
        delete_nodes(self.kube, self.nodes)


@pytest.fixture
def dra_storm(chaos_plane: ControlPlane, chaos_kube: Client) -> Iterator[DraStorm]:
    made = DraStorm(chaos_plane, chaos_kube)
    yield made
    made.delete()


@pytest.mark.timeout(600)
def test_random_sigkills_during_a_storm_of_bad_cards_fence_each_card_exactly_once(
    chaos_plane: ControlPlane, chaos_kube: Client, dra_storm: DraStorm, tmp_path: Path
) -> None:
    seed = int(os.environ.get("GPUHEAL_CHAOS_SEED", str(random.randrange(1 << 30))))
    print(f"chaos seed {seed} (GPUHEAL_CHAOS_SEED={seed} replays it)")
    rng = random.Random(seed)
    replicas = Replicas(chaos_plane, tmp_path, dra_storm.pool)
    replicas.config["deviceHealth"] = {"evictionsPerMinute": 6000, "evictionBurst": 100}
    replicas.start()
    since = audit.offset(chaos_plane.audit_log)
    try:
        dra_storm.taint_bad_cards()
        kills = 0
        started = time.monotonic()
        for moment in sorted(rng.uniform(0.0, 4.0) for _ in range(rng.randint(2, 4))):
            time.sleep(max(0.0, started + moment - time.monotonic()))
            for replica in replicas.live():
                replica.kill()
                kills += 1
            replicas.start()
        wait_for(
            "every bad card's pod gone",
            lambda: not dra_storm.pods_left(HELD[0]),
            timeout_s=180,
        )
        # The records name their rules (the pass after a rule is seen).
        wait_for("every record names its rule", lambda: _named(chaos_kube, dra_storm), 60)
    finally:
        replicas.stop()
    print(f"{NODES} bad cards, {kills} SIGKILLs")
    assert kills >= 2

    found = list(audit.requests(chaos_plane.audit_log, user="gpuheal-controller", since=since))
    codes = audit.evictions(iter(found))
    twice = {pod: c for pod, c in codes.items() if c.count(201) > 1}
    assert not twice, f"evicted more than once (response codes): {twice}"
    evicted = {pod for pod, c in codes.items() if any(x in {0, 201, 504} for x in c)}
    bad = {(dra_storm.namespace, f"{HELD[0]}-{node}") for node in dra_storm.nodes}
    assert evicted == bad, (sorted(bad - evicted)[:5], sorted(evicted - bad)[:5])
    assert dra_storm.pods_left(HELD[1]) == {f"{HELD[1]}-{n}" for n in dra_storm.nodes}
    made = Counter(
        r.name for r in found if r.resource == "devicetaintrules" and r.verb == "create"
        and r.code == 201
    )  # fmt: skip
    assert sum(made.values()) == NODES and all(n == 1 for n in made.values()), made
    records = Counter(
        (r.spec or {}).get("node") for r in chaos_kube.list(GPUFault)
        if (r.spec or {}).get("node") in dra_storm.nodes
    )  # fmt: skip
    assert records == dict.fromkeys(dra_storm.nodes, 1), records
    nodes = [n.to_dict() for n in chaos_kube.list(Node, labels=dict(dra_storm.pool))]
    tainted = [
        n["metadata"]["name"]
        for n in nodes
        if any(t["key"] == TAINT_KEY for t in n.get("spec", {}).get("taints") or [])
    ]
    assert not tainted, tainted


def _named(kube: Client, storm: DraStorm) -> bool:
    records = [r for r in kube.list(GPUFault) if (r.spec or {}).get("node") in storm.nodes]
    statuses: list[Any] = [r.status or {} for r in records]
    return len(records) == NODES and all(
        any(a.get("action") == "fence" for a in status.get("actions") or []) for status in statuses
    )
