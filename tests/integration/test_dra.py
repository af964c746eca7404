"""DRA-native GPU nodes on the real control plane: NVIDIA's DRA driver's DeviceClasses
and ResourceSlice (sim/dra.py) accepted by the real API server, every claim allocated
by the real kube-scheduler, the pods run by kwok, and gpuheal's reading of which pod
holds which GPU (policy/dra.py) checked against the scheduler's choice.

The node carries no `nvidia.com/gpu` anywhere, as under GPU Operator's DRA mode.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.resources.resource_v1beta2 import DeviceTaintRule
from lightkube.types import PatchType

from gpuheal.model import DeviceKey, fault_record_name
from gpuheal.policy.devices import canary_name
from gpuheal.policy.dra import by_key, gpu_count, pod_gpus, slice_devices
from gpuheal.policy.drivertaints import XID_KEY, Scope, driver_taints, meaning
from gpuheal.policy.fence import FENCE_LABEL, NODE_ANNOTATION, PROBATION_KEY, device_taint_rule
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.agent import gpu_spec
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.dra import (
    DRIVER,
    MAX_DRA_NODE_NAME,
    MIG_CLASS,
    claim_pod,
    device_classes,
    dra_node,
    gpu_claim,
    resource_slice,
    with_taint,
)
from gpuheal.sim.nodes import GPU_RESOURCE, delete_nodes, wait_nodes_ready
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, pod_disruption_budget, wait_pods_running
from tests.corpus import unique_eks_node, unique_fqdn
from tests.helpers import wait_for
from tests.integration.conftest import (
    StartAgent,
    StartController,
    controller_config,
    evictions_from,
    faults_of,
    in_process_cli,
    node_annotations,
    our_taint,
    pods_on,
    pods_told_evicted,
    record_entries,
    record_phase,
    report_fault,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def gpu_classes(kube: Client) -> None:
    for manifest in device_classes():
        try:
            apply(kube, manifest)
        except ApiError as err:
            if err.status.code != 409:
                raise


@pytest.fixture
def dra_nodes(kube: Client, gpu_classes: None) -> Iterator[list[str]]:
    """Created DRA nodes (with their driver's slice), deleted afterwards with it."""
    created: list[str] = []
    yield created
    for name in created:
        for item in as_dicts(kube.list(ResourceSlice, fields={"spec.nodeName": name})):
            kube.delete(ResourceSlice, item["metadata"]["name"])
    delete_nodes(kube, created)


def add_dra_node(
    kube: Client,
    created: list[str],
    name: str,
    pool: dict[str, str],
    taints: Sequence[tuple[str, str, str]] = (),
) -> None:
    """A DRA node and its driver's slice; `taints`: (device, key, value) the driver
    put on its devices, NoSchedule."""
    created.append(name)
    apply(kube, dra_node(name, labels=pool))
    wait_nodes_ready(kube, [name])
    item = resource_slice(name, gpu_spec(name))
    for device, key, value in taints:
        item = with_taint(item, device, key, value)
    apply(kube, item)


def add_claim_pods(
    kube: Client, namespace: str, prefix: str, count: int, node_selector: dict[str, str]
) -> None:
    """`count` one-GPU pods `<prefix>-<i>`, each through its own claim `<prefix>-<i>-gpus`,
    for the real scheduler to place and allocate."""
    for i in range(count):
        apply(kube, gpu_claim(f"{prefix}-{i}-gpus", namespace))
        pod = claim_pod(
            f"{prefix}-{i}", namespace, f"{prefix}-{i}-gpus", node_selector=node_selector
        )
        apply(kube, pod)


def as_dicts(items: Any) -> list[dict[str, Any]]:
    return [i.to_dict() for i in items]


def test_eight_one_gpu_claims_get_eight_cards_and_gpuheal_knows_which_pod_holds_which(
    kube: Client, namespace: str, pool: dict[str, str], dra_nodes: list[str]
) -> None:
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool)
    stored = kube.get(Node, node).to_dict()
    assert GPU_RESOURCE not in stored["status"]["capacity"]
    add_claim_pods(kube, namespace, "train", 8, pool)
    running = as_dicts(wait_pods_running(kube, namespace, count=8, timeout_s=90))
    assert {p["spec"]["nodeName"] for p in running} == {node}

    slices = as_dicts(kube.list(ResourceSlice, fields={"spec.nodeName": node}))
    devices = by_key(slice_devices(slices))
    claims = {
        (namespace, c["metadata"]["name"]): c
        for c in as_dicts(kube.list(ResourceClaim, namespace=namespace))
    }
    held = {p["metadata"]["name"]: pod_gpus(p, claims, devices) for p in running}
    assert all(len(gpus) == 1 for gpus in held.values()), held
    # Eight pods, eight different cards: the node's eight UUIDs, each held once.
    assert sorted(g[0].uuid for g in held.values()) == sorted(
        d["uuid"] for d in gpu_spec(node)["devices"]
    )
    assert {g[0].key.driver for g in held.values()} == {DRIVER}

    # A ninth claim finds no free card: Pending, and the scheduler says why.
    apply(kube, gpu_claim("train-8-gpus", namespace))
    apply(kube, claim_pod("train-8", namespace, "train-8-gpus", node_selector=pool))

    def unschedulable() -> str:
        pod = kube.get(Pod, "train-8", namespace=namespace)
        conditions = (pod.status.conditions if pod.status else None) or []
        return next(
            (c.message or "" for c in conditions if c.type == "PodScheduled" and c.reason),
            "",
        )

    message = wait_for("the ninth pod to be found unschedulable", unschedulable, timeout_s=60)
    assert "claim" in message.lower(), message
    assert kube.get(Pod, "train-8", namespace=namespace).to_dict()["status"]["phase"] == "Pending"


