"""Property, on the controller that ships, for DRA nodes and the device fence: whatever
the interleaving of two workers, the order of reports and the crashes, each bad card
gets one record and one DeviceTaintRule, each pod one eviction, and after a pass that
ran to its end every open device record has its rule and every rule its record.

The in-memory API server of tests/unit/test_controller_properties.py, taught the
resources this needs: ResourceSlices and ResourceClaims listed cluster-wide,
DeviceTaintRules served at resource.k8s.io/v1beta2 only (v1 answers 404, as on
Kubernetes 1.36), a create that exists is 409, a delete of what is gone is 404. The
controller's own DRA wiring runs: DraIndex joining slices, claims and its fences into
the node and pod views, FenceCaches, the write-through of a rule it made.

The faults: NVIDIA's DRA driver tainting a card (`gpu.nvidia.com/xid=48`, the
slice rewritten), the agent reporting Xid 48 on one card (by its UUID), and a node
fault (Xid 79) as in the node property.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import Counter
from typing import Any

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuheal.config import Config, DeviceHealthConfig
from gpuheal.controller.dra import DraIndex
from gpuheal.controller.effects.context import WriteThrough
from gpuheal.controller.executor import Executor
from gpuheal.controller.fences import FenceCaches
from gpuheal.controller.fleet import Fleet
from gpuheal.controller.reconciler import Reconciler
from gpuheal.controller.signals import ExternalSignals
from gpuheal.kube.api import RESOURCE_API, ApiError, device_taint_rule_path, node_path
from gpuheal.kube.informer import Informer
from gpuheal.kube.projections import (
    ClaimJson,
    FaultJson,
    NodeJson,
    PodJson,
    RuleJson,
    SliceJson,
    claim_view_factory,
    fault_record,
    fence_view,
    node_view,
    pod_view_factory,
    slice_view_factory,
)
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import FAULT_DEVICES, FAULT_ID, FAULT_REASON, STATUS, NodeView
from gpuheal.policy.breaker import quarantine_capacity
from gpuheal.policy.drivertaints import XID_KEY
from gpuheal.policy.fence import RULE_VERSIONS
from gpuheal.sim.agent import gpu_spec
from gpuheal.sim.dra import DRIVER, claim_pod, gpu_claim, resource_slice, with_taint
from tests.corpus import AKS_NODE, EKS_NODES, GKE_NODE
from tests.unit.test_controller_properties import (
    FAULTS,
    PODS,
    TURNS,
    Crash,
    MemoryApi,
    Process,
    Told,
    work,
)

NODES = (*EKS_NODES[:2], GKE_NODE, AKS_NODE)
CARDS = 3  # the cards each node's pods hold (of its eight), one pod each
SERVED = "v1beta2"
RULES = device_taint_rule_path("", SERVED)
SLICES = f"{RESOURCE_API}/resourceslices"
CLAIMS = f"{RESOURCE_API}/resourceclaims"
CONFIG = Config(
    breaker_max_nodes=2,
    breaker_max_percent=100,
    cooldown_seconds=0,
    recovery_window_seconds=3600,
    rate_limit_per_second=1000,
    rate_limit_burst=1000,
    # Nothing recovers mid-example; evictions are not held back by the device bucket.
    device_health=DeviceHealthConfig(evictions_per_minute=6000, eviction_burst=100),
)
CAP = quarantine_capacity(len(NODES), CONFIG)


class DraMemoryApi(MemoryApi):
    """The node property's API server, serving the DRA collections too (the rules at
    v1beta2, or not at all: Kubernetes 1.36 without the beta API)."""

    rules_served = True

    async def get(self, path: str, params: dict[str, str] | None = None) -> bytes:
        if path in (SLICES, CLAIMS) or (path == RULES and self.rules_served):
            await self._request()
            part = "/resourceclaims/" if path == CLAIMS else path + "/"
            items = [o for p, o in self.objects.items() if part in p]
            listed = {"metadata": {"resourceVersion": str(self.version)}, "items": items}
            return json.dumps(listed).encode()
        if path.startswith("/apis/resource.k8s.io/") and path.endswith("/devicetaintrules"):
            await self._request()
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return await super().get(path, params)


def _optional(informer: Informer[Any, Any]) -> Informer[Any, Any]:
    informer.optional = True
    return informer


async def _list(informer: Informer[Any, Any]) -> None:
    """The informer's first list; a resource not served leaves it missing (synced)."""
    try:
        await informer._list()
    except ApiError as err:
        if not (informer.optional and err.code == 404):
            raise
        informer._not_served()


