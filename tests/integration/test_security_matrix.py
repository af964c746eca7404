"""Least privilege, proved on the real control plane with the chart's identities.

Every identity the chart grants (the controller's and the agent's
ServiceAccounts, the two operator ClusterRoles bound to test ServiceAccounts)
gets a token from TokenRequest and tries every dangerous change in one list:
pod image and labels, pods in other namespaces, node labels, taints, capacity
and addresses, finalizers, Secrets, RBAC, the GPUFault CRD, the admission
policies. Each attempt is a real request sent with dryRun=All: authentication,
RBAC and admission run as for a write, nothing is stored, so one attempt cannot
change what the next one meets. What each identity needs for its job is in the
same list and must be allowed; the programs themselves then run with those
tokens (the agent here, the controller's canaries here, its fault cycle and the
maintenance round trip in test_helm_chart.py).

The matrix is printed, and docs/security.md carries the same table.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import (
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
)
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.authentication_v1 import SelfSubjectReview
from lightkube.resources.core_v1 import Namespace, Node, Pod, Secret, ServiceAccount
from lightkube.resources.events_v1 import Event as EventsV1Event
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.resources.resource_v1 import DeviceTaintRule as DeviceTaintRuleV1
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.resources.resource_v1beta2 import DeviceTaintRule
from lightkube.types import PatchType

from gpuheal.agent.facts import FACT_KEYS
from gpuheal.cli import main
from gpuheal.config import Config
from gpuheal.kube import writes
from gpuheal.kube.events import event_body, node_ref, pod_ref
from gpuheal.model import (
    CANARY_LABEL,
    CHECKPOINT_REQUESTED,
    DIAGNOSTICS,
    DISRUPTION_GUARD,
    DISRUPTION_KEYS,
    DRIVER_VERSION,
    FAULT_ID,
    GPU_HEALTHY_CONDITION,
    HANDLED_AT,
    HANDLED_FAULT_ID,
    LAST_GPU_ERROR,
    LAST_PROCESS_TIME,
    MAINTENANCE_PROGRESS,
    MAINTENANCE_REASON,
    MAINTENANCE_REQUEST,
    MAINTENANCE_ROLLOUT,
    MAINTENANCE_TAINT_KEY,
    MANAGED_LABEL,
    QUARANTINED_DEVICES,
    REPAIR_REQUEST,
    REPAIR_RESULT,
    SCALE_DOWN_DISABLED,
    STATE_LABEL,
    STATUS,
    SUSPECT_DEVICES,
    SWEEP,
    SWEEP_TAINT,
    TAINT_KEY,
    UNKNOWN_DEVICES,
    DeviceKey,
    DraDevice,
    FaultSignal,
    Mode,
)
from gpuheal.ops.maintenance import MAINTENANCE_ANNOTATIONS
from gpuheal.policy.fence import device_taint_rule
from gpuheal.policy.rollout import rollout_name
from gpuheal.policy.validation import CreateValidationJob, job_manifest
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.dra import DRIVER as DRA_DRIVER
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes, plain_node, wait_nodes_ready
from gpuheal.sim.resources import GPUFault, GPURollout
from gpuheal.sim.workloads import apply, create_namespace, gpu_pod, wait_pods_running
from gpuheal.sources.annotations import KEYS as FAULT_KEYS
from gpuheal.vocabulary import Reason
from tests.corpus import eks_node_names
from tests.helpers import FakeNodes, refusals, unique, wait_for
from tests.hosts import dgx_h100
from tests.integration.chart import Release, as_token, bind, forbidden, installed, token_for
from tests.integration.conftest import annotate, events_for

pytestmark = pytest.mark.timeout(300)

CONFLICT_RETRIES = 5
# A maintenance request as `gpuheal maintenance start` writes it.
MAINTENANCE_ASKED = (
    '{"id":"5f1c2a9e0b7d","verb":"start","by":"alice","at":"2026-12-06T12:00:00Z",'
    '"reason":"driver 550","checkpoint":null,"checkpointWaitSeconds":null,"drain":true,'
    '"drainTimeoutSeconds":null,"deleteEmptyDirData":false,"force":false}'
)
# Another operator's request (what a second `gpuheal maintenance start` would write).
MAINTENANCE_ASKED_AGAIN = MAINTENANCE_ASKED.replace("5f1c2a9e0b7d", "0d1e2f3a4b5c")
DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
IDENTITIES = ("controller", "agent", "operator-view", "operator")
POOL_LABEL = "gpuheal.test/pool"
FOREIGN_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
EVIL_IMAGE = "attacker.example/evil:1"


@dataclass
class Scene:
    """What the attempts aim at, and who attempts them."""

    release: Release
    own: str  # a GPU node: the agent's token is bound to it
    other: str  # another GPU node, carrying our fault taint
    tenant: str  # a tenant namespace with GPU pods on `own`
    system_pod: str  # a pod in kube-system
    bystander: str  # a pod in the release namespace that is no canary
    fault: str  # a GPUFault record, open
    closed: str = ""  # a GPUFault record, Resolved (retention deletes such ones)
    rollout: str = ""  # a GPURollout of the tenant's pool
    held: str = ""  # a GPUFault record the breaker holds, not released
    repairing: str = ""  # a GPUFault record whose repair attempt 1 awaits approval
    event: str = ""  # an Event about a tenant's GPU pod, as the controller writes one
    # A node gpuheal does not manage (no GPUs, no GPU labels: outside the chart's
    # nodeSelector), with a maintenance request on it.
    infra: str = ""
    # A GPU node opted out (gpuheal.io/managed=false), with a maintenance request on it.
    opted: str = ""
    # DeviceTaintRules: gpuheal's fence of one device, and a site's rule of its own.
    fence: str = ""
    foreign_rule: str = ""
    # What this API server serves of DRA: the DeviceTaintRule version ("": none), and
    # whether ResourceClaims are (resource.k8s.io/v1): the rows needing them run only then.
    fence_version: str = ""
    claims: bool = False
    clients: dict[str, Client] = field(default_factory=dict)
    kubeconfigs: dict[str, Path] = field(default_factory=dict)

    @property
    def system(self) -> str:
        return self.release.namespace

    def node(self, which: str) -> str:
        """The node an attempt aims at: "own", "other" or "infra"."""
        return {"own": self.own, "other": self.other, "infra": self.infra, "opted": self.opted}[
            which
        ]

    def role(self, suffix: str) -> str:
        return f"{self.release.name}-{suffix}"


def settled(call: Callable[[], Any], timeout_s: float = 15) -> bool:
    """Wait (bounded) until a new admission policy refuses `call`; the verdict is the
    attempts', not this wait's: a policy that never arrives fails them, not this."""
    try:
        wait_for("the policy", lambda: forbidden(call), timeout_s=timeout_s)
    except AssertionError:
        return False
    return True


def fault_record(name: str, node: str) -> Any:
    """A GPUFault as the controller writes it."""
    signal = FaultSignal(node=node, fault_id="xid-79", reason="XidCritical79", source="agent")
    return GPUFault.from_dict(writes.fault_record(name, signal, Mode.FULL))


def rollout_object(name: str, pool: str) -> Any:
    """A GPURollout as `gpuheal rollout start` creates it."""
    return GPURollout.from_dict({
        "metadata": {"name": name},
        "spec": {"pool": pool, "target": {"driverVersion": "560.35.03"}, "canary": 1,
                 "batchSize": 1, "maxUnavailable": 1},
    })  # fmt: skip


def patch(c: Client, node: str, body: dict[str, Any], *, status: bool = False) -> Any:
    """A dry-run patch of a node (strategic: conditions merge by type, as the agent
    writes them); returns the node as it would be stored."""
    resource = Node.Status if status else Node
    return c.patch(resource, node, body, patch_type=PatchType.STRATEGIC, dry_run=True)


def applied(want: Any, got: Any) -> bool:
    """Does the object `got` say what the patch `want` asked for? (None: absent;
    conditions are matched by type; other lists must be as given.)"""
    if want is None:
        return got is None
    if isinstance(want, dict):
        got = got or {}
        return all(applied(v, got.get(k)) for k, v in want.items() if k != "resourceVersion")
    if isinstance(want, list):
        got = got or []
        if want and all(isinstance(w, dict) and "type" in w for w in want):
            return all(any(g.get("type") == w["type"] and applied(w, g) for g in got) for w in want)
        return len(want) == len(got) and all(map(applied, want, got))
    return bool(want == got)


@pytest.fixture(scope="module")
def scene(
    kube: Client, control_plane: ControlPlane, crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scene]:
    tmp = tmp_path_factory.mktemp("identities")
    with installed(kube, control_plane) as release:
        system = release.namespace
        tenant = unique("tenant")
        create_namespace(kube, tenant)
        own, other, opted = eks_node_names(3)
        create_gpu_nodes(kube, [own, other], labels={POOL_LABEL: tenant})
        create_gpu_nodes(kube, [opted], labels={MANAGED_LABEL: "false"})
        infra = unique("infra")
        kube.create(codecs.from_dict(plain_node(infra)))
        bindings: list[str] = []
        system_pod, fault, closed = unique("sys-agent"), unique("fault"), unique("closed")
        held, repairing = unique("held"), unique("repairing")
        version = ""
        fence: dict[str, Any] = {}
        foreign_rule: dict[str, Any] = {}
        try:
            wait_nodes_ready(kube, [own, other, infra, opted])
            ours = {"key": TAINT_KEY, "value": "xid-79", "effect": "NoSchedule"}
            for node, taints in ((own, [FOREIGN_TAINT]), (other, [FOREIGN_TAINT, ours])):
                kube.patch(Node, node, {"spec": {"taints": taints}}, patch_type=PatchType.MERGE)
            for name in ("job-0", "evict-0"):
                apply(kube, gpu_pod(name, tenant, node_name=own))
            wait_pods_running(kube, tenant, count=2)
            # A GPU pod already asked to checkpoint: its request is not the controller's
            # to move or take back.
            asked = {"metadata": {"annotations": {CHECKPOINT_REQUESTED: DEADLINE}}}
            kube.patch(Pod, "evict-0", asked, namespace=tenant)
            labels = {"app": "sys-agent"}
            try:  # the pod's ServiceAccount, unless kube-controller-manager made it already
                default = ServiceAccount(metadata=ObjectMeta(name="default"))
                kube.create(default, namespace="kube-system")
            except ApiError as err:
                if err.status.code != 409:
                    raise
            apply(kube, gpu_pod(system_pod, "kube-system", node_name=own, labels=labels))
            apply(kube, gpu_pod("bystander", system, node_name=own))
            kube.create(fault_record(fault, own))
            awaiting = {"status": {"phase": "AwaitingApproval", "actions": []}}
            kube.patch(GPUFault.Status, fault, awaiting, patch_type=PatchType.MERGE)
            kube.create(fault_record(closed, own))
            kube.create(fault_record(held, other))
            kube.patch(GPUFault.Status, held, {"status": {"phase": "Held", "actions": []}},
                       patch_type=PatchType.MERGE)  # fmt: skip
            kube.create(fault_record(repairing, own))
            kube.patch(GPUFault.Status, repairing, {"status": {"phase": "Drained", "actions": [],
                       "repairApproval": REPAIR_QUESTION}}, patch_type=PatchType.MERGE)  # fmt: skip
            resolved = {"status": {"phase": "Resolved"}}
            kube.patch(GPUFault.Status, closed, resolved, patch_type=PatchType.MERGE)
            for account, role in (("ops", "operator"), ("viewer", "operator-view")):
                kube.create(ServiceAccount(metadata=ObjectMeta(name=account)), namespace=system)
                bindings.append(bind(kube, f"{release.name}-{role}", account, system))
            rollout = unique("rollout")
            kube.create(rollout_object(rollout, tenant))
            told = xid_event(tenant, own)
            kube.create(codecs.from_dict(told))
            version, fence, foreign_rule = device_rules(kube, own)
            s = Scene(
                release,
                own,
                other,
                tenant,
                system_pod,
                "bystander",
                fault,
                closed,
                rollout,
                held,
                repairing,
                event=told["metadata"]["name"],
                infra=infra,
                opted=opted,
                fence=fence["metadata"]["name"],
                foreign_rule=foreign_rule["metadata"]["name"],
                fence_version=version,
                claims=claims_served(kube),
            )
            tokens = {
                "controller": token_for(kube, system, s.role("controller")),
                "agent": token_for(kube, system, s.role("agent"), bound_node=own),
                "operator-view": token_for(kube, system, "viewer"),
                "operator": token_for(kube, system, "ops"),
            }
            for who, token in tokens.items():
                s.kubeconfigs[who], s.clients[who] = as_token(control_plane, tmp, token, who)
            # New bindings and policies take effect within moments.
            for who in ("operator-view", "operator"):
                client = s.clients[who]
                wait_for(who, lambda c=client: list(c.list(Node, labels={POOL_LABEL: tenant})))  # type: ignore[misc]
            relabel = {"metadata": {"labels": {"x": "y"}}}
            agent, ctl, ops = s.clients["agent"], s.clients["controller"], s.clients["operator"]
            settled(lambda: patch(agent, other, relabel, status=True))
            settled(lambda: patch(agent, own, relabel, status=True))
            settled(lambda: patch(ctl, own, relabel))
            settled(lambda: ctl.delete(Pod, "bystander", namespace=system, dry_run=True))
            settled(lambda: ctl.delete(GPUFault, fault, dry_run=True))
            settled(lambda: patch(ops, own, relabel))
            settled(lambda: ops.patch(Pod, "job-0", relabel, namespace=tenant, dry_run=True))
            settled(lambda: ctl.patch(Pod, "job-0", relabel, namespace=tenant, dry_run=True))
            yield s
        finally:
            for binding in bindings:
                kube.delete(ClusterRoleBinding, binding)
            removals: list[Callable[[], None]] = [
                lambda: kube.delete(GPUFault, fault),
                lambda: kube.delete(GPUFault, closed),
                lambda: kube.delete(GPUFault, held),
                lambda: kube.delete(GPUFault, repairing),
                lambda: kube.delete(GPURollout, rollout),
                lambda: drop_rules(kube, version, fence, foreign_rule),
                lambda: kube.delete(Pod, system_pod, namespace="kube-system", grace_period=0),
            ]
            for remove in removals:
                try:
                    remove()
                except ApiError as err:
                    if err.status.code != 404:
                        raise
            kube.delete(Namespace, tenant)
            delete_nodes(kube, [own, other, infra, opted])


# -- the attempts ------------------------------------------------------------------

Attempt = Callable[[Client, Scene], Any]


@dataclass(frozen=True)
class Action:
    what: str
    attempt: Attempt
    allowed: frozenset[str] = frozenset()  # the identities whose job this is
    needs: str = ""  # "fence" or "claims": an API not every Kubernetes version serves

    def runs_on(self, scene: Scene) -> bool:
        return {"": True, "fence": bool(scene.fence_version), "claims": scene.claims}[self.needs]


def needing(needs: str, *actions: Action) -> tuple[Action, ...]:
    return tuple(replace(a, needs=needs) for a in actions)


def act(what: str, attempt: Attempt, *allowed: str) -> Action:
    return Action(what, attempt, frozenset(allowed))


DEADLINE = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T01:00:00Z"
REPAIR_ASKED = f"reboot;{'0' * 10};1;{DEADLINE}"
REPAIR_DONE = f"reboot;{'0' * 10};1;done;{LATER};rebooted"
REPAIR_QUESTION = {"attempt": 1, "action": "reset-gpu", "since": DEADLINE}


def system_pod(body: dict[str, Any]) -> Attempt:
    """A change to a pod in kube-system."""
    return lambda c, s: c.patch(Pod, s.system_pod, body, namespace="kube-system", dry_run=True)


def tenant_pod(body: dict[str, Any], pod: str = "job-0") -> Attempt:
    """A change to a tenant's GPU pod (evict-0: the one already asked to checkpoint)."""
    return lambda c, s: c.patch(Pod, pod, body, namespace=s.tenant, dry_run=True)


