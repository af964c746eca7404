"""`gpuheal maintenance start/finish` and `gpuheal gate` on the real control plane
with kwok GPU nodes, the requests carried out by a real controller: drains that
wait on PodDisruptionBudgets and name them while the CLI waits, the health gate
refusing and then passing, and the controller's fault handling leaving
maintenance alone."""

from __future__ import annotations

import http.server
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Node, NodeStatus, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget

from gpuheal.cli import main
from gpuheal.model import (
    CHECKPOINT_DONE,
    CHECKPOINT_REQUESTED,
    COUNTERS_SINCE,
    DRIVER_VERSION,
    ECC_ERRORS,
    MAINTENANCE_BASELINE,
    MAINTENANCE_CORDONED,
    MAINTENANCE_PROGRESS,
    MAINTENANCE_REASON,
    MAINTENANCE_REQUEST,
    MAINTENANCE_SINCE,
    MAINTENANCE_TAINT_KEY,
    MANAGED_LABEL,
    STATE_LABEL,
    TAINT_KEY,
    XID_ERRORS,
)
from gpuheal.policy.maintenancewire import MaintenanceRequest, Progress, State, Verb, parse_progress
from gpuheal.sim import ControlPlane
from gpuheal.sim.audit import evictions, offset, requests
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.nodes import delete_nodes, plain_node, wait_nodes_ready
from gpuheal.sim.workloads import (
    apply,
    gpu_deployment,
    gpu_pod,
    pod_disruption_budget,
    wait_pods_running,
)
from tests.helpers import FakeNodes, unique, wait_for
from tests.integration.conftest import (
    Cli,
    StartController,
    annotate,
    clear_fault,
    controller_config,
    events_for,
    faults_of,
    in_process_cli,
    our_taint,
    report_fault,
)

REPO = Path(__file__).resolve().parents[2]
POOL_LABEL = "gpuheal.test/pool"  # the `pool` fixture's label (integration/conftest.py)


@pytest.fixture
def settings(pool: dict[str, str]) -> dict[str, Any]:
    """The controller's config (and the CLI's): this test's nodes are the GPU nodes,
    and its pool label the pool."""
    config = controller_config(pool, pools={"label": POOL_LABEL})
    config["maintenance"] = {"evictionRetrySeconds": 0.5, "pollSeconds": 0.2}
    return config


@pytest.fixture
def config_file(tmp_path: Path, settings: dict[str, Any]) -> Path:
    path = tmp_path / "gpuheal.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


@pytest.fixture
def controller(start_controller: StartController, settings: dict[str, Any]) -> ControllerProcess:
    """The leader that carries out the maintenance requests."""
    return start_controller(settings).wait_leading()


class Background:
    """`gpuheal ...` in a child process, its stderr collected as it comes (so a
    test can act while the command waits)."""

    def __init__(self, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "240"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpuheal.cli", *args],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.err: list[str] = []
        self.out: list[str] = []
        # One reader per pipe, to the end: what the command says last is kept too.
        self._readers = [
            threading.Thread(target=self._read, args=(pipe, into), daemon=True)
            for pipe, into in ((self.process.stderr, self.err), (self.process.stdout, self.out))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe: Any, into: list[str]) -> None:
        for line in pipe:
            into.append(line)

    def stderr(self) -> str:
        return "".join(self.err)

    def wait(self, timeout_s: float) -> tuple[int, str]:
        self.process.wait(timeout=timeout_s)
        for reader in self._readers:
            reader.join(5)
        return self.process.returncode, "".join(self.out)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


@pytest.fixture
def background() -> Iterator[Callable[[list[str]], Background]]:
    started: list[Background] = []

    def start(args: list[str]) -> Background:
        started.append(Background(args))
        return started[-1]

    yield start
    for b in started:
        b.kill()


def node_of(kube: Client, name: str) -> Node:
    return kube.get(Node, name)


def taint_keys(node: Node) -> set[str]:
    return {t.key for t in (node.spec.taints if node.spec else None) or ()}


def set_allocatable(kube: Client, node: str, gpus: int) -> None:
    """What the kubelet reports when the device plugin sees fewer GPUs."""
    kube.patch(NodeStatus, node, {"status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}})


def cordon(kube: Client, node: str, on: bool) -> None:
    kube.patch(Node, node, {"spec": {"unschedulable": on}})


def live_pods(kube: Client, namespace: str, labels: dict[str, str] | None = None) -> list[Pod]:
    return [
        p
        for p in kube.list(Pod, namespace=namespace, labels=dict(labels or {}))
        if p.metadata and not p.metadata.deletionTimestamp
    ]


def where(pods: list[Pod]) -> set[str]:
    return {p.spec.nodeName for p in pods if p.spec and p.spec.nodeName}


def daemonset(name: str, namespace: str, node: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"operator": "Exists"}],
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "agent", "image": "registry.invalid/agent:1"}],
                },
            },
        },
    }