async def relist(process: Process) -> None:
    for informer in process.informers:
        await _list(informer)


async def start(api: DraMemoryApi) -> Process:
    kube: Any = api
    drivers = frozenset(CONFIG.gpu_drivers)
    dra = DraIndex()
    nodes: Informer[NodeJson, NodeView] = Informer(
        kube, node_path(), NodeJson, node_view, lambda n: n.name, name="nodes", join=dra.with_node
    )
    pods = Informer(
        kube, PODS, PodJson, pod_view_factory(CONFIG.is_gpu_resource, gpu_drivers=drivers),
        lambda p: p.key, name="pods", join=dra.with_pod,
    )  # fmt: skip
    records = Informer(kube, FAULTS, FaultJson, fault_record, lambda r: r.name, name="gpufaults")
    slices = _optional(
        Informer(kube, SLICES, SliceJson, slice_view_factory(drivers), lambda s: s.name,
                 name="resourceslices")
    )  # fmt: skip
    claims = _optional(
        Informer(kube, CLAIMS, ClaimJson, claim_view_factory(drivers), lambda c: c.key,
                 name="resourceclaims")
    )  # fmt: skip
    fences = FenceCaches(
        lambda name, path: _optional(
            Informer(kube, path, RuleJson, fence_view, lambda f: f.name, name=name)
        )
    )
    fleet = Fleet(lambda: CONFIG)
    fleet.watch(nodes, pods, records)
    dra.watch(
        slices, claims, pods, lambda n: fleet.pods_by_node.get(n, ()),
        refresh=(nodes.refresh, pods.refresh), fences=fences.informers,
    )  # fmt: skip
    informers = (slices, claims, *fences.informers, nodes, pods, records)
    for informer in informers:
        await _list(informer)
    metrics = ControllerMetrics()
    told = Told(kube)
    executor = Executor(
        kube,
        caches=WriteThrough.over(nodes, records, pods, fences=fences),
        recorder=told,
        metrics=metrics,
        config=lambda: CONFIG,
    )
    reconciler = Reconciler(
        config=lambda: CONFIG,
        nodes=nodes,
        pods=pods,
        records=records,
        fleet=fleet,
        external=ExternalSignals(CONFIG.external_signal_ttl_seconds),
        executor=executor,
        metrics=metrics,
        fences=fences.of,
    )
    return Process(reconciler, told, nodes, informers)


def slice_path(node: str) -> str:
    return f"{SLICES}/00000-{DRIVER}-{node}"


def cluster(api: DraMemoryApi) -> None:
    """DRA-only nodes (no nvidia.com/gpu), eight cards each, CARDS of them held by a
    one-GPU pod through its own claim, allocated as the scheduler would."""
    for i, name in enumerate(NODES):
        api.put(
            node_path(name),
            {
                "metadata": {
                    "name": name,
                    "uid": f"node-{i}",
                    "labels": dict(CONFIG.node_selector),
                    "annotations": {},
                },
                "spec": {"taints": []},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            },
        )
        item = resource_slice(name, gpu_spec(name))
        item["metadata"] = {"name": slice_path(name).rsplit("/", 1)[1], "uid": f"slice-{i}"}
        api.put(slice_path(name), item)
        for card in range(CARDS):
            pod = f"train-{i}-{card}"
            claim = gpu_claim(f"{pod}-gpus", "ml")
            claim["metadata"]["uid"] = f"claim-{i}-{card}"
            result = {"request": "gpus", "driver": DRIVER, "pool": name, "device": f"gpu-{card}"}
            claim["status"] = {"allocation": {"devices": {"results": [result]}}}
            api.put(f"{RESOURCE_API}/namespaces/ml/resourceclaims/{pod}-gpus", claim)
            manifest = claim_pod(pod, "ml", f"{pod}-gpus")
            manifest["metadata"]["uid"] = f"pod-{i}-{card}"
            manifest["spec"]["nodeName"] = name
            manifest["status"] = {"phase": "Running"}
            api.put(f"/api/v1/namespaces/ml/pods/{pod}", manifest)


def driver_taint(api: DraMemoryApi, node: str, card: int) -> None:
    """The driver taints one card for Xid 48 (its slice rewritten); the watch event
    comes with a later relist ("deliver")."""
    path = slice_path(node)
    tainted = with_taint(api.objects[path], f"gpu-{card}", XID_KEY, "48")
    if tainted != api.objects[path]:
        api.put(path, tainted)