def test_a_gpu_in_mig_mode_is_offered_as_its_mig_devices_and_a_claim_gets_one(
    kube: Client, namespace: str, pool: dict[str, str], dra_nodes: list[str]
) -> None:
    """GPU 0 in MIG mode with seven 1g.10gb devices, as NVIDIA's driver publishes it:
    not whole, its MIG devices each a device (the parent's UUID on each). The real API
    server takes the slice; the real scheduler gives a MIG claim one of them and a
    whole-GPU claim another card; gpuheal reads the MIG pod as holding that MIG device
    of GPU 0, and counts the node as 7 GPUs and 7 MIG devices."""
    node = unique_eks_node()
    dra_nodes.append(node)
    apply(kube, dra_node(node, labels=pool))
    wait_nodes_ready(kube, [node])
    spec = gpu_spec(node)
    spec["devices"][0]["mig"] = ["1g.10gb"] * 7
    apply(kube, resource_slice(node, spec))
    apply(kube, gpu_claim("mig-0-gpus", namespace, device_class=MIG_CLASS))
    apply(kube, claim_pod("mig-0", namespace, "mig-0-gpus", node_selector=pool))
    apply(kube, gpu_claim("whole-0-gpus", namespace))
    apply(kube, claim_pod("whole-0", namespace, "whole-0-gpus", node_selector=pool))
    running = as_dicts(wait_pods_running(kube, namespace, count=2, timeout_s=90))

    slices = as_dicts(kube.list(ResourceSlice, fields={"spec.nodeName": node}))
    devices = by_key(slice_devices(slices))
    claims = {
        (namespace, c["metadata"]["name"]): c
        for c in as_dicts(kube.list(ResourceClaim, namespace=namespace))
    }
    held = {p["metadata"]["name"]: pod_gpus(p, claims, devices) for p in running}
    (mig,) = held["mig-0"]
    assert mig.kind == "mig" and mig.key.device.startswith("gpu-0-mig-1g10gb-19-")
    assert mig.uuid.startswith("MIG-") and mig.gpu_uuid == spec["devices"][0]["uuid"]
    (whole,) = held["whole-0"]
    assert whole.kind == "gpu" and whole.key.device != "gpu-0"
    on_node = slice_devices(slices)[node]
    assert gpu_count(on_node) == 14
    assert sorted({d.kind for d in on_node}) == ["gpu", "mig"]


def test_the_longest_node_name_the_driver_can_publish_a_pool_for(
    kube: Client, namespace: str, pool: dict[str, str], dra_nodes: list[str]
) -> None:
    """The driver names the pool after the node and the slice `00000-gpu.nvidia.com-
    <node>-` (its kubelet plugin library, vendored at DRIVER_COMMIT), which the API
    server holds to 253 characters and a dash: a node name of up to 232 characters
    gets its slice and its claims allocated; one longer (a name at the 253 limit)
    gets no slice from the real driver either, so it offers no DRA GPU at all."""
    node = unique_fqdn(MAX_DRA_NODE_NAME)
    add_dra_node(kube, dra_nodes, node, pool)
    (item,) = kube.list(ResourceSlice, fields={"spec.nodeName": node})
    assert item.spec.pool.name == node
    apply(kube, gpu_claim("one-gpus", namespace))
    apply(kube, claim_pod("one", namespace, "one-gpus", node_selector=pool))
    (pod,) = wait_pods_running(kube, namespace, count=1, timeout_s=60)
    claim = kube.get(ResourceClaim, "one-gpus", namespace=namespace).to_dict()
    devices = by_key(slice_devices([item.to_dict()]))
    (gpu,) = pod_gpus(pod.to_dict(), {(namespace, "one-gpus"): claim}, devices)
    assert gpu.node == node and gpu.uuid in {d["uuid"] for d in gpu_spec(node)["devices"]}

    # gpuheal's fence of a device in that pool, for a fault id of any length and
    # characters: the API server takes it as built.
    rule = fence(kube, node, gpu.key.device, "NoSchedule", fault_id="manual/" + "ä😀 " * 200)
    stored = kube.get(DeviceTaintRule, rule)
    assert stored.spec.deviceSelector.pool == node  # type: ignore[union-attr]
    kube.delete(DeviceTaintRule, rule)

    longer = unique_fqdn(MAX_DRA_NODE_NAME + 1)
    with pytest.raises(ApiError) as refused:
        apply(kube, resource_slice(longer, gpu_spec(longer)))
    assert refused.value.status.code == 422
    assert "must be no more than 253 characters" in str(refused.value.status.message)


def fence(kube: Client, node: str, device: str, effect: str, fault_id: str = "xid-79") -> str:
    """gpuheal's DeviceTaintRule on one device of the node's pool; its name."""
    record = fault_record_name(node, fault_id, f"{DRIVER}/{node}/{device}")
    rule = device_taint_rule(
        node=node,
        record=record,
        fault_id=fault_id,
        reason="XidCritical79",
        device=DeviceKey(DRIVER, node, device),
        effect=effect,
    )
    return str(apply(kube, rule).metadata.name)


def held_by(kube: Client, namespace: str, node: str) -> dict[str, str]:
    """Each Running pod's GPU UUID, as gpuheal reads it."""
    devices = by_key(slice_devices(as_dicts(kube.list(ResourceSlice))))
    claims = {
        (namespace, c["metadata"]["name"]): c
        for c in as_dicts(kube.list(ResourceClaim, namespace=namespace))
    }
    return {
        p["metadata"]["name"]: gpu.uuid
        for p in as_dicts(kube.list(Pod, namespace=namespace))
        if p["status"].get("phase") == "Running"
        for gpu in pod_gpus(p, claims, devices)
        if gpu.node == node
    }


