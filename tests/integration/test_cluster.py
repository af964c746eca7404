"""The local control plane behaves like a real cluster: kwok nodes, the real
scheduler, RBAC, Pod device health in status, taint-based eviction."""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from lightkube import ApiError, Client
from lightkube.models.authentication_v1 import TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.authentication_v1 import SelfSubjectReview
from lightkube.resources.core_v1 import Event, Node, Pod, Secret, ServiceAccount
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.types import PatchType

from gpuheal.sim import ADMIN, ControlPlane
from gpuheal.sim.client import sync_client
from gpuheal.sim.kubeconfig import write_kubeconfig
from gpuheal.sim.nodes import GPU_RESOURCE, delete_nodes, gpu_node, is_ready
from gpuheal.sim.workloads import (
    apply,
    gpu_deployment,
    gpu_pod,
    pod_disruption_budget,
    wait_pods_running,
)
from tests.helpers import FakeNodes, unique, wait_for

pytestmark = pytest.mark.timeout(180)


def test_fake_gpu_node_becomes_ready(kube: Client, fake_gpu_nodes: FakeNodes) -> None:
    (name,) = fake_gpu_nodes(1)
    node = kube.get(Node, name)
    assert is_ready(node)
    assert node.status is not None
    assert node.status.allocatable is not None
    assert node.status.allocatable[GPU_RESOURCE] == "8"
    assert node.metadata is not None and node.metadata.labels is not None
    assert node.metadata.labels["nvidia.com/gpu.present"] == "true"


def test_scheduler_places_gpu_pods_until_gpus_run_out(
    kube: Client, namespace: str, fake_gpu_nodes: FakeNodes
) -> None:
    pool = {"gpuheal.test/pool": namespace}
    nodes = fake_gpu_nodes(2, labels=pool)
    apply(kube, gpu_deployment("trainer", namespace, replicas=16, node_selector=pool))

    running = wait_pods_running(kube, namespace, count=16, labels={"app": "trainer"})
    placed = sorted(p.spec.nodeName for p in running if p.spec and p.spec.nodeName)
    assert placed == sorted([nodes[0]] * 8 + [nodes[1]] * 8)

    apply(kube, gpu_pod("one-too-many", namespace, node_selector=pool))

    def failed_scheduling() -> list[Event]:
        return [
            e
            for e in kube.list(
                Event, namespace=namespace, fields={"involvedObject.name": "one-too-many"}
            )
            if e.reason == "FailedScheduling"
            and f"Insufficient {GPU_RESOURCE}" in (e.message or "")
        ]

    wait_for("a FailedScheduling event naming the GPU shortage", failed_scheduling)
    pod = kube.get(Pod, "one-too-many", namespace=namespace)
    assert pod.status is not None and pod.status.phase == "Pending"
    assert pod.spec is not None and not pod.spec.nodeName


def test_rbac_denies_what_a_role_does_not_grant(
    control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    user = "gpuheal-operator"
    role = unique("node-reader")
    apply(
        kube,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}],
        },
    )
    apply(
        kube,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )
    try:
        narrow = control_plane.client(user)
        # RBAC bindings take effect through the authorizer's informer: allow a moment.
        wait_for("the binding to take effect", lambda: _allowed(lambda: list(narrow.list(Node))))
        for denied in (
            lambda: list(narrow.list(Pod, namespace=namespace)),
            lambda: list(narrow.list(Secret, namespace=namespace)),
            lambda: narrow.delete(Node, "no-such-node"),
            lambda: narrow.patch(Node, "no-such-node", {"metadata": {"labels": {"a": "b"}}}),
        ):
            with pytest.raises(ApiError) as err:
                denied()
            assert err.value.status.code == 403
    finally:
        kube.delete(ClusterRoleBinding, role)
        kube.delete(ClusterRole, role)


def test_token_request_issues_a_service_account_token_that_rbac_checks(
    control_plane: ControlPlane, kube: Client, namespace: str, tmp_path: Path
) -> None:
    kube.create(ServiceAccount(metadata=ObjectMeta(name="gpuheal-agent")), namespace=namespace)
    token_request = ServiceAccount.Token(
        metadata=ObjectMeta(), spec=TokenRequestSpec(audiences=[], expirationSeconds=600)
    )
    issued = kube.create(token_request, "gpuheal-agent", namespace=namespace)
    assert issued.status is not None and issued.status.token

    # The same API server, authenticated by the issued token instead of the static one.
    as_sa = sync_client(
        write_kubeconfig(
            tmp_path / "sa.kubeconfig",
            server=control_plane.server,
            ca_cert=control_plane.ca_cert,
            user="gpuheal-agent",
            token=issued.status.token,
        )
    )
    review = as_sa.create(SelfSubjectReview())
    assert review.status is not None and review.status.userInfo is not None
    assert review.status.userInfo.username == f"system:serviceaccount:{namespace}:gpuheal-agent"
    with pytest.raises(ApiError) as err:
        list(as_sa.list(Node))
    assert err.value.status.code == 403