def agent_report(api: DraMemoryApi, process: Process, node: str, card: int) -> None:
    """The agent's report of Xid 48 on one card (its UUID), and its watch event."""
    stored = api.objects[node_path(node)]
    uuid = gpu_spec(node)["devices"][card]["uuid"]
    stored["metadata"]["annotations"] |= {
        STATUS: "faulty",
        FAULT_ID: f"kmsg-48-{node[:10]}-{card}",
        FAULT_REASON: "EccDoubleBit48",
        FAULT_DEVICES: uuid,
    }
    api.put(node_path(node), stored)
    view = node_view(msgspec.json.decode(json.dumps(stored), type=NodeJson))
    process.nodes.upsert(view, view.resource_version)


def node_report(api: DraMemoryApi, process: Process, node: str) -> None:
    """A node fault (Xid 79, no card named): the node path's."""
    stored = api.objects[node_path(node)]
    stored["metadata"]["annotations"] |= {
        STATUS: "faulty",
        FAULT_ID: f"xid-79-{node[:12]}",
        FAULT_REASON: "XidCritical79",
        FAULT_DEVICES: None,
    }
    stored["metadata"]["annotations"] = {
        k: v for k, v in stored["metadata"]["annotations"].items() if v is not None
    }
    api.put(node_path(node), stored)
    view = node_view(msgspec.json.decode(json.dumps(stored), type=NodeJson))
    process.nodes.upsert(view, view.resource_version)


def settled(api: DraMemoryApi, nodes: list[str]) -> None:
    """After passes that ran to their end: one open record per card, each open device
    record of a DRA card has its rule, and each rule an open record (none made twice,
    none left behind)."""
    records = {
        o["metadata"]["name"]: o
        for p, o in api.objects.items()
        if p.startswith(FAULTS + "/") and o["spec"].get("scope") == "device"
    }
    open_ = {
        name
        for name, o in records.items()
        if o.get("status", {}).get("phase", "Detected") not in ("Resolved", "Failed")
        and o["spec"]["node"] in nodes
    }
    cards = Counter(records[name]["spec"]["resourceID"] for name in open_)
    assert all(n == 1 for n in cards.values()), cards  # one open fault per card
    rules = {
        o["metadata"]["name"].removeprefix("gpuheal-")
        for p, o in api.objects.items()
        if p.startswith(RULES + "/")
        and o["metadata"]["annotations"].get("gpuheal.io/node") in nodes
    }
    assert rules == open_, (sorted(rules), sorted(open_))


step = st.one_of(
    st.tuples(st.just("driver"), st.sampled_from(NODES), st.integers(0, CARDS - 1)),
    st.tuples(st.just("agent"), st.sampled_from(NODES), st.integers(0, CARDS - 1)),
    st.tuples(st.just("report"), st.sampled_from(NODES), st.just(0)),
    st.tuples(
        st.just("work"),
        st.lists(st.sampled_from(NODES), min_size=1, max_size=2, unique=True).map(",".join),
        st.just(0),
    ),
    st.tuples(st.just("deliver"), st.just(""), st.just(0)),
    st.tuples(st.just("kubelet"), st.just(""), st.just(0)),
    st.tuples(
        st.just("crash"),
        st.sampled_from(NODES),
        st.integers(1, 8).flatmap(lambda n: st.sampled_from([n, -n])),  # -n: after the write
    ),
)

# A crash once the card's record is stored (the lock), before its rule: the new process
# makes the rule, once, and evicts the pod once.
CRASH_AFTER_RECORD = [
    ("driver", EKS_NODES[0], 1),
    ("deliver", "", 0),
    ("crash", EKS_NODES[0], -1),
    ("work", EKS_NODES[0], 0),
    ("kubelet", "", 0),
    ("work", EKS_NODES[0], 0),
]
# The driver's taint and the agent's report name the same card: one record, one rule.
BOTH_SOURCES = [
    ("agent", GKE_NODE, 2),
    ("driver", GKE_NODE, 2),
    ("deliver", "", 0),
    ("crash", GKE_NODE, -2),
    ("work", GKE_NODE, 0),
]
# Three cards of one node: the third escalates to the node (its taint, past the
# breaker's check), while the cards keep their rules.
ESCALATION = [
    ("driver", AKS_NODE, 0),
    ("driver", AKS_NODE, 1),
    ("driver", AKS_NODE, 2),
    ("deliver", "", 0),
    ("work", AKS_NODE, 0),
    ("kubelet", "", 0),
    ("work", AKS_NODE, 0),
]