def pod_names(kube: Client, namespace: str) -> set[str]:
    return {p["metadata"]["name"] for p in as_dicts(kube.list(Pod, namespace=namespace))}


def test_a_no_schedule_rule_keeps_new_claims_off_that_card_only(
    kube: Client, namespace: str, pool: dict[str, str], dra_nodes: list[str]
) -> None:
    """The fence gpuheal needs, on the real scheduler: a NoSchedule DeviceTaintRule on
    gpu-3 leaves seven cards to allocate and the node schedulable; without the rule
    the card is handed out again."""
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool)
    fenced = gpu_spec(node)["devices"][3]["uuid"]
    rule = fence(kube, node, "gpu-3", "NoSchedule")
    try:
        for i in range(8):
            apply(kube, gpu_claim(f"c-{i}", namespace))
            apply(kube, claim_pod(f"p-{i}", namespace, f"c-{i}", node_selector=pool))
        wait_pods_running(kube, namespace, count=7, timeout_s=90)
        held = held_by(kube, namespace, node)
        assert len(held) == 7 and fenced not in held.values(), held
        assert not kube.get(Node, node).to_dict()["spec"].get("unschedulable")
    finally:
        kube.delete(DeviceTaintRule, rule)
    wait_for(
        "the eighth pod to be given the card once the rule is gone",
        lambda: fenced in held_by(kube, namespace, node).values(),
        timeout_s=90,
    )


def test_a_no_execute_rule_deletes_the_pod_on_the_card_whatever_its_budget(
    kube: Client, namespace: str, pool: dict[str, str], dra_nodes: list[str]
) -> None:
    """Why gpuheal fences with NoSchedule and moves pods through the Eviction API:
    kube-controller-manager answers a NoExecute device taint by deleting the pods
    on the card, and a PodDisruptionBudget that allows no disruption does not hold."""
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool)
    labels = {"app": "serving"}
    apply(kube, pod_disruption_budget("serving", namespace, match_labels=labels, max_unavailable=0))
    for i in range(2):
        apply(kube, gpu_claim(f"c-{i}", namespace))
        apply(
            kube,
            claim_pod(f"p-{i}", namespace, f"c-{i}", labels=labels, node_selector=pool),
        )
    wait_pods_running(kube, namespace, count=2, timeout_s=60)
    held = held_by(kube, namespace, node)
    device = next(
        f"gpu-{i}" for i, g in enumerate(gpu_spec(node)["devices"]) if g["uuid"] == held["p-0"]
    )
    rule = fence(kube, node, device, "NoExecute")
    try:
        wait_for(
            "kube-controller-manager to delete the pod on the tainted card",
            lambda: "p-0" not in pod_names(kube, namespace),
            timeout_s=60,
        )
        assert pod_names(kube, namespace) == {"p-1"}
    finally:
        kube.delete(DeviceTaintRule, rule)


def test_the_drivers_own_xid_taint_is_read_back_and_keeps_the_card_out(
    kube: Client, namespace: str, pool: dict[str, str], dra_nodes: list[str]
) -> None:
    """NVIDIA's driver taints gpu-3 `gpu.nvidia.com/xid=79:NoSchedule` in its slice (as
    its NVMLDeviceHealthCheck does): the API server keeps it (stamping the time), the
    scheduler hands out the other seven cards, and gpuheal reads it as the node's
    fault on that GPU."""
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool, taints=[("gpu-3", XID_KEY, "79")])
    (item,) = as_dicts(kube.list(ResourceSlice, fields={"spec.nodeName": node}))
    (taint,) = driver_taints([item])
    assert taint.device.uuid == gpu_spec(node)["devices"][3]["uuid"]
    said = meaning(taint)
    assert said is not None and (said.scope, said.reason) == (Scope.NODE, "XidCritical79")
    (stored,) = [d for d in item["spec"]["devices"] if d["name"] == "gpu-3"]
    assert stored["taints"][0]["timeAdded"]
    for i in range(8):
        apply(kube, gpu_claim(f"c-{i}", namespace))
        apply(kube, claim_pod(f"p-{i}", namespace, f"c-{i}", node_selector=pool))
    wait_pods_running(kube, namespace, count=7, timeout_s=90)
    held = held_by(kube, namespace, node)
    assert len(held) == 7 and taint.device.uuid not in held.values(), held


# -- the controller on a DRA-only node ------------------------------------------


def console_page(controller: ControllerProcess, token: str, page: str) -> str:
    """A console page as a signed-in viewer sees it (HTML): `nodes/<name>`, `fleet`."""
    browser = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    with browser.open(f"{controller.url}/console/login", timeout=10) as form:
        csrf = re.search(r'name="_csrf" value="([^"]+)"', form.read().decode())
    assert csrf is not None
    sign_in = urllib.parse.urlencode({"_csrf": csrf.group(1), "user": "dra-test", "token": token})
    with browser.open(f"{controller.url}/console/login", sign_in.encode(), timeout=10) as fleet:
        assert fleet.url.endswith("/console/fleet"), fleet.url  # signed in, sent on
    with browser.open(f"{controller.url}/console/{page}", timeout=10) as shown:
        return str(shown.read().decode())