def node_change(body: dict[str, Any], node: str = "own") -> Attempt:
    """A change to a GPU node by any route: the object, else its status (the agent's
    only route). Allowed if either route takes it; refused only if both refuse."""

    def attempt(c: Client, s: Scene) -> str:
        name = s.node(node)
        before = c.get(Node, name)
        try:
            after = patch(c, name, body)
        except ApiError as err:
            if err.status.code != 403:
                raise
            after = patch(c, name, body, status=True)
        return effect(body, before, after)

    return attempt


def status_change(body: dict[str, Any], node: str = "own") -> Attempt:
    def attempt(c: Client, s: Scene) -> str:
        name = s.node(node)
        before = c.get(Node, name)
        return effect(body, before, patch(c, name, body, status=True))

    return attempt


def essence(node: Node) -> tuple[Any, ...]:
    """What a change to a node can be about (not its heartbeats or versions)."""
    meta, spec, status = node.metadata, node.spec, node.status
    assert meta is not None and status is not None
    conditions = sorted((c.type, c.status) for c in status.conditions or [])
    return (meta.labels, meta.annotations, meta.finalizers, spec, status.capacity,
            status.allocatable, status.addresses, conditions)  # fmt: skip


def effect(body: dict[str, Any], before: Node, after: Node) -> str:
    """allowed: the node would say what was asked; no effect: the API server took
    the request and dropped the change (status sent to the object, spec sent to
    the status); partly: some of it would stick."""
    if applied(body, after.to_dict()):
        return "allowed"
    return "partly" if essence(before) != essence(after) else "no effect"


Taints = list[dict[str, str]]