def test_round_trip_drain_waits_on_the_pdb_then_completes_and_finish_returns_the_node(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    config_file: Path,
    cli: Cli,
    background: Callable[[list[str]], Background],
    controller: ControllerProcess,
) -> None:
    target, spare = fake_gpu_nodes(2, labels=pool)
    cordon(kube, spare, True)  # the workload starts on the target
    apply(kube, gpu_deployment("train", namespace, replicas=2, node_selector=pool))
    apply(kube, daemonset("node-agent", namespace, target))
    wait_pods_running(kube, namespace, count=2, labels={"app": "train"})
    wait_pods_running(kube, namespace, count=1, labels={"app": "node-agent"})
    apply(
        kube,
        pod_disruption_budget("train", namespace, match_labels={"app": "train"}, min_available=2),
    )
    wait_for(
        "the PDB's status",
        lambda: (
            (s := kube.get(PodDisruptionBudget, "train", namespace=namespace).status)
            and s.currentHealthy == 2
        ),
    )
    cordon(kube, spare, False)

    run = background(
        [
            "maintenance", "start", target, "--reason", "driver upgrade to 550",
            "--checkpoint", "none", "--timeout", "120", "-o", "json",
            "--kubeconfig", str(control_plane.kubeconfig), "--config", str(config_file),
        ]
    )  # fmt: skip
    # The drain waits and says why: the budget, by name and numbers.
    wait_for(
        "the blocker on stderr", lambda: f"PodDisruptionBudget {namespace}/train" in run.stderr()
    )
    assert "allows 0 disruptions: 2 healthy, 2 required" in run.stderr()
    node = node_of(kube, target)
    assert (
        node.metadata
        and node.metadata.labels
        and node.metadata.labels[STATE_LABEL] == "maintenance"
    )
    assert MAINTENANCE_TAINT_KEY in taint_keys(node) and node.spec and node.spec.unschedulable
    assert run.process.poll() is None  # still waiting

    kube.patch(PodDisruptionBudget, "train", {"spec": {"minAvailable": 1}}, namespace=namespace)
    code, out = run.wait(timeout_s=120)
    assert code == 0, run.stderr()
    report = json.loads(out)
    assert report["result"] == "drained" and report["drained"] is True
    assert len(report["evicted"]) == 2
    assert any(
        f"PodDisruptionBudget {namespace}/train" in b["reason"] for b in report["blockersSeen"]
    )
    assert report["blockers"] == []
    assert [s["why"] for s in report["skipped"]] == ["DaemonSet pod"]
    # The workload runs elsewhere; the DaemonSet pod stayed.
    moved = wait_pods_running(kube, namespace, count=2, labels={"app": "train"})
    assert where(moved) == {spare}
    assert where(live_pods(kube, namespace, {"app": "node-agent"})) == {target}
    node = node_of(kube, target)
    annotations = (node.metadata.annotations if node.metadata else None) or {}
    assert annotations[MAINTENANCE_REASON] == "driver upgrade to 550"
    assert annotations[MAINTENANCE_CORDONED] == "true"
    (started,) = events_for(kube, target, "GPUMaintenanceStarted", at_least=1)
    # By the Node's UID: `kubectl describe node` selects an object's Events by it.
    assert started.involvedObject.uid == node.metadata.uid  # type: ignore[union-attr]

    code, out, _ = cli("maintenance", "finish", target, "-o", "json")
    assert code == 0, out
    finished = json.loads(out)
    assert finished["passed"] and finished["finished"]
    node = node_of(kube, target)
    labels = (node.metadata.labels if node.metadata else None) or {}
    annotations = (node.metadata.annotations if node.metadata else None) or {}
    assert STATE_LABEL not in labels
    assert MAINTENANCE_TAINT_KEY not in taint_keys(node)
    assert not any(
        k in annotations for k in (MAINTENANCE_REASON, MAINTENANCE_SINCE, MAINTENANCE_CORDONED)
    )
    assert node.spec is not None and not node.spec.unschedulable
    assert events_for(kube, target, "GPUMaintenanceFinished", at_least=1)
    # Nothing left to finish: a usage error, nothing changed.
    code, _, err = cli("maintenance", "finish", target)
    assert code == 2 and "not in maintenance" in err