def test_the_controller_counts_a_dra_only_node_s_gpus_and_moves_its_claim_pods(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    dra_nodes: list[str],
    start_controller: StartController,
    tmp_path: Path,
) -> None:
    """No `nvidia.com/gpu` anywhere: the controller learns the node's eight GPUs from
    its slice (one the driver tainted for a double-bit ECC error, so seven usable: that
    card's own fault, fenced, no pod on it) and that the claim pods are GPU pods from
    their allocated claims, and a node fault moves exactly those."""
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool, taints=[("gpu-3", XID_KEY, "48")])
    add_claim_pods(kube, namespace, "train", 7, pool)
    logger = claim_pod("logger", namespace, "none", node_selector=pool)
    del logger["spec"]["resourceClaims"], logger["spec"]["containers"][0]["resources"]
    apply(kube, logger)
    wait_pods_running(kube, namespace, count=8, timeout_s=90)
    # The tainted card is the one the scheduler left free.
    assert gpu_spec(node)["devices"][3]["uuid"] not in held_by(kube, namespace, node).values()

    (tmp_path / "view-token").write_text("dra-view-token-5c1e0f27\n")
    controller = start_controller(
        controller_config(pool, consoleViewTokenFile=str(tmp_path / "view-token"))
    )
    wait_for("the card's fence", lambda: our_rules(kube, node), timeout_s=30)
    page = console_page(controller, "dra-view-token-5c1e0f27", f"nodes/{node}")
    gpus = re.search(r'<dd id="gpus">([^<]*)</dd>', page)
    assert gpus is not None and gpus.group(1) == "8 (7 usable)", page
    fenced = f'gpu-3</code> <span class="state-quarantined">({XID_KEY}, gpuheal.io/gpu-fault)'
    assert fenced in page, page
    # The fleet page says which fence a bad DRA card gets (this API server: v1beta2).
    fleet = console_page(controller, "dra-view-token-5c1e0f27", "fleet")
    said = re.search(r'<p class="summary" id="fence">([^<]*)</p>', fleet)
    assert said is not None, fleet
    assert said.group(1).startswith("device fence: a bad one of the ")
    assert said.group(1).endswith(
        "DRA GPUs gets a DeviceTaintRule (resource.k8s.io/v1beta2, NoSchedule)"
    )

    report_fault(kube, node, "dra-node-fault-1")
    wait_for("the taint", lambda: our_taint(kube, node) == "dra-node-fault-1", timeout_s=30)
    wait_for(
        "the claim pods gone from the node",
        lambda: pods_on(kube, namespace, node) == {"logger"},
        timeout_s=60,
    )
    (record,) = [r for r in faults_of(kube, node) if r.spec["scope"] == "node"]
    name = record.metadata.name
    wait_for("record Drained", lambda: record_phase(kube.get(GPUFault, name)) == "Drained")
    status: Any = kube.get(GPUFault, name).status or {}
    assert sorted(status["evictedPods"]) == [f"{namespace}/train-{i}" for i in range(7)]
    assert sorted(pods_told_evicted(kube, node, at_least=7)) == status["evictedPods"]


# -- the device fence, end to end -------------------------------------------------

CANARY_NAMESPACE = "gpuheal-system"


