"""A GPU reset on a node whose GPUs the GPU Operator's daemons hold open, end to end:
the chart installed with agent.gpuReset (its agent config, RBAC and admission
policy), the real agent with its node-bound token over the NVML stand-in, whose
nvidia-smi refuses a reset while any process holds a GPU's device file (as the
driver does: "In use by another client"), and the operator's device plugin and
dcgm-exporter as real DaemonSets selecting the node's deploy labels, their pods
run by kwok, each "container" a process holding the GPUs' device files open.

Xid 95 (NVIDIA: reset the GPU) → quarantine, drain → the controller's request →
the agent pauses the deploy labels, the DaemonSet controller removes the pods, their
processes exit, the agent closes its own NVML session, resets, restores the labels,
new pods come → result → gate → node returned: exactly one reset, one pause and
one restore of each label; again with the controller killed after its request and
the agent killed while the daemons stop. A daemon that never stops fails the
attempt by name within its bound and its label comes back."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.types import PatchType

from gpuheal.model import REPAIR_REQUEST, REPAIR_RESULT, TAINT_KEY
from gpuheal.policy.daemons import PAUSED
from gpuheal.policy.repairwire import Outcome, RepairRequest, decode_result
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes, wait_nodes_ready
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, create_namespace, gpu_pod, wait_pods_running
from gpuheal.xid import Action
from tests.corpus import eks_node_names
from tests.helpers import unique, wait_for
from tests.integration.chart import Release, as_token, forbidden, installed, token_for
from tests.integration.conftest import (
    StartController,
    events_for,
    faults_of,
    our_taint,
    pods_on,
)
from tests.integration.test_repair import XID_95, repair_config
from tests.integration.test_security_matrix import settled

pytestmark = pytest.mark.timeout(300)

T = TypeVar("T")
DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
DCGM_EXPORTER = "nvidia.com/gpu.deploy.dcgm-exporter"
# The GPU Operator's pod labels (gpu-operator's DaemonSets: app=<name>).
DAEMONS = {DEVICE_PLUGIN: "nvidia-device-plugin-daemonset", DCGM_EXPORTER: "nvidia-dcgm-exporter"}


def daemonset(name: str, namespace: str, label: str, pool: dict[str, str]) -> dict[str, Any]:
    """One of the operator's DaemonSets: on nodes whose deploy label is `true`. It
    tolerates gpuheal's quarantine taint, as docs/operations.md#gpu-reset says the
    operator's daemonsets.tolerations must: a paused daemon comes back to a
    quarantined node."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {label: "true", **pool},
                    "tolerations": [
                        {"key": "kwok.x-k8s.io/node", "operator": "Exists"},
                        {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
                    ],
                    "containers": [{"name": name, "image": "nvcr.io/nvidia/" + name}],
                },
            },
        },
    }


class Kubelet:
    """The node's containers of the operator's pods: a process per running pod that
    holds every GPU's device file open, gone when its pod is deleted."""

    def __init__(self, kube: Client, namespace: str, node: str, devices: list[Path]) -> None:
        self.kube, self.namespace, self.node, self.devices = kube, namespace, node, devices
        self.containers: dict[str, subprocess.Popen[bytes]] = {}
        self.started: list[str] = []  # pod uids, in order

    def sync(self) -> None:
        pods = self.kube.list(Pod, namespace=self.namespace, fields={"spec.nodeName": self.node})
        live = {
            p.metadata.uid: p
            for p in pods
            if p.metadata and p.metadata.uid and not p.metadata.deletionTimestamp
            and p.status and p.status.phase == "Running"
        }  # fmt: skip
        for uid in [u for u in self.containers if u not in live]:
            self.containers.pop(uid).kill()
        opens = " ".join(f"exec {3 + i}<'{d}';" for i, d in enumerate(self.devices))
        for uid in live:
            if uid not in self.containers:
                self.containers[uid] = subprocess.Popen(
                    ["/bin/sh", "-c", f"{opens} exec sleep 600"]
                )
                self.started.append(uid)

    def wait(self, what: str, check: Callable[[], T], timeout_s: float = 90) -> T:
        def synced() -> T:
            self.sync()
            return check()

        return wait_for(what, synced, timeout_s)

    def stop(self) -> None:
        for container in self.containers.values():
            container.kill()
            container.wait()