def test_a_pod_that_says_its_checkpoint_is_done_ends_the_wait_and_is_drained_at_once(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    config_file: Path,
    background: Callable[[list[str]], Background],
    controller: ControllerProcess,
) -> None:
    (target,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_deployment("train", namespace, replicas=1, node_selector=pool))
    (pod,) = wait_pods_running(kube, namespace, count=1, labels={"app": "train"})
    assert pod.metadata is not None
    name, key = str(pod.metadata.name), f"{namespace}/{pod.metadata.name}"
    wait_s = 240  # past the test's own timeout: only the pod's answer ends the wait
    run = background(
        [
            "maintenance", "start", target, "--reason", "firmware", "--checkpoint-wait",
            str(wait_s), "-o", "json",
            "--kubeconfig", str(control_plane.kubeconfig), "--config", str(config_file),
        ]
    )  # fmt: skip

    def asked() -> bool:
        meta = kube.get(Pod, name, namespace=namespace).metadata
        return bool(meta and CHECKPOINT_REQUESTED in (meta.annotations or {}))

    wait_for("the checkpoint request", asked)
    assert run.process.poll() is None  # waiting for the workload
    said = {"metadata": {"annotations": {CHECKPOINT_DONE: "2026-11-29T12:00:00Z"}}}
    kube.patch(Pod, name, said, namespace=namespace)
    code, out = run.wait(timeout_s=120)
    assert code == 0, run.stderr()
    report = json.loads(out)
    assert report["checkpoint"]["asked"] == [key]
    assert report["checkpoint"]["done"] == [key] and report["checkpoint"]["gone"] == []
    assert report["evicted"] == [key] and report["result"] == "drained"


def test_a_pdb_that_never_allows_times_out_with_the_blocker_in_json_and_table(
    kube: Client,
    namespace: str,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    cli: Cli,
    controller: ControllerProcess,
) -> None:
    (target,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_deployment("serve", namespace, replicas=1, node_selector=pool))
    wait_pods_running(kube, namespace, count=1, labels={"app": "serve"})
    apply(
        kube,
        pod_disruption_budget("serve", namespace, match_labels={"app": "serve"}, max_unavailable=0),
    )

    code, out, err = cli(
        "maintenance", "start", target, "--reason", "bios", "--checkpoint-wait", "1",
        "--timeout", "3", "-o", "json",
    )  # fmt: skip
    assert code == 4, err
    report = json.loads(out)
    assert report["result"] == "timed-out" and report["evicted"] == []
    (blocker,) = report["blockers"]
    assert blocker["pod"].startswith(f"{namespace}/serve-")
    assert f"PodDisruptionBudget {namespace}/serve allows 0 disruptions" in blocker["reason"]
    # The pod was asked to checkpoint (annotate is the default).
    assert report["checkpoint"]["mode"] == "annotate" and report["checkpoint"]["asked"] == [
        blocker["pod"]
    ]
    pod = live_pods(kube, namespace, {"app": "serve"})[0]
    assert pod.metadata and "gpuheal.io/checkpoint-requested" in (pod.metadata.annotations or {})

    # Again, as a table: the same maintenance resumes (start time kept), same blocker,
    # and the pod keeps the deadline it was given first.
    since = (node_of(kube, target).metadata.annotations or {})[MAINTENANCE_SINCE]  # type: ignore[union-attr]
    deadline = pod.metadata.annotations[CHECKPOINT_REQUESTED]  # type: ignore[index]
    time.sleep(1)  # a new deadline would differ
    code, out, _ = cli(
        "maintenance", "start", target, "--reason", "other", "--checkpoint-wait", "0",
        "--timeout", "2",
    )  # fmt: skip
    assert code == 4
    assert "Blocking the drain" in out and f"PodDisruptionBudget {namespace}/serve" in out
    assert "(resumed)" in out and "reason: bios" in out
    assert (node_of(kube, target).metadata.annotations or {})[MAINTENANCE_SINCE] == since  # type: ignore[union-attr]
    again = live_pods(kube, namespace, {"app": "serve"})[0]
    assert again.metadata is not None and again.metadata.annotations is not None
    assert again.metadata.annotations[CHECKPOINT_REQUESTED] == deadline