def report_claim_device(kube: Client, namespace: str, pod: str, device: str, health: str) -> None:
    """What the kubelet writes for a DRA device (KEP-4680): the container's entry
    named after its claim reference (`claim:<name>`, `/<request>` when the container
    names one: the API server holds it to those), the device as
    `<driver>/<pool>/<device>`, through the pods/status subresource."""
    current = kube.get(Pod, pod, namespace=namespace)
    assert current.status is not None and current.status.containerStatuses
    statuses = [s.to_dict() for s in current.status.containerStatuses]
    entry = {"name": "claim:gpus", "resources": [{"resourceID": device, "health": health}]}
    statuses[0]["allocatedResourcesStatus"] = [entry]
    kube.patch(
        Pod.Status,
        pod,
        {"status": {"containerStatuses": statuses}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )


def our_rules(kube: Client, node: str) -> list[dict[str, Any]]:
    return [
        r
        for r in as_dicts(kube.list(DeviceTaintRule, labels={FENCE_LABEL: "device"}))
        if r["metadata"].get("annotations", {}).get(NODE_ANNOTATION) == node
    ]


def card_of(kube: Client, namespace: str, node: str, pod: str) -> str:
    """The device name (gpu-<n>) the scheduler gave the pod."""
    uuids = [d["uuid"] for d in gpu_spec(node)["devices"]]
    return f"gpu-{uuids.index(held_by(kube, namespace, node)[pod])}"


def test_a_bad_card_is_fenced_alone_its_pod_moved_and_proven_by_a_canary_on_it(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    pool: dict[str, str],
    dra_nodes: list[str],
    start_controller: StartController,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Seven one-GPU pods on an eight-card DRA-only node. One card reports Unhealthy:
    one DeviceTaintRule on exactly that card, only its pod evicted, the node
    untainted and schedulable; the real scheduler gives a new pod the free card and
    keeps the next, and an 8-GPU pod, off the fenced one. Once the quarantine expires
    the canary's claim is allocated that very card; it passes, the record resolves,
    the rule gives way to a probation rule, and once that ends the waiting pod gets
    the card; with the node's pods gone, the 8-GPU pod gets all eight."""
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool)
    add_claim_pods(kube, namespace, "train", 7, pool)
    wait_pods_running(kube, namespace, count=7, timeout_s=90)
    bad = card_of(kube, namespace, node, "train-2")
    health = {
        "canaryNamespace": CANARY_NAMESPACE,
        "canaryTimeoutSeconds": 60,
        "observationSeconds": 1,
        "quarantineSeconds": 8,
        "probationSeconds": 6,
        "evictionsPerMinute": 600,
        "evictionBurst": 10,
    }
    start_controller(controller_config(pool, deviceHealth=health))

    report_claim_device(kube, namespace, "train-2", f"{DRIVER}/{node}/{bad}", "Unhealthy")
    (rule,) = wait_for("the card's fence", lambda: our_rules(kube, node), timeout_s=30)
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node, "device": bad}
    assert rule["spec"]["taint"]["key"] == "gpuheal.io/gpu-fault"
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    wait_for("train-2 evicted", lambda: "train-2" not in pods_on(kube, namespace, node))
    assert pods_on(kube, namespace, node) == {f"train-{i}" for i in range(7) if i != 2}
    (record,) = faults_of(kube, node)
    assert record.spec["scope"] == "device" and record.spec["resourceName"] == DRIVER
    assert rule["metadata"]["name"] == f"gpuheal-{record.metadata.name}"

    def fence_entry() -> list[dict[str, Any]]:
        return record_entries(kube.get(GPUFault, record.metadata.name), "fence")

    (entry,) = wait_for("the record names its fence", fence_entry)
    assert entry["detail"] == f"{rule['metadata']['name']} (NoSchedule)"
    assert our_taint(kube, node) is None
    assert not kube.get(Node, node).to_dict()["spec"].get("unschedulable")

    # The real scheduler: a new pod gets the free card, the next waits (the only
    # card left is the fenced one).
    apply(kube, gpu_claim("new-0-gpus", namespace))
    apply(kube, claim_pod("new-0", namespace, "new-0-gpus", node_selector=pool))
    wait_for("new-0 running", lambda: "new-0" in held_by(kube, namespace, node), timeout_s=60)
    assert card_of(kube, namespace, node, "new-0") != bad
    apply(kube, gpu_claim("new-1-gpus", namespace))
    apply(kube, claim_pod("new-1", namespace, "new-1-gpus", node_selector=pool))
    # An 8-GPU pod cannot have the node while one card is fenced: the scheduler says so.
    apply(kube, gpu_claim("whole-gpus", namespace, gpus=8))
    apply(kube, claim_pod("whole", namespace, "whole-gpus", node_selector=pool))
    time.sleep(3)
    assert "new-1" not in held_by(kube, namespace, node)
    said = wait_for("the scheduler's reason", lambda: unschedulable(kube, namespace, "whole"))
    assert "cannot allocate all claims" in said, said
    # `gpuheal status` counts the node as the scheduler sees it: 8 GPUs, 7 usable
    # (the fenced one aside), 7 held through claims.
    config = tmp_path / "cli.yaml"
    ((label, name),) = pool.items()
    pools = {"label": label, "byName": {name: {"gpusPerNode": 8}}}
    config.write_text(yaml.safe_dump({"nodeSelector": pool, "pools": pools}))
    cli = in_process_cli(control_plane.kubeconfig, capsys, "--config", str(config))
    code, out, _ = cli("status", "-o", "json")
    assert code == 0
    (row,) = json.loads(out)["pools"]
    assert (row["nodes"], row["capacity"], row["allocatable"], row["allocated"]) == (1, 8, 7, 7)
    # `gpuheal audit` says which taint keeps the card from new claims.
    code, out, _ = cli("audit", "-o", "json")
    found = [f for f in json.loads(out)["findings"] if f["node"] == node]
    assert [f["kind"] for f in found] == ["allocatable-drop"], found
    assert "taints (gpuheal.io/gpu-fault) keep new claims off 1;" in found[0]["detail"]
    # `gpuheal gate` fails the node on its count; `gpuheal doctor` names the fenced card
    # and the fence.
    assert gate_count(cli, node) == (
        "fail",
        f"7 of 8 DRA GPU devices usable, expected 8; tainted: {bad} (gpuheal.io/gpu-fault)",
    )
    findings = doctor_findings(cli, node)
    assert (
        findings["gpus-tainted"][0] == "warn"
        and f"{bad} (gpuheal.io/gpu-fault)" in findings["gpus-tainted"][1]
    )
    assert findings["device-fence"] == (
        "ok",
        "A bad card here is fenced alone: a DeviceTaintRule (resource.k8s.io/v1beta2, "
        "NoSchedule), its pods moved through the Eviction API.",
    )

    # The quarantine expires: the canary's claim is allocated the fenced card itself.
    def canary_claim() -> dict[str, Any] | None:
        claims = as_dicts(kube.list(ResourceClaim, namespace=CANARY_NAMESPACE))
        return next((c for c in claims if c["status"].get("allocation")), None)

    claim = wait_for("the canary's claim allocated", canary_claim, timeout_s=60)
    assert claim is not None
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (node, bad)
    canary = claim["metadata"]["name"]
    wait_for("the canary running", lambda: _phase(kube, CANARY_NAMESPACE, canary) == "Running")
    kube.patch(
        Pod.Status, canary, {"status": {"phase": "Succeeded"}},
        namespace=CANARY_NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip
    wait_for(
        "resolved",
        lambda: record_phase(kube.get(GPUFault, record.metadata.name)) == "Resolved",
        timeout_s=60,
    )

    # Released: the fence goes, and the card serves its probation (a NoSchedule rule
    # of its own key): new-1, which does not tolerate it, still waits.
    def on_probation() -> list[dict[str, Any]]:
        rules = our_rules(kube, node)
        return (
            [r for r in rules if r["spec"]["taint"]["key"] == PROBATION_KEY]
            if len(rules) == 1
            else []
        )

    (probation,) = wait_for("the fence replaced by probation", on_probation, timeout_s=30)
    assert probation["metadata"]["name"] == f"gpuheal-probation-{record.metadata.name}"
    assert probation["spec"]["deviceSelector"]["device"] == bad
    assert "new-1" not in held_by(kube, namespace, node)
    wait_for("the canary's claim gone", lambda: canary_claim() is None, timeout_s=30)
    wait_for("the probation over", lambda: not our_rules(kube, node), timeout_s=30)
    wait_for(
        "new-1 given the card back",
        lambda: "new-1" in held_by(kube, namespace, node),
        timeout_s=90,
    )
    assert card_of(kube, namespace, node, "new-1") == bad
    assert gate_count(cli, node) == ("pass", "8 DRA GPU devices usable, as expected")
    # Every card free again, the 8-GPU pod is given all eight, the once bad one too.
    for pod in pods_on(kube, namespace, node):
        kube.delete(Pod, pod, namespace=namespace, grace_period=0)
    wait_for("the 8-GPU pod placed", lambda: "whole" in held_by(kube, namespace, node), 60)
    assert len(pod_cards(kube, namespace, "whole")) == 8


def gate_count(cli: Any, node: str) -> tuple[str, str]:
    """`gpuheal gate NODE`'s gpu-count check: (result, reason)."""
    _, out, _ = cli("gate", node, "-o", "json")
    check = next(c for c in json.loads(out)["checks"] if c["name"] == "gpu-count")
    return check["result"], check["reason"]


def doctor_findings(cli: Any, node: str) -> dict[str, tuple[str, str]]:
    """`gpuheal doctor NODE`'s findings by kind: (severity, text)."""
    _, out, _ = cli("doctor", node, "-o", "json")
    questions = json.loads(out)["questions"]
    return {f["kind"]: (f["severity"], f["text"]) for q in questions for f in q["findings"]}


def unschedulable(kube: Client, namespace: str, pod: str) -> str:
    """The scheduler's message on a pod it could not place, or ""."""
    status = kube.get(Pod, pod, namespace=namespace).status
    conditions = (status.conditions if status else None) or []
    return next(
        (
            c.message or ""
            for c in conditions
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        ),
        "",
    )


def pod_cards(kube: Client, namespace: str, pod: str) -> list[str]:
    """The devices the scheduler allocated the pod's claim."""
    claim = kube.get(ResourceClaim, f"{pod}-gpus", namespace=namespace).to_dict()
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def _phase(kube: Client, namespace: str, name: str) -> str:
    try:
        pod = kube.get(Pod, name, namespace=namespace)
    except ApiError:
        return ""
    return str(pod.status.phase if pod.status else "")


def taint_card(kube: Client, node: str, device: str, key: str, value: str, effect: str) -> None:
    """The driver's health check tainting one of its devices: the node's slice
    written again with one more taint on `device`."""
    (item,) = as_dicts(kube.list(ResourceSlice, fields={"spec.nodeName": node}))
    tainted = with_taint(item, device, key, value, effect)
    kube.patch(
        ResourceSlice, item["metadata"]["name"], {"spec": {"devices": tainted["spec"]["devices"]}},
        patch_type=PatchType.MERGE,
    )  # fmt: skip


def test_the_driver_s_xid_taints_mean_what_nvidia_s_catalogue_says(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    dra_nodes: list[str],
    start_controller: StartController,
) -> None:
    """NVIDIA's DRA driver reports no health to the kubelet: it taints the device in
    its slice. Xid 13 (an application's fault) on one node's card changes nothing;
    Xid 48 (a double-bit ECC error) on another's fences that card and moves its pod
    only; Xid 79 (fallen off the bus) on the first fences the card and takes the node."""
    quiet, bad = unique_eks_node(), unique_eks_node()
    for node in (quiet, bad):
        add_dra_node(kube, dra_nodes, node, pool)
    for node, prefix in ((quiet, "q"), (bad, "b")):
        add_claim_pods(kube, namespace, prefix, 2, {**pool, "kubernetes.io/hostname": node})
    wait_pods_running(kube, namespace, count=4, timeout_s=90)
    start_controller(controller_config(pool, deviceHealth={"evictionsPerMinute": 600}))

    taint_card(kube, quiet, card_of(kube, namespace, quiet, "q-0"), XID_KEY, "13", "None")
    ecc = card_of(kube, namespace, bad, "b-0")
    taint_card(kube, bad, ecc, XID_KEY, "48", "NoSchedule")
    (rule,) = wait_for("the ECC card's fence", lambda: our_rules(kube, bad), timeout_s=30)
    assert rule["spec"]["deviceSelector"]["device"] == ecc
    wait_for("b-0 evicted", lambda: pods_on(kube, namespace, bad) == {"b-1"})
    (record,) = faults_of(kube, bad)
    assert "xid=48" in record_entries(record, "detect")[0]["detail"]
    assert our_taint(kube, bad) is None
    # Xid 13, seen in the same watch as Xid 48: nothing.
    assert not faults_of(kube, quiet) and not our_rules(kube, quiet)
    assert pods_on(kube, namespace, quiet) == {"q-0", "q-1"}

    lost = card_of(kube, namespace, quiet, "q-0")
    taint_card(kube, quiet, lost, XID_KEY, "79", "NoSchedule")
    wait_for("the node quarantined", lambda: our_taint(kube, quiet) is not None, timeout_s=30)
    (fence,) = wait_for("the card fenced too", lambda: our_rules(kube, quiet), timeout_s=30)
    assert fence["spec"]["deviceSelector"]["device"] == lost
    wait_for("the node's GPU pods moved", lambda: not pods_on(kube, namespace, quiet), timeout_s=60)


@pytest.mark.parametrize("crash_after", ["CreateDeviceRecord", "FenceDevice", "Evict"])
def test_a_kill_at_any_step_of_a_card_s_fence_leaves_one_rule_one_record_one_eviction(
    crash_after: str,
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    dra_nodes: list[str],
    start_controller: StartController,
) -> None:
    """The controller SIGKILLed right after a step (its crashpoint), then started
    again: the card has one fence, the fault one record naming it once, the pod
    on the card one eviction; the other pod stays."""
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool)
    add_claim_pods(kube, namespace, "k", 2, pool)
    wait_pods_running(kube, namespace, count=2, timeout_s=60)
    config = controller_config(pool, deviceHealth={"evictionsPerMinute": 600})
    doomed = start_controller(config, env={"GPUHEAL_CRASH_AFTER": crash_after})
    card = card_of(kube, namespace, node, "k-0")
    taint_card(kube, node, card, XID_KEY, "48", "NoSchedule")
    assert doomed.wait_exit(30) == -9, "the crashpoint was not reached"

    start_controller(config)
    wait_for("k-0 moved", lambda: pods_on(kube, namespace, node) == {"k-1"}, timeout_s=60)
    (record,) = faults_of(kube, node)

    def named() -> list[dict[str, Any]]:
        return record_entries(kube.get(GPUFault, record.metadata.name), "fence")

    wait_for("the record names its fence", named)
    time.sleep(1)  # anything a duplicate would do, done
    (rule,) = our_rules(kube, node)
    assert rule["spec"]["deviceSelector"]["device"] == card
    assert len(named()) == 1
    (stored,) = faults_of(kube, node)
    listed = (stored.status or {}).get("evictedPods") or []
    told = pods_told_evicted(kube, node)
    if crash_after == "Evict":
        # Killed between the eviction and the pass's end (where the record's news is
        # written): the pod left once, its record cannot say so, its Event may be lost.
        assert listed == [] and told in ([], [f"{namespace}/k-0"])
    else:
        assert listed == told == [f"{namespace}/k-0"]


