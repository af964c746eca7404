"""Fixtures for controller tests: the GPUFault CRD, controller processes, a
node pool per test (so a test's controller manages only that test's nodes)."""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from gpuheal.cli import main
from gpuheal.model import FAULT_ID, FAULT_REASON, FAULT_TIME, HANDLED_FAULT_ID, NODE_LABEL, STATUS
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.audit import grant_cluster_admin
from gpuheal.sim.controller import ControllerProcess, install_crds
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, create_namespace, gpu_pod, pod_disruption_budget
from gpuheal.values import node_label
from tests.conftest import AUDITED_CONTROLLER
from tests.helpers import unique, wait_for

StartController = Callable[..., ControllerProcess]
# start_agent(node, config=None, **options) -> a started AgentProcess
StartAgent = Callable[..., AgentProcess]
# `gpuheal ...` run in-process: (exit code, stdout, stderr).
Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="session")
def crds(kube: Client) -> None:
    install_crds(kube)
    try:
        create_namespace(kube, "gpuheal-system")
    except ApiError as err:
        if err.status.code != 409:
            raise


@pytest.fixture
def pool(namespace: str) -> dict[str, str]:
    """A label only this test's nodes carry; the test's controller selects on it."""
    return {"gpuheal.test/pool": namespace}


def controller_config(pool: dict[str, str], **overrides: Any) -> dict[str, Any]:
    """Fast settings for tests: short windows, generous rate limit."""
    config: dict[str, Any] = {
        "nodeSelector": pool,
        "recoveryWindowSeconds": 1,
        "cooldownSeconds": 0,
        "rateLimitPerSecond": 1000,
        "rateLimitBurst": 1000,
        "evictionRetryBaseSeconds": 0.2,
        "evictionRetryMaxSeconds": 1,
        "holdRetrySeconds": 0.5,
        # Test pools are tiny: a percentage cap would hold all but one node.
        "breakerMaxPercent": 100,
        "breakerMaxNodes": 1000,
        "leaderElection": {
            "name": f"gpuheal-{pool['gpuheal.test/pool']}",
            "leaseSeconds": 4,
            "renewDeadlineSeconds": 3,
            "retryPeriodSeconds": 0.5,
        },
    }
    config.update(overrides)
    return config


@pytest.fixture
def start_controller(
    control_plane: ControlPlane, kube: Client, crds: None, tmp_path: Path
) -> Iterator[StartController]:
    """Factory for controller replicas; stops them and removes every GPUFault after
    the test, so the next test's controller starts from a clean slate."""
    started: list[ControllerProcess] = []

    def start(
        config: dict[str, Any],
        identity: str = "",
        user: str = "",
        ready: bool = True,
        **kwargs: Any,
    ) -> ControllerProcess:
        """`user`: the identity it authenticates as (default: the admin); `ready`:
        wait until ready, else only until it answers."""
        process = ControllerProcess(
            tmp_path,
            control_plane.kubeconfig_for(user) if user else control_plane.kubeconfig,
            config,
            identity=identity or unique("ctl"),
            **kwargs,
        )
        started.append(process)
        return process.start(ready=ready)

    yield start
    for process in started:
        process.stop()
        print(f"--- {process.identity} log (tail) ---\n{process.log()[-4000:]}")
    kube.deletecollection(GPUFault)