def test_pod_status_carries_allocated_resources_status(
    kube: Client, namespace: str, fake_gpu_nodes: FakeNodes
) -> None:
    (node,) = fake_gpu_nodes(1)
    apply(kube, gpu_pod("infer", namespace, gpus=2, node_name=node))
    (pod,) = wait_pods_running(kube, namespace, count=1)
    assert pod.status is not None and pod.status.containerStatuses

    # Written as the kubelet would: the whole containerStatuses entry, with the
    # health of each device it allocated to the container.
    devices = [
        {"resourceID": "GPU-11111111-2222-3333-4444-555555555555", "health": "Healthy"},
        {"resourceID": "GPU-66666666-7777-8888-9999-000000000000", "health": "Unhealthy"},
    ]
    statuses = [s.to_dict() for s in pod.status.containerStatuses]
    statuses[0]["allocatedResourcesStatus"] = [{"name": GPU_RESOURCE, "resources": devices}]
    kube.patch(
        Pod.Status,
        "infer",
        {"status": {"containerStatuses": statuses}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )

    back = kube.get(Pod, "infer", namespace=namespace)
    assert back.status is not None and back.status.containerStatuses
    stored = back.status.containerStatuses[0].to_dict()["allocatedResourcesStatus"]
    assert stored == [{"name": GPU_RESOURCE, "resources": devices}]


def test_noexecute_taint_makes_the_taint_eviction_controller_delete_a_pod(
    kube: Client, namespace: str, fake_gpu_nodes: FakeNodes
) -> None:
    (node,) = fake_gpu_nodes(1)
    apply(kube, gpu_pod("victim", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)

    taint = {"key": "gpuheal.test/broken", "value": "yes", "effect": "NoExecute"}
    kube.patch(Node, node, {"spec": {"taints": [taint]}}, patch_type=PatchType.MERGE)

    def gone() -> bool:
        try:
            pod = kube.get(Pod, "victim", namespace=namespace)
        except ApiError as err:
            return err.status.code == 404
        return pod.metadata is not None and pod.metadata.deletionTimestamp is not None

    wait_for("the taint-eviction controller to delete the pod", gone)
    reasons = {e.reason for e in kube.list(Event, namespace=namespace)}
    assert "TaintManagerEviction" in reasons


def _allowed(call: Callable[[], object]) -> bool:
    try:
        call()
    except ApiError as err:
        if err.status.code == 403:
            return False
        raise
    return True


def test_apiserver_reports_the_release_it_was_built_from(control_plane: ControlPlane) -> None:
    # build.sh stamps the version with ldflags; without them /version says v0.0.0-master.
    context = ssl.create_default_context(cafile=str(control_plane.ca_cert))
    request = urllib.request.Request(f"{control_plane.server}/version")  # noqa: S310
    request.add_header("Authorization", f"Bearer {control_plane.tokens[ADMIN]}")
    with urllib.request.urlopen(request, context=context, timeout=5) as response:  # noqa: S310
        version = json.load(response)
    assert version["gitVersion"] == "v1.36.3"
    assert (version["major"], version["minor"]) == ("1", "36")


def test_kwok_manages_only_nodes_annotated_as_fake(kube: Client, fake_gpu_nodes: FakeNodes) -> None:
    plain = gpu_node(unique("real-node"))
    del plain["metadata"]["annotations"]["kwok.x-k8s.io/node"]
    apply(kube, plain)
    try:
        fake_gpu_nodes(1)  # returns once kwok has made this one Ready
        time.sleep(1)
        node = kube.get(Node, plain["metadata"]["name"])
        assert not is_ready(node)
        assert node.status is not None and not node.status.conditions
    finally:
        delete_nodes(kube, [plain["metadata"]["name"]])


def test_pod_disruption_budget_limits_evictions(
    kube: Client, namespace: str, fake_gpu_nodes: FakeNodes
) -> None:
    # Bare pods: nothing replaces an evicted one, so the budget stays spent.
    (node,) = fake_gpu_nodes(1)
    labels = {"app": "serve"}
    for name in ("serve-a", "serve-b"):
        apply(kube, gpu_pod(name, namespace, node_name=node, labels=labels))
    apply(kube, pod_disruption_budget("serve", namespace, match_labels=labels, min_available=1))
    wait_pods_running(kube, namespace, count=2, labels=labels)

    def one_disruption_allowed() -> bool:
        pdb = kube.get(PodDisruptionBudget, "serve", namespace=namespace)
        return pdb.status is not None and pdb.status.disruptionsAllowed == 1

    wait_for("the disruption controller to allow one disruption", one_disruption_allowed)

    def evict(name: str) -> None:
        eviction = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        kube.create(eviction, name, namespace=namespace)

    evict("serve-a")
    with pytest.raises(ApiError) as err:
        evict("serve-b")
    assert err.value.status.code == 429
