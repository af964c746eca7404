"""A bad DRA card on each other minor: fenced alone where the API server serves
DeviceTaintRules (1.37: resource.k8s.io/v1, the version 1.36 lacks), and where it
serves no DRA at all (1.32: no resource.k8s.io/v1) the controller asks for what is
missing once, not in a loop, and keeps handling node faults (test_core.py)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.generic_resource import create_global_resource
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from gpuheal.policy.drivertaints import XID_KEY
from gpuheal.policy.fence import FENCE_LABEL
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
from gpuheal.sim.workloads import apply, wait_pods_running
from tests.conftest import AUDITED_CONTROLLER
from tests.corpus import unique_eks_node
from tests.helpers import wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    our_taint,
    pods_on,
)
from tests.versions.conftest import minor_of

pytestmark = [pytest.mark.versions, pytest.mark.timeout(240)]

DRA_GA = 34  # resource.k8s.io/v1: ResourceSlices, ResourceClaims, DeviceClasses
RULES_GA = 37  # resource.k8s.io/v1 DeviceTaintRules, on by default
RulesV1 = create_global_resource("resource.k8s.io", "v1", "DeviceTaintRule", "devicetaintrules")


@pytest.fixture
def audited(kube: Client) -> Iterator[str]:
    audit.grant_cluster_admin(kube, AUDITED_CONTROLLER)
    yield AUDITED_CONTROLLER


def test_a_bad_dra_card_is_fenced_where_the_rules_are_served_and_nothing_loops_elsewhere(
    control_plane: ControlPlane,
    kube: Client,
    crds: None,
    namespace: str,
    pool: dict[str, str],
    start_controller: StartController,
    audited: str,
) -> None:
    minor = minor_of(control_plane)
    started = audit.offset(control_plane.audit_log)
    controller = start_controller(
        controller_config(pool, deviceHealth={"evictionsPerMinute": 600}), user=audited
    )
    controller.wait_leading()
    if minor < DRA_GA:
        time.sleep(5)  # what a retry loop would send meanwhile
        asked = Counter(
            (r.resource, r.code)
            for r in audit.requests(control_plane.audit_log, user=audited, since=started)
            if r.resource in ("resourceslices", "resourceclaims", "devicetaintrules")
            and r.verb == "list"
        )
        # Each asked for once (devicetaintrules: at v1 and at v1beta2), none served.
        assert asked == {
            ("resourceslices", 404): 1,
            ("resourceclaims", 404): 1,
            ("devicetaintrules", 404): 2,
        }, asked
        assert 'gpuheal_device_fence{version="v1"} 0.0' in controller.metrics()
        return

    node = unique_eks_node()
    for manifest in device_classes():
        try:
            apply(kube, manifest)
        except ApiError as err:
            if err.status.code != 409:
                raise
    apply(kube, dra_node(node, labels=pool))
    try:
        wait_nodes_ready(kube, [node])
        apply(kube, resource_slice(node, gpu_spec(node)))
        for i in range(2):
            apply(kube, gpu_claim(f"v-{i}-gpus", namespace))
            apply(kube, claim_pod(f"v-{i}", namespace, f"v-{i}-gpus", node_selector=pool))
        wait_pods_running(kube, namespace, count=2, timeout_s=90)
        card = held_card(kube, namespace, "v-0")
        (item,) = [i.to_dict() for i in kube.list(ResourceSlice, fields={"spec.nodeName": node})]
        devices = with_taint(item, card, XID_KEY, "48")["spec"]["devices"]
        kube.patch(
            ResourceSlice, item["metadata"]["name"], {"spec": {"devices": devices}},
            patch_type=PatchType.MERGE,
        )  # fmt: skip
        wait_for("v-0 moved", lambda: pods_on(kube, namespace, node) == {"v-1"}, timeout_s=60)
        assert our_taint(kube, node) is None
        if minor >= RULES_GA:
            assert 'gpuheal_device_fence{version="v1"} 1.0' in controller.metrics()
            listed: Any = kube.list(RulesV1, labels={FENCE_LABEL: "device"})
            rules = [r.to_dict() for r in listed]
            (rule,) = [r for r in rules if r["spec"]["deviceSelector"].get("pool") == node]
            selector = rule["spec"]["deviceSelector"]
            assert selector == {"driver": DRIVER, "pool": node, "device": card}
    finally:
        for found in kube.list(ResourceSlice, fields={"spec.nodeName": node}):
            kube.delete(ResourceSlice, found.metadata.name)  # type: ignore[union-attr,arg-type]
        delete_nodes(kube, [node])


def held_card(kube: Client, namespace: str, pod: str) -> str:
    """The device the scheduler allocated the pod's claim."""
    claim: Any = kube.get(ResourceClaim, f"{pod}-gpus", namespace=namespace).to_dict()
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])