def test_a_kill_at_each_step_of_the_way_back_leaves_one_canary_one_release_no_rule(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    dra_nodes: list[str],
    start_controller: StartController,
) -> None:
    """The way back of a fenced card, with the controller SIGKILLed right after each
    of its steps in turn (the canary made, the canary deleted once it passed, the
    fence replaced by probation, the probation lifted), each time started again:
    one canary run, one release, the record resolved, no rule left, the card free."""
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool)
    apply(kube, gpu_claim("w-0-gpus", namespace))
    apply(kube, claim_pod("w-0", namespace, "w-0-gpus", node_selector=pool))
    wait_pods_running(kube, namespace, count=1, timeout_s=60)
    bad = card_of(kube, namespace, node, "w-0")
    health = {
        "canaryNamespace": CANARY_NAMESPACE,
        "canaryTimeoutSeconds": 120,
        "observationSeconds": 1,
        "quarantineSeconds": 4,
        "probationSeconds": 4,
        "evictionsPerMinute": 600,
    }
    config = controller_config(pool, deviceHealth=health)

    def canary() -> str:
        """The name of the node's running canary pod, or "" (other tests' canaries
        may be left in the namespace)."""
        pods = as_dicts(kube.list(Pod, namespace=CANARY_NAMESPACE, fields={"spec.nodeName": node}))
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running[0]["metadata"]["name"] if running else ""

    steps = [("CreateCanary", None), ("DeleteCanary", canary), ("Unfence", None)]
    for step, then in [*steps, ("Unfence:1", None)]:
        doomed = start_controller(config, env={"GPUHEAL_CRASH_AFTER": step})
        if step == "CreateCanary":
            report_claim_device(kube, namespace, "w-0", f"{DRIVER}/{node}/{bad}", "Unhealthy")
        if then is not None:
            name = wait_for("the canary running", then, timeout_s=60)
            kube.patch(
                Pod.Status, name, {"status": {"phase": "Succeeded"}},
                namespace=CANARY_NAMESPACE, patch_type=PatchType.MERGE,
            )  # fmt: skip
        assert doomed.wait_exit(60) == -9, f"the crashpoint after {step} was not reached"

    start_controller(config)
    (record,) = faults_of(kube, node)
    wait_for(
        "resolved", lambda: record_phase(kube.get(GPUFault, record.metadata.name)) == "Resolved"
    )
    wait_for("no rule left", lambda: not our_rules(kube, node), timeout_s=30)
    stored = kube.get(GPUFault, record.metadata.name)
    assert len(record_entries(stored, "canary-start")) == 1
    assert len(record_entries(stored, "release")) == 1
    assert len(record_entries(stored, "fence")) == 1
    assert not list(kube.list(Pod, namespace=CANARY_NAMESPACE, fields={"spec.nodeName": node}))
    claims = as_dicts(kube.list(ResourceClaim, namespace=CANARY_NAMESPACE))
    assert canary_name(record.metadata.name, 1) not in {c["metadata"]["name"] for c in claims}
    assert pods_told_evicted(kube, node) == [f"{namespace}/w-0"]