STEPS = st.lists(step, min_size=3, max_size=25)


@settings(max_examples=300, deadline=None, database=None)
@example(CRASH_AFTER_RECORD, [0])
@example(BOTH_SOURCES, [1])
@example(ESCALATION, [0])
@given(STEPS, TURNS)
def test_each_bad_card_gets_one_record_one_rule_one_eviction_per_pod(
    steps: list[tuple[str, str, int]], turns: list[int]
) -> None:
    check(steps, turns)


def check(steps: list[tuple[str, str, int]], turns: list[int]) -> None:
    async def run() -> None:
        api = DraMemoryApi(itertools.cycle(turns), crash_at=None)
        cluster(api)
        process = await start(api)
        for kind, node, arg in steps:
            if kind == "driver":
                driver_taint(api, node, arg)
            elif kind == "agent":
                agent_report(api, process, node, arg)
            elif kind == "report":
                node_report(api, process, node)
            elif kind == "work":
                await work(process, node.split(","))
                settled(api, node.split(","))
            elif kind == "deliver":
                await relist(process)
            elif kind == "kubelet":
                api.kubelet()
            else:
                api.crash_at = api.requests + abs(arg)
                api.crash_after_write = arg < 0
                with contextlib.suppress(Crash):
                    await work(process, [node])
                api.crash_at = None
                process = await start(api)
            ledger = api.ledger
            assert all(n == 1 for n in ledger.record_creates.values()), ledger.record_creates
            assert all(n == 1 for n in ledger.evictions.values()), ledger.evictions
            assert all(n == 1 for n in ledger.taints_set.values()), ledger.taints_set
            assert ledger.most_tainted <= CAP, (ledger.most_tainted, CAP)
        # Every rule the store holds was made once and selects the card its record names.
        for path, rule in api.objects.items():
            if path.startswith(RULES + "/"):
                record = api.objects[
                    f"{FAULTS}/{rule['metadata']['name'].removeprefix('gpuheal-')}"
                ]
                selector = rule["spec"]["deviceSelector"]
                assert record["spec"]["resourceID"] == (
                    f"{selector['driver']}/{selector['pool']}/{selector['device']}"
                )
        made = Counter(n for n in api.ledger.record_creates if n.startswith("gpuheal-"))
        assert all(n == 1 for n in made.values())

    asyncio.run(run())


def test_the_controller_fences_at_the_one_version_the_server_serves() -> None:
    """The in-memory server serves the rules at v1beta2 only (Kubernetes 1.36) and
    refuses the controller's other versions: the controller writes at v1beta2."""

    async def run() -> None:
        api = DraMemoryApi(itertools.cycle([0]), crash_at=None)
        cluster(api)
        process = await start(api)
        driver_taint(api, NODES[0], 0)
        await relist(process)
        await work(process, [NODES[0]])
        rules = [p for p in api.objects if "/devicetaintrules/" in p]
        assert [p.rsplit("/", 1)[0] for p in rules] == [RULES]
        assert set(RULE_VERSIONS) - {SERVED}  # the others, asked for and refused

    asyncio.run(run())


def test_without_the_rule_api_the_cards_are_marked_and_the_node_path_holds() -> None:
    """DRA served, DeviceTaintRules not (1.36 without its beta API): a bad card is
    marked and its pod moved, no rule is asked for beyond the informers' one look,
    and a third bad card still takes the node (escalation), each pod evicted once."""

    async def run() -> None:
        api = DraMemoryApi(itertools.cycle([0]), crash_at=None)
        api.rules_served = False
        cluster(api)
        process = await start(api)
        node = NODES[0]
        driver_taint(api, node, 0)
        await relist(process)
        await work(process, [node])
        assert not [p for p in api.objects if "/devicetaintrules/" in p]
        marked = api.objects[node_path(node)]["metadata"]["annotations"]
        assert marked.get("gpuheal.io/quarantined-devices") == f"{DRIVER}/{node}/gpu-0"
        assert api.ledger.evictions == {"pod-0-0": 1} and not api.tainted()
        for card in (1, 2):
            driver_taint(api, node, card)
        await relist(process)
        await work(process, [node])
        api.kubelet()
        await work(process, [node])
        assert api.tainted() == {node}  # the third card escalates to the node
        assert all(n == 1 for n in api.ledger.evictions.values()), api.ledger.evictions
        assert set(api.ledger.evictions) == {f"pod-0-{c}" for c in range(CARDS)}
        assert not [p for p in api.objects if "/devicetaintrules/" in p]

    asyncio.run(run())