def test_emptydir_and_bare_pods_stay_unless_their_flags_are_passed(
    kube: Client,
    namespace: str,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    cli: Cli,
    controller: ControllerProcess,
) -> None:
    (target,) = fake_gpu_nodes(1, labels=pool)
    scratch = gpu_deployment("scratch", namespace, replicas=1, node_selector=pool)
    scratch["spec"]["template"]["spec"]["volumes"] = [{"name": "cache", "emptyDir": {}}]
    apply(kube, scratch)
    apply(kube, gpu_pod("bare", namespace, node_name=target))
    wait_pods_running(kube, namespace, count=2)

    code, out, err = cli(
        "maintenance",
        "start",
        target,
        "--reason",
        "x",
        "--checkpoint",
        "none",
        "--timeout",
        "2",
        "-o",
        "json",
    )
    assert code == 4, err
    blockers = {
        b["pod"].split("/")[1].split("-")[0]: b["reason"] for b in json.loads(out)["blockers"]
    }
    assert blockers == {
        "scratch": "local storage: emptyDir volume cache (pass --delete-emptydir-data)",
        "bare": "not managed by a controller (pass --force)",
    }
    assert len(live_pods(kube, namespace)) == 2  # nothing evicted
    assert "pass --delete-emptydir-data" in err  # printed while it waited

    code, out, err = cli(
        "maintenance", "start", target, "--reason", "x", "--checkpoint", "none", "--timeout", "60",
        "--delete-emptydir-data", "--force", "-o", "json",
    )  # fmt: skip
    assert code == 0, err
    evicted = json.loads(out)["evicted"]
    assert f"{namespace}/bare" in evicted and len(evicted) == 2
    assert target not in where(live_pods(kube, namespace))


def test_gate_refuses_short_allocatable_and_passes_once_fixed(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    cli: Cli,
    controller: ControllerProcess,
) -> None:
    (target,) = fake_gpu_nodes(1, labels=pool)
    code, _, err = cli("maintenance", "start", target, "--reason", "swap GPU 3", "--no-drain")
    assert code == 0, err
    set_allocatable(kube, target, 7)

    code, out, _ = cli("gate", target, "-o", "json")
    assert code == 64 | 2
    report = json.loads(out)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"] is False and checks["gpu-count"]["result"] == "fail"
    assert checks["gpu-count"]["reason"] == "7 nvidia.com/gpu allocatable, expected 8"
    assert checks["gpu-count"]["bit"] == 2 and checks["ready"]["result"] == "pass"
    assert not events_for(kube, target, "GPUHealthGateFailed")  # `gate` changes nothing

    code, out, _ = cli("maintenance", "finish", target)
    assert code == 64 | 2
    assert "gpu-count" in out and "7 nvidia.com/gpu allocatable, expected 8" in out
    assert "nothing changed" in out
    wait_for("the gate's Event", lambda: events_for(kube, target, "GPUHealthGateFailed"))
    node = node_of(kube, target)
    assert MAINTENANCE_TAINT_KEY in taint_keys(node) and node.spec and node.spec.unschedulable

    set_allocatable(kube, target, 8)
    code, out, _ = cli("maintenance", "finish", target)
    assert code == 0, out
    assert "passed" in out and "uncordoned" in out
    node = node_of(kube, target)
    assert MAINTENANCE_TAINT_KEY not in taint_keys(node)
    assert node.spec is not None and not node.spec.unschedulable