def test_maintenance_asks_a_claim_pod_to_checkpoint_before_it_drains_a_dra_node(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    pool: dict[str, str],
    dra_nodes: list[str],
    start_controller: StartController,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """`gpuheal maintenance start` on a DRA-only node: the pod holding a GPU through its
    claim is a GPU workload, asked to checkpoint (annotated) before the drain moves
    it; the pod without a GPU is drained without being asked (bare pods: `--force`)."""
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool)
    apply(kube, gpu_claim("ckpt-0-gpus", namespace))
    apply(kube, claim_pod("ckpt-0", namespace, "ckpt-0-gpus", node_selector=pool))
    plain = claim_pod("web-0", namespace, "none", node_selector=pool)
    del plain["spec"]["resourceClaims"], plain["spec"]["containers"][0]["resources"]
    apply(kube, plain)
    wait_pods_running(kube, namespace, count=2, timeout_s=60)
    settings = controller_config(pool)
    settings["maintenance"] = {"evictionRetrySeconds": 0.5, "pollSeconds": 0.2}
    start_controller(settings).wait_leading()
    config = tmp_path / "cli.yaml"
    config.write_text(yaml.safe_dump(settings))
    cli = in_process_cli(control_plane.kubeconfig, capsys, "--config", str(config))

    code, out, err = cli(
        "maintenance", "start", node, "--reason", "driver 580", "--checkpoint-wait", "1", "--force",
        "-o", "json",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["checkpoint"]["asked"] == [f"{namespace}/ckpt-0"]
    assert sorted(report["evicted"]) == [f"{namespace}/ckpt-0", f"{namespace}/web-0"]


def test_a_budget_that_allows_no_disruption_holds_the_card_s_pod_and_the_event_says_so(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    dra_nodes: list[str],
    start_controller: StartController,
) -> None:
    """The fence is NoSchedule and the pod leaves through the Eviction API: a
    PodDisruptionBudget of maxUnavailable 0 holds it (unlike NoExecute's deletion),
    the refusal is told once on the pod, and the card stays fenced meanwhile."""
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool)
    labels = {"app": "serving"}
    apply(kube, pod_disruption_budget("serving", namespace, match_labels=labels, max_unavailable=0))
    apply(kube, gpu_claim("s-0-gpus", namespace))
    apply(kube, claim_pod("s-0", namespace, "s-0-gpus", labels=labels, node_selector=pool))
    wait_pods_running(kube, namespace, count=1, timeout_s=60)
    start_controller(controller_config(pool, deviceHealth={"evictionsPerMinute": 600}))
    taint_card(kube, node, card_of(kube, namespace, node, "s-0"), XID_KEY, "48", "NoSchedule")

    wait_for("the card's fence", lambda: our_rules(kube, node), timeout_s=30)
    (told,) = evictions_from(kube, node, "GPUPodEvictionBlocked", at_least=1)
    assert "serving" in (told.message or ""), told
    time.sleep(2)  # retries meanwhile, backed off
    assert pods_on(kube, namespace, node) == {"s-0"}
    assert len(evictions_from(kube, node, "GPUPodEvictionBlocked")) == 1