def taint_change(
    change: Callable[[Taints], Taints],
    node: str = "own",
    *,
    unschedulable: bool | None = None,
    **meta: Any,
) -> Attempt:
    """Write the node's taint list as `change` makes it of the list read now (as the
    controller and `maintenance` do), with the resourceVersion as precondition;
    `unschedulable`: the cordon too, in the same write."""

    def attempt(c: Client, s: Scene) -> str:
        name = s.node(node)
        for _ in range(CONFLICT_RETRIES):  # kwok writes the node too
            current = c.get(Node, name)
            assert current.metadata is not None
            taints = [
                {"key": t.key, "effect": t.effect, **({"value": t.value} if t.value else {})}
                for t in (current.spec.taints if current.spec else None) or []
            ]
            metadata = {"resourceVersion": current.metadata.resourceVersion, **meta}
            spec: dict[str, Any] = {"taints": change(taints)}
            if unschedulable is not None:
                spec["unschedulable"] = unschedulable
            body = {"metadata": metadata, "spec": spec}
            try:
                return str(node_change(body, node)(c, s))
            except ApiError as err:
                if err.status.code != 409:
                    raise
        raise AssertionError(f"node {name} kept changing")

    return attempt


def condition(type_: str, status: str) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": type_, "status": status, "reason": "Test"}]}}


def xid_event(namespace: str, node: str) -> dict[str, Any]:
    """The Event the controller writes on a GPU pod whose application got an Xid
    (gpuheal/controller/observed_xids.py): in the tenant's namespace."""
    return event_body(
        pod_ref(namespace, "job-0"),
        reason=Reason.APPLICATION_XID,
        note=f"Xid 13 (XidApplication13) of node {node}: not a node fault",
        action="Observe",
        warning=True,
        related=node_ref(node),
        instance="matrix",
        now=dt.datetime.now(dt.UTC),
    )