def test_gate_refuses_driver_drift_and_new_errors(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    cli: Cli,
    controller: ControllerProcess,
) -> None:
    target, a, b = fake_gpu_nodes(3, labels=pool)
    for peer in (a, b):
        annotate(kube, peer, {DRIVER_VERSION: "550.54.15"})
    counters = {XID_ERRORS: "2", ECC_ERRORS: "0", COUNTERS_SINCE: "2020-01-01T00:00:00Z"}
    annotate(kube, target, {DRIVER_VERSION: "535.161.08", **counters})
    cordon(kube, target, True)  # cordoned before maintenance: finish leaves it so
    code, _, err = cli("maintenance", "start", target, "--reason", "driver", "--no-drain")
    assert code == 0, err
    annotations = node_of(kube, target).metadata.annotations or {}  # type: ignore[union-attr]
    assert json.loads(annotations[MAINTENANCE_BASELINE])["xid"] == 2
    assert MAINTENANCE_CORDONED not in annotations

    annotate(kube, target, {XID_ERRORS: "3"})  # an Xid during maintenance
    code, out, _ = cli("maintenance", "finish", target, "-o", "json")
    assert code == 64 | 4 | 8
    failing = {c["name"]: c["reason"] for c in json.loads(out)["checks"] if c["result"] == "fail"}
    assert failing["driver"] == f"driver 535.161.08, but pool {pool[POOL_LABEL]} runs 550.54.15"
    assert "1 new Xid" in failing["gpu-errors"]

    annotate(kube, target, {DRIVER_VERSION: "550.54.15", XID_ERRORS: "2"})
    code, out, _ = cli("maintenance", "finish", target, "-o", "json")
    assert code == 0, out
    assert "left cordoned" in json.loads(out)["outcome"]
    node = node_of(kube, target)
    assert node.spec is not None and node.spec.unschedulable  # not ours to undo


def test_gate_judges_the_device_plugin_pod_on_its_node_only(
    kube: Client, fake_gpu_nodes: FakeNodes, pool: dict[str, str], namespace: str, cli: Cli
) -> None:
    target, other = fake_gpu_nodes(2, labels=pool)
    plugin = {"app": "nvidia-device-plugin-daemonset"}  # the config's default selector

    def device_plugin_check() -> dict[str, Any]:
        code, out, err = cli("gate", target, "-o", "json")
        assert code == 0, err
        return next(c for c in json.loads(out)["checks"] if c["name"] == "device-plugin")

    apply(kube, gpu_pod("plugin-elsewhere", namespace, gpus=0, node_name=other, labels=plugin))
    wait_pods_running(kube, namespace, count=1, labels=plugin)
    assert device_plugin_check()["result"] == "skipped"  # another node's plugin says nothing

    apply(kube, gpu_pod("plugin-here", namespace, gpus=0, node_name=target, labels=plugin))
    wait_for(
        "the gate to see the node's Ready device-plugin pod",
        lambda: (
            device_plugin_check()["reason"] == f"device-plugin pod {namespace}/plugin-here is Ready"
        ),
    )


# Runs `gpuheal` as given, then names the client libraries the process loaded.
_LOADED = """
import sys
from gpuheal.cli import main
code = main(sys.argv[1:])
print(sorted({m.split(".")[0] for m in sys.modules} & {"lightkube", "httpx2", "httpx"}))
sys.exit(code)
"""