def test_the_controller_says_which_fence_it_has_and_asks_for_a_missing_one_once(
    kube: Client,
    control_plane: ControlPlane,
    pool: dict[str, str],
    dra_nodes: list[str],
    audited_controller_user: str,
    start_controller: StartController,
) -> None:
    """This API server (Kubernetes 1.36) serves DeviceTaintRules at v1beta2 only: the
    controller fences at v1beta2, says so in gpuheal_device_fence, and asks for the
    v1 it lacks once at start, not in a loop; and counts the DRA GPUs it sees."""
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool)
    started = audit.offset(control_plane.audit_log)
    controller = start_controller(controller_config(pool), user=audited_controller_user)
    controller.wait_leading()
    metrics = controller.metrics()
    assert 'gpuheal_device_fence{version="v1beta2"} 1.0' in metrics
    assert 'gpuheal_device_fence{version="v1"} 0.0' in metrics
    dra_gpus = next(line for line in metrics.splitlines() if line.startswith("gpuheal_dra_gpus "))
    assert float(dra_gpus.split()[1]) >= 8
    time.sleep(5)  # what a retry loop would send meanwhile
    asked = Counter(
        (r.verb, r.code)
        for r in audit.requests(
            control_plane.audit_log, user=audited_controller_user, since=started
        )
        if r.resource == "devicetaintrules"
    )
    # v1: one LIST, not found; v1beta2: one LIST and its WATCH.
    assert asked == {("list", 404): 1, ("list", 200): 1, ("watch", 200): 1}, asked


def test_the_agent_s_xid_on_one_card_fences_that_card_and_two_cards_take_the_node(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    dra_nodes: list[str],
    start_controller: StartController,
    start_agent: StartAgent,
) -> None:
    """The real agent (NVML stand-in, its kernel log) on a DRA-only node reads Xid 48
    (a double-bit ECC error: NVIDIA's remedy is that GPU's reset) on the card one pod
    holds: one DeviceTaintRule on that card, that pod moved, the node untouched. The
    agent's report then names a second card (Xid 48 on it too): the fault is the
    node's, the node is quarantined and its pods leave, the first card's rule stays."""
    node = unique_eks_node()
    add_dra_node(kube, dra_nodes, node, pool)
    add_claim_pods(kube, namespace, "a", 3, pool)
    wait_pods_running(kube, namespace, count=3, timeout_s=90)
    start_controller(controller_config(pool, deviceHealth={"evictionsPerMinute": 600}))
    agent = start_agent(node, {"failRounds": 1, "intervalSeconds": 0.2})

    def ecc(card: str) -> str:
        pci = 0x18 + int(card.removeprefix("gpu-"))
        return (
            f"NVRM: Xid (PCI:0000:{pci:02x}:00): 48, pid='<unknown>', name=<unknown>, An "
            "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
            "at partition 6, subpartition 0."
        )

    first = card_of(kube, namespace, node, "a-0")
    agent.kernel(ecc(first))
    (rule,) = wait_for("the card's fence", lambda: our_rules(kube, node), timeout_s=30)
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node, "device": first}
    wait_for("a-0 moved", lambda: pods_on(kube, namespace, node) == {"a-1", "a-2"}, timeout_s=60)
    (record,) = faults_of(kube, node)
    assert record.spec["scope"] == "device"
    (detect,) = record_entries(record, "detect")
    uuid = gpu_spec(node)["devices"][int(first.removeprefix("gpu-"))]["uuid"]
    assert detect["detail"] == f"agent: EccDoubleBit48 on {uuid}"
    assert node_annotations(kube, node)["gpuheal.io/fault-reason"] == "EccDoubleBit48"
    time.sleep(2)  # what a node quarantine would do meanwhile
    assert our_taint(kube, node) is None
    assert pods_on(kube, namespace, node) == {"a-1", "a-2"}

    agent.kernel(ecc(card_of(kube, namespace, node, "a-1")))
    wait_for("the node quarantined", lambda: our_taint(kube, node) is not None, timeout_s=30)
    wait_for("the node's pods moved", lambda: not pods_on(kube, namespace, node), timeout_s=60)
    assert [r["metadata"]["name"] for r in our_rules(kube, node)] == [rule["metadata"]["name"]]
    scopes = Counter(r.spec.get("scope", "node") for r in faults_of(kube, node))
    assert scopes == {"device": 1, "node": 1}, scopes