def canary_pod(namespace: str, node: str) -> dict[str, Any]:
    """A canary as the controller's executor writes it (device_health defaults)."""
    health = Config().device_health
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": unique("gpuheal-canary"),
            "namespace": namespace,
            "labels": {CANARY_LABEL: "true"},
            "annotations": {"gpuheal.io/fault-record": "r"},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": 300,
            "automountServiceAccountToken": False,
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists"}],
            "containers": [
                {
                    "name": "canary",
                    "image": health.canary_image,
                    "command": list(health.canary_command),
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def validation_job(namespace: str, node: str) -> dict[str, Any]:
    """A validation Job as the controller's executor writes it (healthGate.validation defaults)."""
    config = Config()
    validation = replace(config.health_gate.validation, namespace=namespace)
    config = replace(config, health_gate=replace(config.health_gate, validation=validation))
    name = unique("gpuheal-validate")
    return job_manifest(CreateValidationJob(node, "", name, "r", "nvidia.com/gpu", 8), config)


def privileged_job(namespace: str, node: str) -> dict[str, Any]:
    """A Job whose pod is host root on a node (what a stolen Job-create is for)."""
    job = validation_job(namespace, node)
    job["spec"]["template"]["spec"] = privileged_pod(namespace, node)["spec"]
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    return job


def privileged_pod(namespace: str, node: str) -> dict[str, Any]:
    """What a stolen pod-create permission is for: host root on a node."""
    pod = canary_pod(namespace, node)
    spec = pod["spec"]
    spec["hostPID"] = True
    spec["volumes"] = [{"name": "host", "hostPath": {"path": "/"}}]
    spec["containers"][0].update(
        image=EVIL_IMAGE,
        securityContext={"privileged": True},
        volumeMounts=[{"name": "host", "mountPath": "/host"}],
    )
    return pod


# DeviceTaintRule at each version an API server may serve it (1.36: v1beta2 where
# turned on; 1.37: v1; before 1.36: none).
RULES: dict[str, Any] = {"v1": DeviceTaintRuleV1, "v1beta2": DeviceTaintRule}


def served_rule_version(kube: Client) -> str:
    for version, kind in RULES.items():
        if _served(partial(kube.list, kind)):
            return version
    return ""


def _served(listing: Callable[[], Any]) -> bool:
    """Whether the API server serves what `listing` lists: a group version it does not
    know answers a bare 404 (lightkube then raises httpx's error, not ApiError)."""
    try:
        list(listing())
    except (ApiError, httpx2.HTTPStatusError) as err:
        code = err.status.code if isinstance(err, ApiError) else err.response.status_code
        if code != 404:
            raise
        return False
    return True


def device_rules(kube: Client, node: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """gpuheal's fence and a site's rule, created where DeviceTaintRules are served:
    the version, and the two."""
    version = served_rule_version(kube)
    fence, foreign_rule = our_fence(node, version), site_rule(node, version)
    for rule in (fence, foreign_rule) if version else ():
        kube.create(codecs.from_dict(rule))
    return version, fence, foreign_rule


def drop_rules(kube: Client, version: str, *rules: dict[str, Any]) -> None:
    for rule in rules if version else ():
        with contextlib.suppress(ApiError):
            kube.delete(RULES[version], rule["metadata"]["name"])


def claims_served(kube: Client) -> bool:
    return _served(lambda: kube.list(ResourceClaim, namespace="default"))


def our_fence(node: str, version: str = "v1beta2", **change: Any) -> dict[str, Any]:
    """gpuheal's fence of gpu-3 on `node`, as the controller builds it; `change`:
    its spec's deviceSelector or taint replaced, or its metadata (an attempt to
    fence more, or otherwise, than the policy lets the controller)."""
    record = unique("fault")
    rule = device_taint_rule(
        node=node, record=record, fault_id="xid-79", reason="XidCritical79",
        device=DeviceKey(DRA_DRIVER, node, "gpu-3"), version=version or "v1beta2",
    )  # fmt: skip
    for key, value in change.items():
        (rule["metadata"] if key in ("name", "labels") else rule["spec"])[key] = value
    return rule


def site_rule(node: str, version: str = "v1beta2") -> dict[str, Any]:
    """A rule of the site's own (a person fencing a card for a reason of theirs)."""
    rule = our_fence(node, version, name=unique("site-fence"), labels={})
    rule["spec"]["taint"] = {"key": "example.com/broken", "effect": "NoSchedule"}
    return rule


def create_rule(make: Callable[[Scene], dict[str, Any]]) -> Attempt:
    return lambda c, s: c.create(codecs.from_dict(make(s)), dry_run=True)


def canary_claim_in(namespace: Callable[[Scene], str]) -> Attempt:
    def attempt(c: Client, s: Scene) -> None:
        device = DraDevice(DeviceKey(DRA_DRIVER, s.own, "gpu-3"), s.own, "GPU-5c1e0f27", "gpu")
        body = writes.canary_claim(
            unique("gpuheal-canary"), namespace(s), "r", device, "gpu.nvidia.com"
        )
        c.create(codecs.from_dict(body), dry_run=True)

    return attempt


def create(make: Callable[[Scene], Any]) -> Attempt:
    return lambda c, s: c.create(make(s), dry_run=True)


def evict(c: Client, s: Scene) -> None:
    body = Pod.Eviction(metadata=ObjectMeta(name="evict-0", namespace=s.tenant))
    c.create(body, name="evict-0", namespace=s.tenant, dry_run=True)


def bind_cluster_admin(s: Scene) -> Any:
    return ClusterRoleBinding.from_dict(
        {
            "metadata": {"name": unique("evil")},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "ops", "namespace": s.system}],
        }
    )


def whoami(c: Client) -> str:
    review = c.create(SelfSubjectReview())
    assert review.status is not None and review.status.userInfo is not None
    return str(review.status.userInfo.username)


def answer_plan(c: Client, s: Scene, by: str | None = None) -> Any:
    """`gpuheal approve`'s write: status.approval, in the caller's name unless `by`."""
    approval = {"decision": "approved", "by": by or whoami(c), "at": DEADLINE}
    body = {"status": {"approval": approval}}
    return c.patch(GPUFault.Status, s.fault, body, patch_type=PatchType.MERGE, dry_run=True)


def answer_repair(c: Client, s: Scene, by: str | None = None, **question: Any) -> Any:
    """`gpuheal approve`'s write on a repair awaiting approval: the answer of
    status.repairApproval, in the caller's name unless `by` (`question`: changes to it)."""
    answer = {"decision": "approved", "by": by or whoami(c), "at": DEADLINE} | question
    body = {"status": {"repairApproval": {"attempt": 1} | answer}}
    return c.patch(GPUFault.Status, s.repairing, body, patch_type=PatchType.MERGE, dry_run=True)


def release_fault(c: Client, s: Scene, by: str | None = None) -> Any:
    """`gpuheal release`'s write: status.release, in the caller's name unless `by`."""
    body = {"status": {"release": {"by": by or whoami(c), "at": DEADLINE}}}
    return c.patch(GPUFault.Status, s.held, body, patch_type=PatchType.MERGE, dry_run=True)


EVERYTHING = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
TIER = "node-restriction.kubernetes.io/tier"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
EVIL_TAINT = {"key": "example.com/evil", "effect": "NoExecute"}
FAULT_TAINT = {"key": TAINT_KEY, "value": "xid-79", "effect": "NoSchedule"}
MAINTENANCE_TAINT = {"key": MAINTENANCE_TAINT_KEY, "effect": "NoSchedule"}
SWEEP_FENCE = {"key": SWEEP_TAINT, "effect": "NoSchedule"}
SWEEP_MARK = '{"job": "gpuheal-sweep-0123456789-1796674018", "started": "2026-12-07T20:06:58Z"}'
CRD = "gpufaults.gpuheal.io"
REPORT = {"metadata": {"annotations": {STATUS: "faulty", FAULT_ID: "xid-79"}}}
REPORT |= condition(GPU_HEALTHY_CONDITION, "False")
MGMT = ("controller", "operator-view", "operator")

ACTIONS: tuple[Action, ...] = (
    # -- pods --------------------------------------------------------------------------
    act("pod: change the image (kube-system)",
        system_pod({"spec": {"containers": [{"name": "main", "image": EVIL_IMAGE}]}})),
    act("pod: relabel (kube-system)", system_pod({"metadata": {"labels": {"app": "evil"}}})),
    act("pod: another annotation",
        tenant_pod({"metadata": {"annotations": {"example.com/owner": "evil"}}})),
    act("pod: add a finalizer", tenant_pod({"metadata": {"finalizers": ["example.com/hold"]}})),
    act("pod: request a checkpoint (gpuheal.io/checkpoint-requested)",
        tenant_pod({"metadata": {"annotations": {CHECKPOINT_REQUESTED: DEADLINE}}}),
        "controller"),
    act("pod: move the deadline of a checkpoint request",
        tenant_pod({"metadata": {"annotations": {CHECKPOINT_REQUESTED: LATER}}}, "evict-0")),
    act("pod: take back a checkpoint request",
        tenant_pod({"metadata": {"annotations": {CHECKPOINT_REQUESTED: None}}}, "evict-0")),
    act("pod: create in a tenant namespace",
        create(lambda s: codecs.from_dict(gpu_pod(unique("p"), s.tenant, node_name=s.own)))),
    act("pod: create a privileged hostPath pod (release namespace)",
        create(lambda s: codecs.from_dict(privileged_pod(s.system, s.own)))),
    act("pod: create a canary (release namespace)",
        create(lambda s: codecs.from_dict(canary_pod(s.system, s.own))), "controller"),
    act("job: create a validation Job (release namespace)",
        create(lambda s: codecs.from_dict(validation_job(s.system, s.own))), "controller"),
    act("job: create a privileged hostPath Job (release namespace)",
        create(lambda s: codecs.from_dict(privileged_job(s.system, s.own)))),
    act("job: create in a tenant namespace",
        create(lambda s: codecs.from_dict(validation_job(s.tenant, s.own)))),
    act("pod: delete in a tenant namespace",
        lambda c, s: c.delete(Pod, "job-0", namespace=s.tenant, dry_run=True)),
    act("pod: delete a non-canary (release namespace)",
        lambda c, s: c.delete(Pod, s.bystander, namespace=s.system, dry_run=True)),
    act("pod: evict a GPU pod", evict, "controller"),
    act("pod: list", lambda c, s: list(c.list(Pod, namespace=s.tenant)), *MGMT),
    act("event: about a tenant's GPU pod (an application's Xid)",
        create(lambda s: codecs.from_dict(xid_event(s.tenant, s.own))), "controller"),
    act("event: delete (tenant namespace)",
        lambda c, s: c.delete(EventsV1Event, s.event, namespace=s.tenant, dry_run=True)),
    # -- nodes -------------------------------------------------------------------------
    act("node: get", lambda c, s: c.get(Node, s.own), *IDENTITIES),
    act(f"node: label {TIER}=secure", node_change({"metadata": {"labels": {TIER: "secure"}}})),
    act(f"node: label {CONTROL_PLANE}", node_change({"metadata": {"labels": {CONTROL_PLANE: ""}}})),
    act("node: remove its pool label", node_change({"metadata": {"labels": {POOL_LABEL: None}}})),
    act(f"node: label {MANAGED_LABEL}=false (opt out)",
        node_change({"metadata": {"labels": {MANAGED_LABEL: "false"}}})),
    act("node: add a foreign NoExecute taint", taint_change(lambda ts: [*ts, EVIL_TAINT])),
    act("node: remove a foreign taint",
        taint_change(lambda ts: [t for t in ts if t["key"] != FOREIGN_TAINT["key"]])),
    act("node: add a finalizer", node_change({"metadata": {"finalizers": ["example.com/hold"]}})),
    act("node: another annotation",
        node_change({"metadata": {"annotations": {"example.com/owner": "evil"}}})),
    act("node: status.capacity nvidia.com/gpu=64",
        node_change({"status": {"capacity": {"nvidia.com/gpu": "64"}}})),
    act("node: status.allocatable nvidia.com/gpu=64",
        node_change({"status": {"allocatable": {"nvidia.com/gpu": "64"}}})),
    act("node: status.addresses",
        node_change({"status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}})),
    act("node: another condition (Ready=False)", status_change(condition("Ready", "False"))),
    act("node: cordon", node_change({"spec": {"unschedulable": True}})),
    act("node: delete", lambda c, s: c.delete(Node, s.own, dry_run=True)),
    act("node: the agent's report, own node (GPUHealthy, gpuheal.io/status)",
        status_change(REPORT), "agent"),
    act("node: the agent's report, another node", status_change(REPORT, "other")),
    act("node: the fault taint and state label",
        taint_change(lambda ts: [*ts, FAULT_TAINT], labels={STATE_LABEL: "quarantined"}),
        "controller"),
    act("node: lift the fault taint",
        taint_change(lambda ts: [t for t in ts if t["key"] != TAINT_KEY], "other"), "controller"),
    act("node: the idle-node check's fence and mark, a node it manages",
        taint_change(lambda ts: [*ts, SWEEP_FENCE], annotations={SWEEP: SWEEP_MARK}),
        "controller"),
    act("node: the idle-node check's fence, a node gpuheal does not manage",
        taint_change(lambda ts: [*ts, SWEEP_FENCE], "infra")),
    act("node: the idle-node check's fence, a GPU node opted out",
        taint_change(lambda ts: [*ts, SWEEP_FENCE], "opted")),
    act("node: the controller's annotations (handled-*)",
        node_change({"metadata": {"annotations": {HANDLED_FAULT_ID: "x", HANDLED_AT: DEADLINE}}}),
        "controller"),
    act("node: request a repair (gpuheal.io/repair-request)",
        node_change({"metadata": {"annotations": {REPAIR_REQUEST: REPAIR_ASKED}}}), "controller"),
    act("node: the disruption guard (autoscalers leave the node alone)",
        node_change({"metadata": {"annotations": dict.fromkeys(DISRUPTION_KEYS, "true")
                                  | {DISRUPTION_GUARD: ",".join(DISRUPTION_KEYS)}}}),
        "controller"),
    act("node: an autoscaler's annotation set to other than true",
        node_change({"metadata": {"annotations": {SCALE_DOWN_DISABLED: "false"}}})),
    act("node: another cluster-autoscaler annotation",
        node_change({"metadata": {"annotations": {
            "cluster-autoscaler.kubernetes.io/scale-down-unneeded-time": "1m"}}})),
    act("node: answer a repair (gpuheal.io/repair-result), own node",
        node_change({"metadata": {"annotations": {REPAIR_RESULT: REPAIR_DONE}}}), "agent"),
    act("node: answer a repair, another node",
        node_change({"metadata": {"annotations": {REPAIR_RESULT: REPAIR_DONE}}}, "other")),
    act("node: the maintenance label, taint, annotations and cordon of a roll-out's node",
        taint_change(lambda ts: [*ts, MAINTENANCE_TAINT], labels={STATE_LABEL: "maintenance"},
                     annotations={MAINTENANCE_REASON: "drivers", MAINTENANCE_ROLLOUT: "r"},
                     unschedulable=True),
        "controller"),
    act("node: request maintenance (gpuheal.io/maintenance-request)",
        node_change({"metadata": {"annotations": {MAINTENANCE_REQUEST: MAINTENANCE_ASKED}}}),
        "operator"),
    act("node: record a maintenance request's progress",
        node_change({"metadata": {"annotations": {MAINTENANCE_PROGRESS: "{}"}}}), "controller"),
    act("node: the maintenance label, taint and annotations, no roll-out",
        taint_change(lambda ts: [*ts, MAINTENANCE_TAINT], labels={STATE_LABEL: "maintenance"},
                     annotations={MAINTENANCE_REASON: "drivers"})),
    # Issue 41: a node without GPUs, outside the nodeSelector, with a request on it.
    act("node: request maintenance of a node gpuheal does not manage (no GPUs)",
        node_change({"metadata": {"annotations": {MAINTENANCE_REQUEST: MAINTENANCE_ASKED_AGAIN}}},
                    "infra")),
    act("node: request maintenance of a GPU node opted out (gpuheal.io/managed=false)",
        node_change({"metadata": {"annotations": {MAINTENANCE_REQUEST: MAINTENANCE_ASKED_AGAIN}}},
                    "opted")),
    act("node: withdraw the maintenance request of a node gpuheal does not manage",
        node_change({"metadata": {"annotations": {MAINTENANCE_REQUEST: None}}}, "infra"),
        "operator", "controller"),
    act("node: take out a node gpuheal does not manage, as its request asks",
        taint_change(lambda ts: [*ts, MAINTENANCE_TAINT], "infra",
                     labels={STATE_LABEL: "maintenance"},
                     annotations={MAINTENANCE_REASON: "drivers", MAINTENANCE_REQUEST: None},
                     unschedulable=True)),
    act("node: take out a GPU node opted out (gpuheal.io/managed=false), as its request asks",
        taint_change(lambda ts: [*ts, MAINTENANCE_TAINT], "opted",
                     labels={STATE_LABEL: "maintenance"},
                     annotations={MAINTENANCE_REASON: "drivers", MAINTENANCE_REQUEST: None},
                     unschedulable=True)),
    act("node: the maintenance marks and cordon of a roll-out, a node gpuheal does not manage",
        taint_change(lambda ts: [*ts, MAINTENANCE_TAINT], "infra",
                     labels={STATE_LABEL: "maintenance"},
                     annotations={MAINTENANCE_REASON: "drivers", MAINTENANCE_ROLLOUT: "r"},
                     unschedulable=True)),
    act("node: refuse the request on a node gpuheal does not manage (its record, the request "
        "removed)",
        node_change({"metadata": {"annotations": {MAINTENANCE_PROGRESS: "{}",
                                                  MAINTENANCE_REQUEST: None}}}, "infra"),
        "controller"),
    # -- the cluster -------------------------------------------------------------------
    act("secrets: list (release namespace)",
        lambda c, s: list(c.list(Secret, namespace=s.system))),
    act("secrets: get the API token",
        lambda c, s: c.get(Secret, s.role("api-token"), namespace=s.system)),
    act("secrets: list (kube-system)", lambda c, s: list(c.list(Secret, namespace="kube-system"))),
    act("serviceaccounts: mint a token for the controller",
        lambda c, s: token_for(c, s.system, s.role("controller"))),
    act("rbac: bind cluster-admin", create(bind_cluster_admin)),
    act("rbac: create a ClusterRole with *",
        create(lambda s: ClusterRole.from_dict({"metadata": {"name": unique("evil")},
                                                "rules": EVERYTHING}))),
    act("rbac: widen the operator ClusterRole",
        lambda c, s: c.patch(ClusterRole, s.role("operator"), {"rules": EVERYTHING},
                             patch_type=PatchType.MERGE, dry_run=True)),
    act(f"crd: patch {CRD}",
        lambda c, s: c.patch(CustomResourceDefinition, CRD, {"metadata": {"labels": {"x": "y"}}},
                             dry_run=True)),
    act(f"crd: delete {CRD}", lambda c, s: c.delete(CustomResourceDefinition, CRD, dry_run=True)),
    act("policy: delete the agent's ValidatingAdmissionPolicy",
        lambda c, s: c.delete(ValidatingAdmissionPolicy, s.role("agent-own-node"), dry_run=True)),
    act("policy: delete its binding",
        lambda c, s: c.delete(ValidatingAdmissionPolicyBinding, s.role("agent-own-node"),
                              dry_run=True)),
    act("policy: change the operator's node policy",
        lambda c, s: c.patch(ValidatingAdmissionPolicy, s.role("operator-nodes"),
                             {"spec": {"validations": [{"expression": "true"}]}},
                             patch_type=PatchType.MERGE, dry_run=True)),
    act("namespaces: create",
        create(lambda s: Namespace(metadata=ObjectMeta(name=unique("evil"))))),
    act("gpufaults: list", lambda c, s: list(c.list(GPUFault)), *MGMT),
    act("gpufaults: create",
        create(lambda s: fault_record(unique("fault"), s.own)),
        "controller"),
    act("gpufaults: delete", lambda c, s: c.delete(GPUFault, s.fault, dry_run=True)),
    act("gpufaults: answer a plan awaiting approval (as oneself)", answer_plan,
        "controller", "operator"),
    act("gpufaults: release a held fault (as oneself)", release_fault,
        "controller", "operator"),
    act("gpufaults: answer a repair awaiting approval (as oneself)", answer_repair,
        "controller", "operator"),
    act("gpufaults: change a record's phase",
        lambda c, s: c.patch(GPUFault.Status, s.fault, {"status": {"phase": "Resolved"}},
                             patch_type=PatchType.MERGE, dry_run=True),
        "controller"),
    act("gpufaults: delete a closed one (retention)",
        lambda c, s: c.delete(GPUFault, s.closed, dry_run=True),
        "controller"),
    act("gpurollouts: list", lambda c, s: list(c.list(GPURollout)), *MGMT),
    act("gpurollouts: create (rollout start)",
        create(lambda s: rollout_object(unique("rollout"), s.tenant)), "operator"),
    act("gpurollouts: write the status (the leader drives; pause, resume, abort)",
        lambda c, s: c.patch(GPURollout.Status, s.rollout, {"status": {"phase": "Paused"}},
                             patch_type=PatchType.MERGE, dry_run=True),
        "controller", "operator"),
    act("gpurollouts: change the spec",
        lambda c, s: c.patch(GPURollout, s.rollout, {"spec": {"maxUnavailable": 50}},
                             patch_type=PatchType.MERGE, dry_run=True)),
    act("gpurollouts: delete a finished one",
        lambda c, s: c.delete(GPURollout, s.rollout, dry_run=True), "operator"),
    # -- DRA: the device fence and a DRA device's canary claim --------------------------
    *needing("fence",
        act("devicetaintrules: create gpuheal's fence of one device (NoSchedule)",
            create_rule(lambda s: our_fence(s.own, s.fence_version)), "controller"),
        act("devicetaintrules: create a fence of every device of a driver (no pool, no device)",
            create_rule(lambda s: our_fence(s.own, s.fence_version,
                                            deviceSelector={"driver": DRA_DRIVER}))),
        act("devicetaintrules: create a fence with another taint key",
            create_rule(lambda s: our_fence(
                s.own, s.fence_version, taint={"key": "example.com/x", "effect": "NoSchedule"}))),
        act("devicetaintrules: create a NoExecute fence (NoSchedule configured)",
            create_rule(lambda s: our_fence(
                s.own, s.fence_version,
                taint={"key": TAINT_KEY, "value": "x", "effect": "NoExecute"}))),
        act("devicetaintrules: create a rule that is not gpuheal's (name, label)",
            create_rule(lambda s: site_rule(s.own, s.fence_version))),
        act("devicetaintrules: delete gpuheal's fence",
            lambda c, s: c.delete(RULES[s.fence_version], s.fence, dry_run=True), "controller"),
        act("devicetaintrules: delete the site's own rule",
            lambda c, s: c.delete(RULES[s.fence_version], s.foreign_rule, dry_run=True)),
        act("devicetaintrules: list (the fences; doctor, gate, status)",
            lambda c, s: list(c.list(RULES[s.fence_version])), *MGMT),
    ),
    *needing("claims",
        act("resourceslices: list (the GPUs DRA offers; doctor, gate, status)",
            lambda c, s: list(c.list(ResourceSlice)), *MGMT),
        act("resourceclaims: create a canary's claim (release namespace)",
            canary_claim_in(lambda s: s.system), "controller"),
        act("resourceclaims: create in a tenant namespace",
            canary_claim_in(lambda s: s.tenant)),
    ),
    # -- CRDs: the controller reads its own two (is the schema this version's?) --
    act("crds: get gpufaults.gpuheal.io",
        lambda c, s: c.get(CustomResourceDefinition, "gpufaults.gpuheal.io"), "controller"),
    act("crds: list", lambda c, s: list(c.list(CustomResourceDefinition))),
    act("crds: change gpufaults.gpuheal.io",
        lambda c, s: c.patch(CustomResourceDefinition, "gpufaults.gpuheal.io",
                             {"metadata": {"labels": {"evil": "1"}}},
                             patch_type=PatchType.MERGE, dry_run=True)),
    act("crds: delete gpurollouts.gpuheal.io",
        lambda c, s: c.delete(CustomResourceDefinition, "gpurollouts.gpuheal.io",
                              dry_run=True)),
)  # fmt: skip


def outcome(action: Action, client: Client, s: Scene) -> str:
    """refused: 403; else what the node changes say (effect), or allowed."""
    try:
        said = action.attempt(client, s)
    except ApiError as err:
        if err.status.code == 403:
            return "refused"
        return f"error {err.status.code}: {err.status.message}"
    return said if said in ("no effect", "partly") else "allowed"


def table(rows: list[tuple[str, dict[str, str]]]) -> str:
    head = ["action", *IDENTITIES, "canary"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for what, cells in rows:
        lines.append("| " + " | ".join([what, *(cells[i] for i in IDENTITIES), "no token"]) + " |")
    return "\n".join(lines)


def expected(action: Action, who: str, got: str) -> str:
    """What `who` must get: allowed for its job; else refused, or no effect."""
    if who in action.allowed:
        return "allowed"
    return got if got in ("refused", "no effect") else "refused"


def test_every_identity_is_refused_every_dangerous_change_and_allowed_its_job(
    kube: Client, scene: Scene
) -> None:
    # The requests on the nodes gpuheal does not manage, as an operator leaves them (a
    # controller run by another test of this module refuses them, removing them).
    for node in (scene.infra, scene.opted):
        annotate(kube, node, {MAINTENANCE_REQUEST: MAINTENANCE_ASKED})
    seen: list[tuple[str, dict[str, str]]] = []
    wrong: list[str] = []
    runs = [a for a in ACTIONS if a.runs_on(scene)]
    for action in runs:
        cells: dict[str, str] = {}
        for who in IDENTITIES:
            got = outcome(action, scene.clients[who], scene)
            want = expected(action, who, got)
            cells[who] = got if got == want else f"**{got.upper()}** (want {want})"
            if got != want:
                wrong.append(f"{who}: {action.what}: {got}, want {want}")
        seen.append((action.what, cells))
    matrix = table(seen)
    print(f"\n{matrix}\n")
    assert not wrong, "\n".join(wrong)
    doc = DOC.read_text()
    if len(runs) == len(ACTIONS):
        assert matrix in doc, f"docs/security.md must carry the matrix:\n{matrix}"
    else:  # an older Kubernetes without some DRA API: the rows it can run, as documented
        missing = [row for row in matrix.splitlines()[2:] if row not in doc]
        assert not missing, f"docs/security.md must carry these rows:\n{missing}"


# -- the findings, one regression test each ------------------------------------------


def test_the_operator_role_cannot_change_a_pod(kube: Client, scene: Scene) -> None:
    """Maintenance is the controller's to carry out: the operator role asks no pod to
    checkpoint, and changes nothing else of one either."""
    ops = scene.clients["operator"]

    def change(body: dict[str, Any]) -> Callable[[], Any]:
        return lambda: ops.patch(Pod, scene.system_pod, body, namespace="kube-system")

    image = {"spec": {"containers": [{"name": "main", "image": EVIL_IMAGE}]}}
    assert forbidden(change(image))
    assert forbidden(change({"metadata": {"labels": {"app": "evil"}}}))
    assert forbidden(change({"metadata": {"annotations": {CHECKPOINT_REQUESTED: DEADLINE}}}))
    pod = kube.get(Pod, scene.system_pod, namespace="kube-system")
    assert pod.spec is not None and pod.spec.containers[0].image != EVIL_IMAGE
    assert pod.metadata is not None and pod.metadata.labels == {"app": "sys-agent"}
    assert CHECKPOINT_REQUESTED not in (pod.metadata.annotations or {})


def test_the_controller_may_only_add_a_checkpoint_request_to_a_pod(
    kube: Client, scene: Scene
) -> None:
    ctl = scene.clients["controller"]

    def change(body: dict[str, Any]) -> Callable[[], Any]:
        return lambda: ctl.patch(Pod, scene.system_pod, body, namespace="kube-system")

    def annotations() -> dict[str, str]:
        meta = kube.get(Pod, scene.system_pod, namespace="kube-system").metadata
        assert meta is not None
        return dict(meta.annotations or {})

    image = {"spec": {"containers": [{"name": "main", "image": EVIL_IMAGE}]}}
    assert forbidden(change(image))
    assert forbidden(change({"metadata": {"labels": {"app": "evil"}}}))
    assert forbidden(change({"metadata": {"annotations": {"example.com/owner": "evil"}}}))
    assert forbidden(change({"metadata": {"annotations": {CHECKPOINT_REQUESTED: "now; evil"}}}))
    assert forbidden(change({"metadata": {"finalizers": ["example.com/hold"]}}))
    assert CHECKPOINT_REQUESTED not in annotations()
    try:
        # Its job, as the executor writes it (guarded by the pod's resourceVersion).
        meta = kube.get(Pod, scene.system_pod, namespace="kube-system").metadata
        assert meta is not None
        ask = {"resourceVersion": meta.resourceVersion,
               "annotations": {CHECKPOINT_REQUESTED: DEADLINE}}  # fmt: skip
        change({"metadata": ask})()
        assert annotations()[CHECKPOINT_REQUESTED] == DEADLINE
        # Once made, the request stands: neither moved nor taken back.
        assert forbidden(change({"metadata": {"annotations": {CHECKPOINT_REQUESTED: LATER}}}))
        assert forbidden(change({"metadata": {"annotations": {CHECKPOINT_REQUESTED: None}}}))
        assert annotations()[CHECKPOINT_REQUESTED] == DEADLINE
    finally:
        taken_back = {"metadata": {"annotations": {CHECKPOINT_REQUESTED: None}}}
        kube.patch(Pod, scene.system_pod, taken_back, namespace="kube-system")


AGENT_ABUSES: dict[str, dict[str, Any]] = {
    "tier label": {"metadata": {"labels": {"node-restriction.kubernetes.io/tier": "secure"}}},
    "control-plane label": {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}},
    "pool label removed": {"metadata": {"labels": {POOL_LABEL: None}}},
    "managed=false": {"metadata": {"labels": {MANAGED_LABEL: "false"}}},
    "finalizer": {"metadata": {"finalizers": ["example.com/hold"]}},
    "capacity 64": {"status": {"capacity": {"nvidia.com/gpu": "64"}}},
    "addresses": {"status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}},
    "controller's annotation": {"metadata": {"annotations": {HANDLED_FAULT_ID: "forged"}}},
}


@pytest.mark.parametrize("abuse", sorted(AGENT_ABUSES))
def test_the_agent_cannot_change_its_node_beyond_its_report(
    kube: Client, scene: Scene, abuse: str
) -> None:
    agent = scene.clients["agent"]
    before = kube.get(Node, scene.own)
    body = AGENT_ABUSES[abuse]
    assert forbidden(lambda: agent.patch(Node.Status, scene.own, body, patch_type=PatchType.MERGE))
    after = kube.get(Node, scene.own)
    assert after.metadata is not None and before.metadata is not None
    assert after.metadata.labels == before.metadata.labels
    assert after.metadata.finalizers == before.metadata.finalizers
    assert after.status is not None and before.status is not None
    assert after.status.capacity == before.status.capacity
    assert after.status.addresses == before.status.addresses


# -- the jobs, done by the programs with the chart's tokens -----------------------------


def test_the_real_agent_reports_with_its_token_under_the_policy(
    kube: Client, scene: Scene, tmp_path: Path
) -> None:
    """Everything the agent writes (verdict, facts, condition, the fault) passes."""
    host = dgx_h100(tmp_path / "host")  # the start-order facts too
    host.write("/proc/4242/cgroup", "0::/system.slice/dcgm.service\n")
    settings = {**host.agent_config(), "processReportSeconds": 0.5}
    agent = AgentProcess(tmp_path, scene.kubeconfigs["agent"], scene.own, settings)
    agent.set_spec(cudaDriverVersion=12040)
    agent.set_device(1, processes=[{"pid": 4242}])
    agent.start()
    try:

        def annotations() -> dict[str, str]:
            meta = kube.get(Node, scene.own).metadata
            return dict((meta.annotations if meta else None) or {})

        wait_for("the facts", lambda: set(FACT_KEYS) - {LAST_GPU_ERROR} <= set(annotations()))
        agent.kernel("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.")
        wait_for("the fault", lambda: annotations().get(STATUS) == "faulty")
        assert set(FAULT_KEYS) | set(FACT_KEYS) <= set(annotations())
        status = kube.get(Node, scene.own).status
        assert status is not None
        (gpu,) = [c for c in status.conditions or [] if c.type == GPU_HEALTHY_CONDITION]
        assert gpu.status == "False"
        assert not refusals(agent.log())
    finally:
        agent.stop()


def report_devices(kube: Client, namespace: str, pod: str, health: str) -> None:
    """The kubelet's device health report for the pod's one GPU (pods/status)."""
    current = kube.get(Pod, pod, namespace=namespace)
    assert current.status is not None and current.status.containerStatuses
    statuses = [s.to_dict() for s in current.status.containerStatuses]
    resources = [{"resourceID": "GPU-00000000-1111-2222-3333-444444444444", "health": health}]
    statuses[0]["allocatedResourcesStatus"] = [{"name": "nvidia.com/gpu", "resources": resources}]
    body = {"status": {"containerStatuses": statuses}}
    kube.patch(Pod.Status, pod, body, namespace=namespace, patch_type=PatchType.MERGE)


def test_the_controller_runs_its_canaries_with_its_token_and_they_carry_none(
    kube: Client,
    scene: Scene,
    tmp_path: Path,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
) -> None:
    """A device's quarantine, canary and release with the chart's controller token:
    the canary the executor writes passes the canary policy, is deleted after it
    passed, and has no credential (the canary column of the matrix)."""
    (node,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_pod("job-0", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)
    report_devices(kube, namespace, "job-0", "Healthy")
    rendered = scene.release.find("ConfigMap", scene.role("controller"))
    config = yaml.safe_load(rendered["data"]["config.yaml"])
    token = tmp_path / "api-token"
    token.write_text("t")
    # The chart starts in observe (issue 16's staged roll-out); the canary is full mode's.
    config.update(nodeSelector=pool, apiTokenFile=str(token), recoveryWindowSeconds=1, mode="full",
                  breakerMaxPercent=100, rateLimitPerSecond=100, rateLimitBurst=100)  # fmt: skip
    config["deviceHealth"].update(
        quarantineSeconds=3, observationSeconds=1, canaryTimeoutSeconds=60
    )
    kubeconfig = scene.kubeconfigs["controller"]
    controller = ControllerProcess(tmp_path, kubeconfig, config, identity="canary").start()
    try:
        controller.wait_leading()
        report_devices(kube, namespace, "job-0", "Unhealthy")
        wait_for("job-0 evicted", lambda: not list(kube.list(Pod, namespace=namespace)))
        apply(kube, gpu_pod("job-1", namespace, node_name=node))
        wait_pods_running(kube, namespace, count=1)
        report_devices(kube, namespace, "job-1", "Healthy")

        def canaries(phase: str = "") -> list[Pod]:
            pods = kube.list(Pod, namespace=scene.system, labels={CANARY_LABEL: "true"})
            return [
                p
                for p in pods
                if p.spec and p.spec.nodeName == node and p.metadata
                and not p.metadata.deletionTimestamp
                and (not phase or (p.status is not None and p.status.phase == phase))
            ]  # fmt: skip

        (canary,) = wait_for("a running canary", lambda: canaries("Running"))
        assert canary.spec is not None and canary.metadata is not None
        assert canary.spec.automountServiceAccountToken is False
        assert not canary.spec.volumes  # no projected service-account token
        assert canary.spec.serviceAccountName == "default"
        assert not any(c.volumeMounts for c in canary.spec.containers)
        # What the kubelet writes when the canary's container exits 0.
        passed = {"status": {"phase": "Succeeded"}}
        name = str(canary.metadata.name)
        kube.patch(Pod.Status, name, passed, namespace=scene.system, patch_type=PatchType.MERGE)
        wait_for("the canary deleted", lambda: not canaries())
        assert not refusals(controller.log())
    finally:
        controller.stop()


def test_the_policies_name_exactly_the_keys_the_code_writes(scene: Scene) -> None:
    def value(policy: str, variable: str) -> Any:
        spec = scene.release.find("ValidatingAdmissionPolicy", scene.role(policy))["spec"]
        (var,) = [v for v in spec["variables"] if v["name"] == variable]
        return yaml.safe_load(var["expression"])

    def keys(policy: str, variable: str = "annotationKeys") -> set[str]:
        return set(value(policy, variable))

    assert keys("agent-own-node") == {*FAULT_KEYS, *FACT_KEYS, REPAIR_RESULT}
    assert keys("controller-nodes") == {
        HANDLED_FAULT_ID, HANDLED_AT, LAST_PROCESS_TIME,
        QUARANTINED_DEVICES, SUSPECT_DEVICES, UNKNOWN_DEVICES, REPAIR_REQUEST,
        DISRUPTION_GUARD, *DISRUPTION_KEYS, MAINTENANCE_PROGRESS, SWEEP,
    }  # fmt: skip
    assert keys("operator-nodes") == {MAINTENANCE_REQUEST, DIAGNOSTICS}
    # On a node it takes out (a GPURollout's, a maintenance request's) the leader writes
    # what maintenance writes and removes the request (controller/rollouts.py, maintenance.py).
    assert keys("controller-nodes", "maintenanceKeys") == {
        *MAINTENANCE_ANNOTATIONS, MAINTENANCE_REQUEST,
    }  # fmt: skip
    # Maintenance only on a node the controller manages (policy/nodes.py::managed): the
    # nodeSelector of the ConfigMap the chart writes, the GPU resources of the code.
    rendered = scene.release.find("ConfigMap", scene.role("controller"))["data"]["config.yaml"]
    assert value("controller-nodes", "nodeSelector") == yaml.safe_load(rendered)["nodeSelector"]
    resources = Config().gpu_resources
    assert keys("controller-nodes", "gpuResourceNames") == {r for r in resources if r[-1] != "*"}
    assert keys("controller-nodes", "gpuResourcePrefixes") == {
        r[:-1] for r in resources if r[-1] == "*"
    }
    spec = scene.release.find("ValidatingAdmissionPolicy", scene.role("controller-pods"))["spec"]
    (var,) = [v for v in spec["variables"] if v["name"] == "key"]
    assert yaml.safe_load(var["expression"]) == CHECKPOINT_REQUESTED
    canaries = scene.release.find("ValidatingAdmissionPolicy", scene.role("controller-canaries"))
    variables = {v["name"]: yaml.safe_load(v["expression"]) for v in canaries["spec"]["variables"]}
    health = Config().device_health
    assert variables == {"image": health.canary_image, "command": list(health.canary_command)}
    jobs = scene.release.find("ValidatingAdmissionPolicy", scene.role("controller-validations"))
    (images,) = [v for v in jobs["spec"]["variables"] if v["name"] == "images"]
    assert yaml.safe_load(images["expression"]) == [Config().health_gate.validation.image]


def test_the_operator_role_answers_a_plan_only_in_its_own_name_and_only_that(
    kube: Client, scene: Scene
) -> None:
    ops = scene.clients["operator"]
    assert forbidden(lambda: answer_plan(ops, scene, by="someone-else@example.com"))
    both = {"status": {"phase": "Drained", "approval": {"decision": "approved",
                       "by": whoami(ops), "at": DEADLINE}}}  # fmt: skip
    assert forbidden(
        lambda: ops.patch(GPUFault.Status, scene.fault, both, patch_type=PatchType.MERGE)
    )
    answer_plan(ops, scene)  # its job, as itself (dry run)
    # A record not awaiting approval takes no answer.
    pending = kube.get(GPUFault, scene.fault)
    kube.patch(GPUFault.Status, scene.fault, {"status": {"phase": "Resolved"}},
               patch_type=PatchType.MERGE)  # fmt: skip
    try:
        assert forbidden(lambda: answer_plan(ops, scene))
    finally:
        phase = (pending.get("status") or {}).get("phase")
        kube.patch(GPUFault.Status, scene.fault, {"status": {"phase": phase}},
                   patch_type=PatchType.MERGE)  # fmt: skip


def test_the_operator_role_answers_a_repair_only_in_its_own_name_only_while_asked_and_once(
    kube: Client, scene: Scene
) -> None:
    ops = scene.clients["operator"]
    assert forbidden(lambda: answer_repair(ops, scene, by="someone-else@example.com"))
    # The question is the controller's: not another attempt, action or time.
    assert forbidden(lambda: answer_repair(ops, scene, attempt=2))
    assert forbidden(lambda: answer_repair(ops, scene, action="reboot"))
    assert forbidden(lambda: answer_repair(ops, scene, since=LATER))
    # Nor the phase with it.
    answer = {"attempt": 1, "decision": "approved", "by": whoami(ops), "at": DEADLINE}
    both = {"status": {"phase": "Resolved", "repairApproval": answer}}
    assert forbidden(
        lambda: ops.patch(GPUFault.Status, scene.repairing, both, patch_type=PatchType.MERGE)
    )
    answer_repair(ops, scene)  # its job, as itself (dry run)

    # Not where no repair is asked (the open fault awaits the approval of its plan) ...
    def answer_unasked() -> Any:
        body = {"status": {"repairApproval": answer | {"action": "reset-gpu", "since": DEADLINE}}}
        return ops.patch(GPUFault.Status, scene.fault, body, patch_type=PatchType.MERGE,
                         dry_run=True)  # fmt: skip

    assert forbidden(answer_unasked)
    # ... nor a second time: an answer already there stays as it is.
    first = {"status": {"repairApproval": {"decision": "rejected", "by": "night-oncall",
                                           "at": DEADLINE}}}  # fmt: skip
    kube.patch(GPUFault.Status, scene.repairing, first, patch_type=PatchType.MERGE)
    try:
        assert forbidden(lambda: answer_repair(ops, scene))
    finally:
        kube.patch(GPUFault.Status, scene.repairing,
                   {"status": {"repairApproval": {"decision": None, "by": None, "at": None}}},
                   patch_type=PatchType.MERGE)  # fmt: skip


def test_the_operator_role_releases_a_held_fault_only_in_its_own_name_and_only_once(
    kube: Client, scene: Scene
) -> None:
    ops = scene.clients["operator"]
    assert forbidden(lambda: release_fault(ops, scene, by="someone-else@example.com"))
    both = {"status": {"phase": "Quarantined", "release": {"by": whoami(ops), "at": DEADLINE}}}
    assert forbidden(
        lambda: ops.patch(GPUFault.Status, scene.held, both, patch_type=PatchType.MERGE)
    )
    # Nor a release and an answer in one write: the answer's own rule refuses it.
    approval = {"decision": "approved", "by": whoami(ops), "at": DEADLINE}
    with_answer = {"status": {"release": {"by": whoami(ops), "at": DEADLINE},
                              "approval": approval}}  # fmt: skip
    assert forbidden(
        lambda: ops.patch(GPUFault.Status, scene.held, with_answer, patch_type=PatchType.MERGE)
    )
    release_fault(ops, scene)  # its job, as itself (dry run)

    # Not on a record that is not held (the open fault awaits approval) ...
    def release_pending() -> Any:
        body = {"status": {"release": {"by": whoami(ops), "at": DEADLINE}}}
        return ops.patch(GPUFault.Status, scene.fault, body, patch_type=PatchType.MERGE,
                         dry_run=True)  # fmt: skip

    assert forbidden(release_pending)
    # ... nor a second time: a release already there stays as it is.
    first = {"status": {"release": {"by": "night-oncall", "at": DEADLINE}}}
    kube.patch(GPUFault.Status, scene.held, first, patch_type=PatchType.MERGE)
    try:
        assert forbidden(lambda: release_fault(ops, scene))
    finally:
        kube.patch(GPUFault.Status, scene.held, {"status": {"release": None}},
                   patch_type=PatchType.MERGE)  # fmt: skip


def test_the_operator_starts_a_roll_out_the_controller_drives_it_the_view_role_only_reads(
    kube: Client, scene: Scene, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpuheal rollout` end to end with the chart's tokens, under its RBAC and
    admission policies: the operator creates the roll-out; the controller, with its
    own token, takes the node out, sees the change, gates it and gives it back,
    refused nothing; the view role reads the roll-out and can start none."""
    pool = unique("rolled")
    (node,) = eks_node_names(1)
    create_gpu_nodes(kube, [node], labels={POOL_LABEL: pool})
    config = tmp_path / "gpuheal.yaml"
    config.write_text(yaml.safe_dump({"nodeSelector": {POOL_LABEL: pool},
                                      "pools": {"label": POOL_LABEL}}))  # fmt: skip
    rendered = scene.release.find("ConfigMap", scene.role("controller"))
    controller_config = yaml.safe_load(rendered["data"]["config.yaml"])
    token = tmp_path / "api-token"
    token.write_text("t")
    controller_config.update(
        nodeSelector={POOL_LABEL: pool}, pools={"label": POOL_LABEL}, apiTokenFile=str(token),
        rollouts={"pollSeconds": 0.2}, maintenance={"checkpoint": "none"},
    )  # fmt: skip
    controller = ControllerProcess(
        tmp_path, scene.kubeconfigs["controller"], controller_config, identity="rolling"
    )
    stop = threading.Event()

    def tooling() -> None:  # installs the driver once the node is in maintenance
        while not stop.wait(0.1):
            meta = kube.get(Node, node).metadata
            if meta is not None and (meta.labels or {}).get(STATE_LABEL) == "maintenance":
                patch_body = {"metadata": {"annotations": {DRIVER_VERSION: "560.35.03"}}}
                kube.patch(Node, node, patch_body, patch_type=PatchType.MERGE)
                return

    def gpuheal(who: str, *args: str) -> int:
        capsys.readouterr()
        kubeconfig = str(scene.kubeconfigs[who])
        return main([*args, "--kubeconfig", kubeconfig, "--config", str(config)])

    try:
        wait_nodes_ready(kube, [node])
        patch_body = {"metadata": {"annotations": {DRIVER_VERSION: "550.54.15"}}}
        kube.patch(Node, node, patch_body, patch_type=PatchType.MERGE)
        controller.start()
        controller.wait_leading()
        start = ("rollout", "start", pool, "--driver-version", "560.35.03", "--reason", "r")
        assert gpuheal("operator-view", *start) == 1
        assert "the API server refused" in capsys.readouterr().err
        helper = threading.Thread(target=tooling, daemon=True)
        helper.start()
        assert gpuheal("operator", *start, "--poll", "0.2", "--gate-timeout", "5") == 0
        assert gpuheal("operator-view", "rollout", "status", pool, "-o", "json") == 0
        assert '"phase": "Completed"' in capsys.readouterr().out
        node_now = kube.get(Node, node)
        assert node_now.metadata is not None and node_now.spec is not None
        assert STATE_LABEL not in (node_now.metadata.labels or {})
        assert not node_now.spec.unschedulable
        assert not refusals(controller.log())
    finally:
        stop.set()
        controller.stop()
        with contextlib.suppress(ApiError):
            kube.delete(GPURollout, rollout_name(pool))
        delete_nodes(kube, [node])


def test_the_operator_cannot_have_the_controller_take_out_a_node_gpuheal_does_not_manage(
    kube: Client, scene: Scene, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 41 with the chart's identities: on a node without GPUs (outside the
    nodeSelector) `gpuheal maintenance start` with the operator's token is refused
    before it writes, and the request written anyway with that token is refused by
    the chart's admission policy; one written by another route is refused by the
    controller, with its own token: recorded done with exit 2 and why, a Warning
    Event, and nothing else changed; the controller's refusal passes its admission
    policy (the matrix: it may take out no such node)."""
    infra = unique("infra")
    kube.create(codecs.from_dict(plain_node(infra)))
    rendered = scene.release.find("ConfigMap", scene.role("controller"))
    config = yaml.safe_load(rendered["data"]["config.yaml"])
    token = tmp_path / "api-token"
    token.write_text("t")
    # A selector of none of this control plane's nodes: this controller minds only
    # maintenance requests (and the chart's admission policy, its own nodeSelector).
    config.update(nodeSelector={POOL_LABEL: unique("none")}, apiTokenFile=str(token),
                  maintenance={"pollSeconds": 0.2})  # fmt: skip
    config_file = tmp_path / "gpuheal.yaml"
    config_file.write_text(yaml.safe_dump(config))
    controller = ControllerProcess(
        tmp_path, scene.kubeconfigs["controller"], config, identity="refusing"
    )
    ops = scene.clients["operator"]

    def node() -> Node:
        return kube.get(Node, infra)

    try:
        wait_nodes_ready(kube, [infra])
        # Settled: the node lifecycle controller has lifted its not-ready taint.
        wait_for("the node settled", lambda: not (node().spec or NodeSpec()).taints)
        before = essence(node())
        capsys.readouterr()
        kubeconfig = str(scene.kubeconfigs["operator"])
        argv = ["maintenance", "start", infra, "--reason", "x", "--no-wait",
                "--kubeconfig", kubeconfig, "--config", str(config_file)]  # fmt: skip
        assert main(argv) == 2
        said = " ".join(capsys.readouterr().err.split())
        assert f"node {infra} is not managed by gpuheal: the controller's nodeSelector" in said
        meta = node().metadata
        assert meta is not None and MAINTENANCE_REQUEST not in (meta.annotations or {})
        asked = {"metadata": {"annotations": {MAINTENANCE_REQUEST: MAINTENANCE_ASKED}}}
        # Written around the CLI with the operator's token: its admission policy refuses.
        with pytest.raises(ApiError) as written:
            ops.patch(Node, infra, asked)
        assert written.value.status.code == 403
        assert "so it takes no maintenance request" in str(written.value.status.message)
        # Written by another route (an administrator; or before the node left the
        # selector): the controller refuses it.
        kube.patch(Node, infra, asked)
        controller.start()
        controller.wait_leading()

        def refused() -> dict[str, Any] | None:
            annotations = node().metadata.annotations or {}  # type: ignore[union-attr]
            record = annotations.get(MAINTENANCE_PROGRESS)
            if record is None or MAINTENANCE_REQUEST in annotations:
                return None
            return dict(json.loads(record))

        record = wait_for("the controller's refusal", refused)
        assert record is not None and record["state"] == "done" and record["code"] == 2, record
        assert "is not managed by gpuheal" in record["report"]["error"]
        events = events_for(kube, infra, Reason.MAINTENANCE_REFUSED, at_least=1)
        assert len(events) == 1 and events[0].type == "Warning"
        # Only its annotations changed (the record): labels, finalizers, the spec (no
        # taint, no cordon) as they were.
        after = essence(node())
        assert (after[0], *after[2:4]) == (before[0], *before[2:4])
        assert not refusals(controller.log())
    finally:
        controller.stop()
        delete_nodes(kube, [infra])


def test_with_no_node_selector_the_controller_takes_out_only_nodes_with_gpu_capacity(
    kube: Client, control_plane: ControlPlane, scene: Scene, tmp_path: Path
) -> None:
    """Every platform but gpu-operator has `nodeSelector: {}`: a node is managed when it
    has GPU capacity (gpuResources), and the controller's node policy judges so too.
    With a request on each, it may take out a GPU node, not the node without GPUs."""
    asked: dict[str, str | None] = {MAINTENANCE_REQUEST: MAINTENANCE_ASKED}
    with installed(kube, control_plane, sets={"platform": "eks"}) as release:
        account = f"{release.name}-controller"
        _, ctl = as_token(
            control_plane, tmp_path, token_for(kube, release.namespace, account), "eks"
        )
        for node in (scene.own, scene.infra):
            annotate(kube, node, asked)
        try:
            take_out = {
                node: taint_change(lambda ts: [*ts, MAINTENANCE_TAINT], node,
                                   labels={STATE_LABEL: "maintenance"},
                                   annotations={MAINTENANCE_REASON: "drivers",
                                                MAINTENANCE_REQUEST: None},
                                   unschedulable=True)
                for node in ("own", "infra")
            }  # fmt: skip
            # Its RBAC in effect (allowed), then its policy (the node without GPUs refused).
            wait_for("its role", lambda: outcome(act("", take_out["own"]), ctl, scene) == "allowed")
            assert settled(lambda: take_out["infra"](ctl, scene))
            assert take_out["own"](ctl, scene) == "allowed"
        finally:
            annotate(kube, scene.own, {MAINTENANCE_REQUEST: None})