def test_a_maintenance_round_trip_loads_no_other_kubernetes_or_http_client(
    control_plane: ControlPlane,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    config_file: Path,
    controller: ControllerProcess,
) -> None:
    """kube/'s client (aiohttp) only: lightkube and httpx2 would be a second client
    stack to keep right (kubeconfig, credentials, proxies) and their import in every
    command. The import contract sees imports written down; this, what is loaded."""
    (target,) = fake_gpu_nodes(1, labels=pool)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    options = ["--kubeconfig", str(control_plane.kubeconfig), "--config", str(config_file)]
    for step in (["start", target, "--reason", "bios", "--no-drain"], ["finish", target]):
        done = subprocess.run(
            [sys.executable, "-c", _LOADED, "maintenance", *step, *options],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "[]", (step, done.stdout)


def test_finish_of_a_missing_node_and_gate_of_a_missing_node_exit_5(cli: Cli) -> None:
    assert cli("gate", "no-such-node")[0] == 5
    assert cli("maintenance", "finish", "no-such-node")[0] == 5
    assert cli("maintenance", "start", "no-such-node", "--reason", "x")[0] == 5


def test_the_controller_ignores_a_faulty_node_in_maintenance_and_its_breaker_does_not_count_it(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    cli: Cli,
    start_controller: StartController,
) -> None:
    resting, faulty = fake_gpu_nodes(2, labels=pool)
    # A budget of one quarantined node: the node in maintenance must not use it up.
    start_controller(controller_config(pool, breakerMaxNodes=1)).wait_leading()
    code, _, err = cli("maintenance", "start", resting, "--reason", "reseat", "--no-drain")
    assert code == 0, err
    report_fault(kube, resting, "maint-xid")
    report_fault(kube, faulty, "real-xid")
    wait_for("the real fault's quarantine", lambda: our_taint(kube, faulty) == "real-xid")
    time.sleep(2)  # the controller has seen the resting node's report by now
    assert our_taint(kube, resting) is None
    assert faults_of(kube, resting) == []
    labels = node_of(kube, resting).metadata.labels or {}  # type: ignore[union-attr]
    assert labels[STATE_LABEL] == "maintenance"
    assert TAINT_KEY not in taint_keys(node_of(kube, resting))


def test_the_controllers_recovery_waits_for_the_gate(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    start_controller(controller_config(pool, recoveryWindowSeconds=1))
    report_fault(kube, node, "f-gate")
    wait_for("the quarantine", lambda: our_taint(kube, node) == "f-gate")
    set_allocatable(kube, node, 6)  # a GPU fell off the bus and did not come back
    clear_fault(kube, node)

    def gate_failed() -> list[dict[str, str]]:
        (record,) = faults_of(kube, node)
        actions = (record.status or {}).get("actions", [])
        return [a for a in actions if a["action"] == "gate-failed"]

    (entry,) = wait_for("the gate's refusal on the record", gate_failed, timeout_s=30)
    assert entry["detail"].startswith("gpu-count: ")
    assert "6 nvidia.com/gpu allocatable, expected 8" in entry["detail"]
    wait_for("its Event", lambda: events_for(kube, node, "GPUHealthGateFailed"))
    time.sleep(2)  # several retries (holdRetrySeconds 0.5): still tainted, noted once
    assert our_taint(kube, node) == "f-gate"
    assert len(gate_failed()) == 1
    assert len(events_for(kube, node, "GPUHealthGateFailed", at_least=1)) == 1

    set_allocatable(kube, node, 8)
    wait_for("the node returned", lambda: our_taint(kube, node) is None, timeout_s=30)
    # The pass writes the record's status after the actions it records.
    wait_for("Resolved", lambda: [r.status["phase"] for r in faults_of(kube, node)] == ["Resolved"])


class _Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.received.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_checkpoint_webhook_is_called_with_the_gpu_pods_and_a_failing_one_only_warns(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    settings: dict[str, Any],
    start_controller: StartController,
) -> None:
    """The controller's config says where the webhook is: it calls it, and says on
    the CLI's stderr (its progress) when the call failed."""
    (target,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_deployment("infer", namespace, replicas=1, node_selector=pool))
    (running,) = wait_pods_running(kube, namespace, count=1, labels={"app": "infer"})
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hook.received.clear()
    url = f"http://127.0.0.1:{server.server_port}/checkpoint"
    config = {**settings}
    config["maintenance"] = {
        **settings["maintenance"], "checkpoint": "webhook", "checkpointWebhookUrl": url,
    }  # fmt: skip
    start_controller(config).wait_leading()

    def start() -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(
            ["maintenance", "start", target, "--reason", "fw", "--checkpoint-wait", "1",
             "--no-drain", "-o", "json", "--kubeconfig", str(control_plane.kubeconfig)]
        )  # fmt: skip
        out, err = capsys.readouterr()
        return code, out, err

    try:
        code, out, err = start()
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, err
    (call,) = _Hook.received
    assert call["node"] == target and call["reason"] == "fw" and call["deadline"]
    assert running.metadata is not None
    assert call["pods"] == [
        {"namespace": namespace, "name": running.metadata.name, "uid": running.metadata.uid}
    ]
    assert json.loads(out)["checkpoint"]["webhook"] == "ok"

    # Nobody listening: a warning, then the wait and the rest as usual.
    code, out, err = start()
    assert code == 0
    assert "checkpoint webhook" in err and "waiting for the GPU pods anyway" in err
    assert json.loads(out)["checkpoint"]["webhook"].startswith("checkpoint webhook")


def test_two_operators_race_one_request_wins_and_a_failover_mid_drain_loses_nothing(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    config_file: Path,
    settings: dict[str, Any],
    start_controller: StartController,
    audited_controller_user: str,
    cli: Cli,
    background: Callable[[list[str]], Background],
) -> None:
    """Two operators start maintenance of one node at once: one request, the other
    refused naming it. The leader is killed while a PodDisruptionBudget holds the
    drain; the standby carries the same request on, and the first operator's wait
    ends with its report: the pod evicted once, the node taken out once."""
    target, spare = fake_gpu_nodes(2, labels=pool)
    cordon(kube, spare, True)  # the workload starts on the target
    apply(kube, gpu_deployment("train", namespace, replicas=1, node_selector=pool))
    wait_pods_running(kube, namespace, count=1, labels={"app": "train"})
    budget = pod_disruption_budget(
        "train", namespace, match_labels={"app": "train"}, min_available=1
    )
    apply(kube, budget)
    cordon(kube, spare, False)
    replicas = [start_controller(settings, user=audited_controller_user) for _ in range(2)]
    leader = wait_for("a leader", lambda: [r for r in replicas if r.leading()], timeout_s=30)[0]
    since = offset(control_plane.audit_log)
    args = ["maintenance", "start", target, "--reason", "bios", "--checkpoint", "none",
            "--timeout", "240", "-o", "json",
            "--kubeconfig", str(control_plane.kubeconfig),
            "--config", str(config_file)]  # fmt: skip
    runs = [background(args), background(args)]
    (refused,) = wait_for(
        "one operator refused", lambda: [r for r in runs if r.process.poll() is not None]
    )
    code, _ = refused.wait(timeout_s=10)
    assert code == 2 and "has a maintenance request pending (start by" in refused.stderr()
    (waiting,) = [r for r in runs if r is not refused]
    wait_for("the drain held by the budget", lambda: "PodDisruptionBudget" in waiting.stderr())
    leader.kill()  # failover mid-drain
    (other,) = [r for r in replicas if r is not leader]
    other.wait_leading()
    kube.patch(PodDisruptionBudget, "train", {"spec": {"minAvailable": 0}}, namespace=namespace)
    code, out = waiting.wait(timeout_s=120)
    assert code == 0, waiting.stderr()
    report = json.loads(out)
    assert report["result"] == "drained" and len(report["evicted"]) == 1
    assert f"taken up by the controller {other.identity}" in waiting.stderr()
    evicted = evictions(
        requests(control_plane.audit_log, user=audited_controller_user, since=since)
    )
    assert [codes.count(201) for codes in evicted.values()] == [1], evicted
    assert len(events_for(kube, target, "GPUMaintenanceStarted", at_least=1)) == 1
    annotations = node_of(kube, target).metadata.annotations or {}  # type: ignore[union-attr]
    assert MAINTENANCE_REQUEST not in annotations


def node_essence(node: Node) -> tuple[Any, ...]:
    """What maintenance could change on a node: labels, taints, the cordon, and the
    annotations but the request and its record."""
    meta, spec = node.metadata, node.spec
    assert meta is not None and spec is not None
    annotations = {
        k: v
        for k, v in (meta.annotations or {}).items()
        if k not in (MAINTENANCE_REQUEST, MAINTENANCE_PROGRESS)
    }
    taints = sorted((t.key, t.effect, t.value or "") for t in spec.taints or ())
    return meta.labels, annotations, taints, bool(spec.unschedulable)


def test_maintenance_of_a_node_gpuheal_does_not_manage_is_refused_and_changes_nothing(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    config_file: Path,
    settings: dict[str, Any],
    start_controller: StartController,
    audited_controller_user: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 41: an infrastructure node (no GPUs, no GPU labels, outside the
    nodeSelector) and a GPU node opted out (gpuheal.io/managed=false). The CLI refuses
    either before writing; a request written anyway (kubectl annotate) is refused by
    the controller: its record says why (exit 2), an Event says it, and nothing else
    on the node changes: no mark, cordon or taint, no pod evicted."""
    (opted,) = fake_gpu_nodes(1, labels={**pool, MANAGED_LABEL: "false"})
    infra = unique("infra")
    kube.create(codecs.from_dict(plain_node(infra)))
    try:
        wait_nodes_ready(kube, [infra])
        for name, node in (("system", infra), ("job", opted)):
            apply(kube, gpu_pod(name, namespace, gpus=0, node_name=node))  # bare: --force moves it
        wait_pods_running(kube, namespace, count=2)
        start_controller(settings, user=audited_controller_user).wait_leading()
        as_audited = in_process_cli(
            control_plane.kubeconfig_for(audited_controller_user), capsys,
            "--config", str(config_file),
        )  # fmt: skip
        why = {
            infra: f"the controller's nodeSelector does not match it (it lacks "
            f"{POOL_LABEL}={pool[POOL_LABEL]})",
            opted: f"it is opted out ({MANAGED_LABEL}=false)",
        }
        for n in why:  # settled: the node lifecycle controller lifted its not-ready taint
            wait_for(f"{n} settled", lambda n=n: not node_essence(node_of(kube, n))[2])  # type: ignore[misc]
        before = {n: node_essence(node_of(kube, n)) for n in why}
        since = offset(control_plane.audit_log)
        for node, reason in why.items():
            code, _, err = as_audited("maintenance", "start", node, "--reason", "x", "--force")
            assert code == 2, err
            assert f"node {node} is not managed by gpuheal: {reason}" in " ".join(err.split())
        # The CLI wrote nothing (its user is audited; the controller had nothing to do).
        written = [r for r in requests(control_plane.audit_log, since=since)
                   if r.verb not in ("get", "list", "watch")]  # fmt: skip
        assert [r for r in written if r.resource != "leases"] == [], written
        for node in why:  # a request written around the CLI
            asked = MaintenanceRequest(
                id=secrets.token_hex(6), verb=Verb.START, by="kubectl", at="2026-12-06T12:00:00Z",
                reason="x", checkpoint="none", force=True,
            )  # fmt: skip
            annotate(kube, node, {MAINTENANCE_REQUEST: asked.encode()})

        def recorded(node: str) -> Progress | None:
            annotations = node_of(kube, node).metadata.annotations or {}  # type: ignore[union-attr]
            progress = parse_progress(annotations.get(MAINTENANCE_PROGRESS))
            done = progress is not None and progress.state is State.DONE
            return progress if done and MAINTENANCE_REQUEST not in annotations else None

        for node, reason in why.items():
            progress = wait_for(f"the refusal on {node}", lambda n=node: recorded(n))  # type: ignore[misc]
            assert progress is not None and progress.code == 2 and progress.verb == "start"
            assert reason in str(progress.report["error"])
            (event,) = events_for(kube, node, "GPUMaintenanceRefused", at_least=1)
            assert event.type == "Warning" and reason in " ".join(str(event.message).split())
            assert node_essence(node_of(kube, node)) == before[node]
        assert {p.metadata.name for p in live_pods(kube, namespace)} == {"system", "job"}  # type: ignore[union-attr]
        # On the API server's side: per node one write, the record (the request gone),
        # and no eviction, cordon, taint or label.
        done = list(requests(control_plane.audit_log, user=audited_controller_user, since=since))
        assert not evictions(iter(done))
        patches = [r for r in done if r.resource == "nodes" and r.verb == "patch"]
        assert sorted(r.name for r in patches) == sorted(why), patches
        for r in patches:
            assert set(r.body) == {"metadata"}, r.body
            assert set(r.body["metadata"]["annotations"]) == {
                MAINTENANCE_PROGRESS,
                MAINTENANCE_REQUEST,
            }
            assert r.body["metadata"]["annotations"][MAINTENANCE_REQUEST] is None
    finally:
        delete_nodes(kube, [infra])