class LabelWrites:
    """Every value the node's deploy labels took, as a watch on the Node sees them
    (kubectl's: a process of its own, and no write between two looks is missed)."""

    def __init__(self, control_plane: ControlPlane, node: str, log: Path) -> None:
        paths = " ".join("{.metadata.labels." + k.replace(".", "\\.") + "}" for k in DAEMONS)
        argv = [str(control_plane.config.binaries.kubectl), "--kubeconfig",
                str(control_plane.kubeconfig), "get", "node", node, "--watch",
                "-o", f"jsonpath={paths}{{\"\\n\"}}"]  # fmt: skip
        self.log = log
        self.out = log.open("w")
        self.process = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT)
        self.seen: dict[str, list[str]] = {}

    def sync(self) -> None:
        self.seen = {k: [] for k in DAEMONS}
        for line in self.log.read_text().splitlines():
            for key, value in zip(DAEMONS, line.split(" "), strict=False):
                if not self.seen[key] or self.seen[key][-1] != value:
                    self.seen[key].append(value)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.out.close()


SLOW_STOP = {"metadata": {"finalizers": ["gpuheal.test/slow-stop"]}}


def daemon_pod(kube: Client, namespace: str, node: str, app: str) -> str:
    """The name of the `app` daemon's pod on the node ("" while it has none)."""
    names = [
        p.metadata.name
        for p in kube.list(Pod, namespace=namespace, fields={"spec.nodeName": node})
        if p.metadata and p.metadata.name and (p.metadata.labels or {}).get("app") == app
        and not p.metadata.deletionTimestamp
    ]  # fmt: skip
    return names[0] if len(names) == 1 else ""


def deleting(kube: Client, namespace: str, name: str) -> bool:
    meta = kube.get(Pod, name, namespace=namespace).metadata
    return bool(meta and meta.deletionTimestamp)


def chart_agent_config(release: Release) -> dict[str, Any]:
    """The agent config the chart renders: its gpuReset keys are what the test runs."""
    configmap = release.find("ConfigMap", f"{release.name}-agent")
    rendered = yaml.safe_load(configmap["data"]["config.yaml"])
    keys = [k for k in rendered if k.startswith("repair")]
    return {k: rendered[k] for k in keys}


@dataclass
class Scene:
    release: Release
    kubeconfig: Path  # the agent's, its token bound to `node`
    agent: Client
    node: str
    other: str  # a second GPU node, not the agent's
    operator: str  # the GPU Operator's namespace


@pytest.fixture
def scene(
    kube: Client,
    control_plane: ControlPlane,
    crds: None,
    pool: dict[str, str],
    tmp_path: Path,
) -> Iterator[Scene]:
    operator = unique("gpu-operator")
    create_namespace(kube, operator)
    node, other = eks_node_names(2)
    sets = {
        "agent.config.repairEnabled": "true",
        "agent.gpuReset.enabled": "true",
        "agent.gpuReset.namespace": operator,
        "agent.gpuReset.timeoutSeconds": "20",
    }
    try:
        with installed(kube, control_plane, sets=sets) as release:
            labels = {**pool, DEVICE_PLUGIN: "true", DCGM_EXPORTER: "true"}
            create_gpu_nodes(kube, [node, other], labels=labels)
            wait_nodes_ready(kube, [node, other])
            for label, name in DAEMONS.items():
                apply(kube, daemonset(name, operator, label, pool))
            token = token_for(kube, release.namespace, f"{release.name}-agent", bound_node=node)
            kubeconfig, client = as_token(control_plane, tmp_path, token, "agent")
            # A new admission policy takes effect within moments: wait for it (dry run).
            probe = {"metadata": {"labels": {"gpuheal.test/probe": "x"}}}
            settled(
                lambda: client.patch(
                    Node.Status, node, probe, patch_type=PatchType.MERGE, dry_run=True
                )
            )
            yield Scene(release, kubeconfig, client, node, other, operator)
    finally:
        delete_nodes(kube, [node, other])
        with contextlib.suppress(ApiError):
            kube.delete(Namespace, operator)


def start_agent(scene: Scene, tmp_path: Path, **more: Any) -> tuple[AgentProcess, list[Path]]:
    settings = {
        **chart_agent_config(scene.release),
        "repairPollSeconds": 0.2,
        **more,
    }
    agent = AgentProcess(tmp_path, scene.kubeconfig, scene.node, settings)
    devices = []
    for i in range(len(agent.spec["devices"])):
        path = agent.dir / "dev" / f"nvidia{i}"
        path.parent.mkdir(exist_ok=True)
        path.touch()
        agent.set_device(i, devicePath=str(path))
        devices.append(path)
    return agent.start(), devices


def result_of(kube: Client, node: str) -> Any:
    meta = kube.get(Node, node).metadata
    return decode_result(((meta.annotations if meta else None) or {}).get(REPAIR_RESULT))