class _Sink(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.received.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def sink() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local HTTP notification sink: its URL and the JSON bodies it received."""
    received: list[dict[str, Any]] = []
    handler = type("Sink", (_Sink,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", received
    server.shutdown()


def report_fault(kube: Client, node: str, fault_id: str, reason: str = "XidCritical79") -> None:
    """What the agent (or a person with kubectl annotate) writes on a faulty node."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    annotations = {STATUS: "faulty", FAULT_ID: fault_id, FAULT_TIME: now, FAULT_REASON: reason}
    kube.patch(Node, node, {"metadata": {"annotations": annotations}})


def annotate(kube: Client, node: str, annotations: dict[str, str | None]) -> None:
    """Set (a value) or remove (None) annotations of the node."""
    kube.patch(Node, node, {"metadata": {"annotations": annotations}})


def clear_fault(kube: Client, node: str) -> None:
    annotations = {STATUS: None, FAULT_ID: None, FAULT_TIME: None, FAULT_REASON: None}
    kube.patch(Node, node, {"metadata": {"annotations": annotations}})


def our_taint(kube: Client, node: str) -> str | None:
    """The value of the gpuheal taint on the node, or None."""
    taints = kube.get(Node, node).spec.taints or []  # type: ignore[union-attr]
    return next((t.value for t in taints if t.key == "gpuheal.io/gpu-fault"), None)


def events_for(
    kube: Client, name: str, reason: str, *, at_least: int = 0, namespace: str = "default"
) -> list[Event]:
    """The Events about object `name` (cluster-scoped: in "default"; else its
    namespace) with this reason. Events are
    sent behind a queue, after the record they speak of is written: `at_least`
    waits (up to 20 s) until that many are there, so that a test reading them just
    after the record sees them; the caller still asserts the exact count."""

    def listed() -> list[Event]:
        return [
            e
            for e in kube.list(Event, namespace=namespace, fields={"involvedObject.name": name})
            if e.reason == reason
        ]

    if at_least:
        wait_for(
            f"{at_least} {reason} Event(s) about {name}", lambda: len(listed()) >= at_least, 20
        )
    return listed()


def evictions_from(
    kube: Client, node: str, reason: str = "GPUPodEvicted", *, at_least: int = 0
) -> list[Event]:
    """Events about pods moved off `node`: `GPUPodEvicted` regards the Node, one per
    eviction pass naming its pods; a refused eviction (`GPUPodEvictionBlocked`) or a
    deletion regards its Pod (in the pod's namespace, for `kubectl describe pod`)
    and names the node as related. `at_least`: as in events_for."""

    def listed() -> list[Event]:
        return [
            e
            for e in kube.list(Event, namespace="*", fields={"reason": reason})
            if (e.related is not None and e.related.name == node)
            or (e.involvedObject.kind == "Node" and e.involvedObject.name == node)
        ]

    if at_least:
        wait_for(
            f"{at_least} {reason} Event(s) about {node}", lambda: len(listed()) >= at_least, 20
        )
    return listed()


def pods_told_evicted(kube: Client, node: str, *, at_least: int = 0) -> list[str]:
    """Every pod ("namespace/name") the `GPUPodEvicted` Events of `node` name, as
    often as they name it: "evicted 2 GPU pods for fault F: ml/a, ml/b off bad
    device GPU-…" on the Node, "deleted GPU pod ml/c …" on the Pod. `at_least`
    waits (up to 20 s) until that many pods are named: the Events follow the record."""
    if at_least:
        wait_for(
            f"{at_least} pod(s) told evicted off {node}",
            lambda: len(pods_told_evicted(kube, node)) >= at_least,
            20,
        )
    told: list[str] = []
    for event in evictions_from(kube, node):
        regarding = event.involvedObject
        if regarding.kind == "Pod":
            told.append(f"{regarding.namespace}/{regarding.name}")
            continue
        _, _, pods = str(event.message).partition(": ")
        told += [pod.split(" ", 1)[0] for pod in pods.split(", ") if pod]
    return told


@pytest.fixture
def agents(control_plane: ControlPlane, tmp_path: Path) -> Iterator[list[AgentProcess]]:
    """The agents a test starts (it appends them): stopped after it, their logs shown."""
    started: list[AgentProcess] = []
    yield started
    for agent in started:
        agent.stop()
        print(f"--- agent {agent.node} log (tail) ---\n{agent.log()[-3000:]}")


@pytest.fixture
def start_agent(
    control_plane: ControlPlane, tmp_path: Path, agents: list[AgentProcess]
) -> StartAgent:
    """Factory: `start_agent(node, config=None, **options)` starts the agent of a
    node as the admin (AgentProcess's options: gpus, nvml_lib_dir, wrap); stopped after the
    test, its log shown (it joins `agents`)."""

    def start(node: str, config: dict[str, Any] | None = None, **options: Any) -> AgentProcess:
        agent = AgentProcess(tmp_path, control_plane.kubeconfig, node, config, **options)
        agents.append(agent)
        return agent.start()

    return start


def node_annotations(kube: Client, node: str) -> dict[str, str]:
    """The node's annotations, read now."""
    meta = kube.get(Node, node).metadata
    return dict((meta.annotations if meta else None) or {})


def gpu_healthy(kube: Client, node: str) -> tuple[str, str, str]:
    """The node's GPUHealthy condition, read now: (status, reason, message); all
    three "" while the node has none."""
    status = kube.get(Node, node).status
    found = next(
        (c for c in (status.conditions if status else None) or [] if c.type == "GPUHealthy"), None
    )
    return (found.status, found.reason or "", found.message or "") if found else ("", "", "")


def in_process_cli(kubeconfig: Path, capsys: pytest.CaptureFixture[str], *options: str) -> Cli:
    """`gpuheal ARGS... --kubeconfig K OPTIONS...` run in this process, its output
    captured: (exit code, stdout, stderr). Set COLUMNS first: rich wraps tables at
    the terminal's width."""

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([*args, "--kubeconfig", str(kubeconfig), *options])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def cli(
    control_plane: ControlPlane,
    config_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Cli:
    """`gpuheal ARGS... --config F` in-process against the test control plane, F
    the test module's own `config_file` fixture: (exit code, stdout, stderr)."""
    monkeypatch.setenv("COLUMNS", "240")  # rich wraps tables at the terminal's width
    return in_process_cli(control_plane.kubeconfig, capsys, "--config", str(config_file))


def record_of(kube: Client, node: str) -> Any:
    """The node's one GPUFault record, read now. It waits (up to 10 s) until there is
    one: a new quarantine's record follows its taint by a turn of the queue."""
    (record,) = wait_for(f"the GPUFault of {node}", lambda: faults_of(kube, node), timeout_s=10)
    return kube.get(GPUFault, str(record.metadata.name))


def faults_of(kube: Client, node: str) -> list[Any]:
    listed = kube.list(GPUFault, labels={NODE_LABEL: node_label(node)})
    return [r for r in listed if r.spec and r.spec.get("node") == node]


def record_entries(record: Any, action: str = "") -> list[dict[str, Any]]:
    """A GPUFault record's status.actions entries as read (a listed or fetched
    record), in the order written; with `action`, only those of that action."""
    listed: list[dict[str, Any]] = (record.status or {}).get("actions", [])
    return [entry for entry in listed if not action or entry["action"] == action]


def record_phase(record: Any) -> str:
    """A GPUFault record's status.phase as read ("" before the controller sets one)."""
    return str((record.status or {}).get("phase", ""))


def entries_of(
    kube: Client, action: str, *, name: str = "", node: str = ""
) -> list[dict[str, Any]]:
    """Read now: the `action` entries of the GPUFault record `name`, or of every
    record of `node` (none while it has none), as the server lists them."""
    if bool(name) == bool(node):
        raise TypeError("entries_of: give the record's name or its node, one of them")
    records = [kube.get(GPUFault, name)] if name else faults_of(kube, node)
    return [entry for record in records for entry in record_entries(record, action)]


def handled_fault(kube: Client, node: str) -> str | None:
    """The node's gpuheal.io/handled-fault-id annotation."""
    meta = kube.get(Node, node).metadata
    return (meta.annotations or {}).get(HANDLED_FAULT_ID) if meta else None


def pods_on(kube: Client, namespace: str, node: str) -> set[str]:
    """Names of the live (not terminating) pods of a namespace on a node."""
    return {
        str(p.metadata.name)
        for p in kube.list(Pod, namespace=namespace)
        if p.spec and p.spec.nodeName == node and p.metadata and not p.metadata.deletionTimestamp
    }


@pytest.fixture
def audited_controller_user(kube: Client) -> Iterator[str]:
    """The audited identity (the session's API server logs its requests), bound to
    cluster-admin for one test and unbound after it: tests that grant it less (the
    RBAC failure tests) must not inherit another test's grant."""
    binding = f"{AUDITED_CONTROLLER}-cluster-admin"
    grant_cluster_admin(kube, AUDITED_CONTROLLER)
    yield AUDITED_CONTROLLER
    with contextlib.suppress(ApiError):
        kube.delete(ClusterRoleBinding, binding)


def guarded_pod(kube: Client, namespace: str, node: str) -> None:
    """A GPU pod "guarded" on `node` behind a PodDisruptionBudget that allows no
    eviction: the most common blocked drain on a training fleet."""
    labels = {"app": "guarded"}
    apply(kube, gpu_pod("guarded", namespace, node_name=node, labels=labels))
    apply(kube, pod_disruption_budget("guarded", namespace, match_labels=labels, min_available=1))