def test_xid_95_pauses_the_operator_s_daemons_resets_once_and_brings_them_back(
    control_plane: ControlPlane,
    kube: Client,
    scene: Scene,
    pool: dict[str, str],
    namespace: str,
    tmp_path: Path,
    start_controller: StartController,
) -> None:
    node = scene.node
    # Killed right after it writes the request: a new one takes over.
    doomed = start_controller(repair_config(pool), env={"GPUHEAL_CRASH_AFTER": "RequestRepair"})
    agent, devices = start_agent(scene, tmp_path)
    kubelet = Kubelet(kube, scene.operator, node, devices)
    labels = LabelWrites(control_plane, node, tmp_path / "labels.log")
    try:
        kubelet.wait("the daemons running", lambda: len(kubelet.containers) == 2)
        first = set(kubelet.containers)
        # The device plugin's pod takes its time to go (a finalizer the test removes):
        # the agent is killed while it waits.
        slow = wait_for(
            "its pod", lambda: daemon_pod(kube, scene.operator, node, DAEMONS[DEVICE_PLUGIN])
        )
        kube.patch(Pod, slow, SLOW_STOP, namespace=scene.operator)
        apply(kube, gpu_pod("train-0", namespace, node_name=node))
        wait_pods_running(kube, namespace, count=1)
        gpu = agent.spec["devices"][0]["uuid"]

        agent.kernel(XID_95)
        kubelet.wait(
            "drained", lambda: our_taint(kube, node) and not pods_on(kube, namespace, node)
        )
        assert doomed.wait_exit(60) == -9, "the controller was not killed after its request"
        start_controller(repair_config(pool))

        def paused() -> bool:
            labels.sync()
            return all(PAUSED in v for v in labels.seen.values())

        kubelet.wait("the deploy labels paused", paused)
        kubelet.wait("the device plugin stopping", lambda: deleting(kube, scene.operator, slow))
        # The agent is killed while the daemons stop, and resumes where it was.
        agent.kill()
        agent.start()
        assert agent.resets() == []  # not while the device plugin's pod is there
        kube.patch(Pod, slow, {"metadata": {"finalizers": None}}, namespace=scene.operator)

        def returned() -> bool:
            labels.sync()
            return our_taint(kube, node) is None

        kubelet.wait("the node returned", returned, timeout_s=120)
        labels.sync()
        assert agent.resets() == [(gpu, "ok")], agent.resets()  # one reset, with no holder
        assert labels.seen == {k: ["true", PAUSED, "true"] for k in DAEMONS}
        result = result_of(kube, node)
        assert result is not None and result.outcome is Outcome.DONE, result
        assert result.detail == f"reset {gpu}; the GPU's daemons are back"
        new = set(kubelet.containers)
        assert len(new) == 2 and not new & set(first)  # fresh pods: a fresh device plugin
        (record,) = faults_of(kube, node)
        actions = (record.status or {}).get("actions", [])
        assert len([a for a in actions if a["action"] == "repair-requested"]) == 1
        assert len(events_for(kube, node, "GPUFaultRepaired", at_least=1)) == 1
        assert "repair step" in agent.log() and "refused" not in agent.log().lower()
    finally:
        labels.stop()
        kubelet.stop()
        agent.stop()
        print(
            "--- agent log ---\n"
            + "\n".join(x for x in agent.log().splitlines() if "repair" in x or "NVML" in x)
        )


def test_a_daemon_that_never_stops_fails_the_reset_by_name_and_its_label_comes_back(
    control_plane: ControlPlane,
    kube: Client,
    scene: Scene,
    pool: dict[str, str],
    tmp_path: Path,
    start_controller: StartController,
) -> None:
    node = scene.node
    agent, devices = start_agent(scene, tmp_path, repairDaemonTimeoutSeconds=3)
    kubelet = Kubelet(kube, scene.operator, node, devices)
    labels = LabelWrites(control_plane, node, tmp_path / "labels.log")
    try:
        kubelet.wait("the daemons running", lambda: len(kubelet.containers) == 2)
        # A dcgm-exporter the operator does not run (a DaemonSet of the site's own, same
        # app label): its deploy label moves nothing and its pod never goes.
        unmanaged = {"spec": {"template": {"spec": {"nodeSelector": {DCGM_EXPORTER: None}}}}}
        kube.patch(DaemonSet, DAEMONS[DCGM_EXPORTER], unmanaged, namespace=scene.operator)

        def replaced() -> str | None:
            for p in kube.list(Pod, namespace=scene.operator, fields={"spec.nodeName": node}):
                spec, meta, status = p.spec, p.metadata, p.status
                if not (meta and spec and status) or meta.deletionTimestamp:
                    continue
                dcgm = (meta.labels or {}).get("app") == DAEMONS[DCGM_EXPORTER]
                unlabelled = DCGM_EXPORTER not in (spec.nodeSelector or {})
                if dcgm and unlabelled and status.phase == "Running":
                    return meta.name
            return None

        name = kubelet.wait("dcgm-exporter without the deploy label", replaced)
        kubelet.wait("its container", lambda: len(kubelet.containers) == 2)
        start_controller(repair_config(pool, resetAttempts=1, rebootAttempts=0))
        agent.kernel(XID_95)

        def failed() -> Any:
            labels.sync()
            result = result_of(kube, node)
            return result if result is not None and result.outcome is Outcome.FAILED else None

        result = kubelet.wait("the reset failed", failed, timeout_s=90)
        assert result.detail.startswith("the GPU's daemons did not stop within 3s: ")
        assert result.detail == (
            f"the GPU's daemons did not stop within 3s: {scene.operator}/{name}; not reset; "
            "the GPU's daemons are back"
        )
        assert agent.resets() == []  # never reset while a daemon held it

        def restored() -> bool:
            labels.sync()
            return all(v[-1] == "true" for v in labels.seen.values())

        kubelet.wait("the labels back", restored)
        assert labels.seen == {k: ["true", PAUSED, "true"] for k in DAEMONS}
        (record,) = faults_of(kube, node)

        def asked_a_person() -> bool:
            status: Any = kube.get(GPUFault, record.metadata.name).status or {}
            return bool(status.get("contactSupport"))

        wait_for("a person asked", asked_a_person)
    finally:
        labels.stop()
        kubelet.stop()
        agent.stop()
        print(
            "--- agent log ---\n"
            + "\n".join(x for x in agent.log().splitlines() if "repair" in x or "NVML" in x)
        )


def test_the_agent_may_move_only_the_deploy_labels_of_its_node_only_as_a_reset_needs(
    kube: Client, scene: Scene
) -> None:
    """The limits of agent.gpuReset's allowance (the chart's admission policy and RBAC),
    tried with the agent's own token: each refused, and the node unchanged."""
    agent, node, other = scene.agent, scene.node, scene.other

    def labels(name: str, changes: dict[str, str | None]) -> Callable[[], Any]:
        body = {"metadata": {"labels": changes}}
        return lambda: agent.patch(Node.Status, name, body, patch_type=PatchType.MERGE)

    def request(name: str, value: str | None) -> None:
        body = {"metadata": {"annotations": {REPAIR_REQUEST: value}}}
        kube.patch(Node, name, body, patch_type=PatchType.MERGE)

    before = kube.get(Node, node).metadata.labels  # type: ignore[union-attr]
    # No reset requested: no pause.
    assert forbidden(labels(node, {DEVICE_PLUGIN: PAUSED}))
    reset = RepairRequest(Action.RESET_GPU, "c46a80fac1", 1, "2026-12-01T09:30:00Z").encode()
    reboot = RepairRequest(Action.REBOOT, "c46a80fac1", 1, "2026-12-01T09:30:00Z").encode()
    request(node, reboot)
    assert forbidden(labels(node, {DEVICE_PLUGIN: PAUSED}))  # a reboot is no reset
    request(node, reset)
    request(other, reset)
    try:
        assert forbidden(labels(other, {DEVICE_PLUGIN: PAUSED}))  # not its node
        assert forbidden(labels(node, {DEVICE_PLUGIN: "false"}))  # only to the paused value
        assert forbidden(labels(node, {DEVICE_PLUGIN: None}))  # never removed
        assert forbidden(labels(node, {"nvidia.com/gpu.deploy.driver": PAUSED}))  # not listed
        assert forbidden(labels(node, {"nvidia.com/gpu.present": "false"}))
        assert forbidden(labels(node, {"gpuheal.test/new": "x"}))
        assert kube.get(Node, node).metadata.labels == before  # type: ignore[union-attr]
        # What a reset needs passes: pause, then back to true.
        labels(node, {DEVICE_PLUGIN: PAUSED})()
        assert forbidden(labels(node, {DEVICE_PLUGIN: "false"}))
        labels(node, {DEVICE_PLUGIN: "true"})()
        assert kube.get(Node, node).metadata.labels == before  # type: ignore[union-attr]
        # Its pods: read in the operator's namespace (the reset waits on them), never
        # deleted without restartPods, never read elsewhere.
        agent.list(Pod, namespace=scene.operator, fields={"spec.nodeName": node})
        pod = wait_for(
            "the device plugin's pod",
            lambda: daemon_pod(kube, scene.operator, node, DAEMONS[DEVICE_PLUGIN]),
        )
        assert forbidden(lambda: agent.delete(Pod, pod, namespace=scene.operator))
        assert forbidden(lambda: list(agent.list(Pod, namespace="kube-system")))
    finally:
        request(node, None)
        request(other, None)
