"""`gpuheal rollout` on the real control plane with kwok GPU nodes, driven by a real
controller: a 12-node pool rolled canary first, then in batches of 3, never more
nodes out than the budget, each node gated on the new version; a failing node
stopping it, held; a CLI SIGKILLed at once, the controller completing the
roll-out without draining any node twice; two operators starting one pool's
roll-out at once; a controller failover mid-roll-out, whose recovery gate
meanwhile follows the roll-out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node, NodeStatus
from lightkube.types import PatchType

from gpuheal.cli import main
from gpuheal.model import (
    DRIVER_UPGRADE_ENABLED,
    DRIVER_UPGRADE_STATE,
    DRIVER_VERSION,
    MAINTENANCE_ROLLOUT,
    MANAGED_LABEL,
    STATE_LABEL,
)
from gpuheal.policy.rollout import rollout_name
from gpuheal.sim import ControlPlane
from gpuheal.sim.audit import evictions, offset, requests
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.resources import GPURollout
from gpuheal.sim.stages import EXIT_CODE_ENV, MESSAGE_ENV
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    Cli,
    StartController,
    clear_fault,
    controller_config,
    events_for,
    our_taint,
    report_fault,
)

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
POOL_LABEL = "gpuheal.test/pool"
OLD, NEW = "550.54.15", "560.35.03"
VALIDATION_PASS = {"result": "pass", "tool": "dcgmi-diag", "detail": "dcgmi diag -r 2: 8 GPUs"}


@pytest.fixture
def settings(pool: dict[str, str]) -> dict[str, Any]:
    """The config of the controller that drives the roll-outs (and of the CLI)."""
    config = controller_config(pool, pools={"label": POOL_LABEL, "byName": {}})
    config["pools"]["byName"][pool[POOL_LABEL]] = {"gpusPerNode": 8}
    config["maintenance"] = {"evictionRetrySeconds": 0.5, "checkpoint": "none"}
    config["rollouts"] = {"pollSeconds": 0.2}
    # What `rollout start --validate` runs: kwok ends each Job's pod with a pass.
    passing = {EXIT_CODE_ENV: "0", MESSAGE_ENV: json.dumps(VALIDATION_PASS)}
    config["healthGate"] = {
        "validation": {"namespace": "gpuheal-system", "timeoutSeconds": 60, "env": passing}
    }
    return config


@pytest.fixture
def config_file(tmp_path: Path, settings: dict[str, Any]) -> Path:
    path = tmp_path / "gpuheal.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


@pytest.fixture
def controller(start_controller: StartController, settings: dict[str, Any]) -> ControllerProcess:
    """The leader that drives the roll-outs."""
    return start_controller(settings).wait_leading()


@pytest.fixture
def rollouts(kube: Client, crds: None) -> Iterator[None]:
    yield
    kube.deletecollection(GPURollout)


def pool_nodes(fake_gpu_nodes: FakeNodes, kube: Client, pool: dict[str, str], n: int) -> list[str]:
    names = fake_gpu_nodes(n, labels=pool)
    for name in names:
        annotate(kube, name, {DRIVER_VERSION: OLD})
    return sorted(names)


def annotate(kube: Client, node: str, annotations: dict[str, str | None]) -> None:
    kube.patch(Node, node, {"metadata": {"annotations": annotations}}, patch_type=PatchType.MERGE)


def status_of(kube: Client, pool: str) -> dict[str, Any]:
    return cast(dict[str, Any], kube.get(GPURollout, rollout_name(pool)).status or {})


def steps(kube: Client, pool: str) -> dict[str, str]:
    """Each node's step ({} while the roll-out is not created yet)."""
    try:
        status = status_of(kube, pool)
    except ApiError as err:
        if err.status.code != 404:
            raise
        return {}
    return {n["name"]: n["step"] for n in status.get("nodes", [])}


def out_of_service(node: Node) -> bool:
    meta, spec = node.metadata, node.spec
    assert meta is not None and spec is not None
    return bool(spec.unschedulable) or (meta.labels or {}).get(STATE_LABEL) == "maintenance"


class Tooling(threading.Thread):
    """The operator's tooling: installs the driver on each node the roll-out has
    drained (the agent then reports it), unless told to leave a node alone; and an
    observer sampling which of the pool's nodes are out of service."""

    def __init__(self, kube: Client, pool: dict[str, str], skip: Iterable[str] = ()) -> None:
        super().__init__(daemon=True)
        self.kube, self.pool = kube, pool
        self.skip = set(skip)
        self.stop = threading.Event()
        self.changed: list[str] = []
        self.most_out = 0
        self.first_out: dict[str, float] = {}
        self.back: dict[str, float] = {}

    def run(self) -> None:
        value = self.pool[POOL_LABEL]
        while not self.stop.is_set():
            now = time.monotonic()
            out = {
                n.metadata.name
                for n in self.kube.list(Node, labels={POOL_LABEL: value})
                if n.metadata is not None and n.metadata.name and out_of_service(n)
            }
            self.most_out = max(self.most_out, len(out))
            for name in out:
                self.first_out.setdefault(name, now)
            for name in set(self.first_out) - out:
                self.back.setdefault(name, now)
            for name, step in steps(self.kube, value).items():
                if step == "waiting-for-change" and name not in self.changed + list(self.skip):
                    annotate(self.kube, name, {DRIVER_VERSION: NEW})
                    self.changed.append(name)
            time.sleep(0.1)

    def __enter__(self) -> Tooling:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.join(5)


START = ("rollout", "start")
FAST = ("--poll", "0.2", "--change-timeout", "60", "--gate-timeout", "2")


def test_a_12_node_pool_rolls_canary_first_then_batches_within_the_budget(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    cli: Cli,
    rollouts: None,
    controller: ControllerProcess,
) -> None:
    value = pool[POOL_LABEL]
    nodes = pool_nodes(fake_gpu_nodes, kube, pool, 12)
    with Tooling(kube, pool) as tooling:
        code, out, err = cli(
            *START, value, "--driver-version", NEW, "--reason", "CUDA 12.6",
            "--canary", "1", "--batch-size", "3", "--max-unavailable", "3", "--validate", *FAST,
        )  # fmt: skip
    assert code == 0, out + err
    status = status_of(kube, value)
    assert status["phase"] == "Completed"
    assert (status["done"], status["total"]) == (12, 12)
    # The gate with validation: one Job per node, each created by the controller.
    assert controller.log().count("validation Job gpuheal-system/") == 12
    batches: dict[int, list[str]] = {}
    for entry in status["nodes"]:
        assert entry["step"] == "done", entry
        # The gate passed each node on the new version (the canary while 11 ran the old).
        assert entry["detail"] == "gate passed; returned", entry
        batches.setdefault(entry["batch"], []).append(entry["name"])
    assert batches == {0: nodes[:1], 1: nodes[1:4], 2: nodes[4:7], 3: nodes[7:10], 4: nodes[10:]}
    # Each batch went out only once the one before was all back (one snapshot each).
    for k in range(1, 5):
        earlier_back = max(tooling.back[n] for n in batches[k - 1])
        assert min(tooling.first_out[n] for n in batches[k]) >= earlier_back, k
    assert tooling.most_out == 3  # the budget, used and never exceeded
    for name in nodes:
        node = kube.get(Node, name)
        assert node.metadata is not None and node.spec is not None
        annotations = node.metadata.annotations or {}
        assert annotations[DRIVER_VERSION] == NEW
        assert MAINTENANCE_ROLLOUT not in annotations
        assert not node.spec.unschedulable
        assert not events_for(kube, name, "GPUHealthGateFailed")
    # Numbers that make no roll-out are refused before anything is written.
    code, _, err = cli(*START, "other-pool", "--driver-version", NEW, "--reason", "r",
                       "--batch-size", "0")  # fmt: skip
    assert (code, err.strip()) == (2, "gpuheal rollout start: --batch-size must be 1 or more")
    # One roll-out per pool: a second start is refused, and says why.
    code, _, err = cli(*START, value, "--driver-version", "570.86.10", "--reason", "again")
    assert code == 2
    assert "already has a roll-out" in err


def test_a_failing_node_stops_the_roll_out_and_is_held_until_resumed(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    cli: Cli,
    rollouts: None,
    controller: ControllerProcess,
) -> None:
    value = pool[POOL_LABEL]
    nodes = pool_nodes(fake_gpu_nodes, kube, pool, 5)
    broken = nodes[1]  # batch 1
    kube.patch(NodeStatus, broken, {"status": {"allocatable": {"nvidia.com/gpu": "6"}}})
    with Tooling(kube, pool):
        code, out, err = cli(
            *START, value, "--driver-version", NEW, "--reason", "CUDA 12.6",
            "--canary", "1", "--batch-size", "2", "--max-unavailable", "2", *FAST,
        )  # fmt: skip
    assert code == 3, out + err
    status = status_of(kube, value)
    assert status["phase"] == "Failed"
    assert broken in status["message"]
    current = {n["name"]: n for n in status["nodes"]}
    assert current[broken]["step"] == "failed-held"
    assert "gpu-count: 6 nvidia.com/gpu allocatable, expected 8" in current[broken]["detail"]
    # Its batch-mate, drained already, was carried through; nothing else started.
    assert current[nodes[2]]["step"] == "done"
    # Held: still in maintenance; the next batch never started.
    held = kube.get(Node, broken).metadata
    assert held is not None and (held.labels or {})[STATE_LABEL] == "maintenance"
    assert [current[n]["step"] for n in nodes[3:]] == ["pending", "pending"]
    assert events_for(kube, broken, "GPUHealthGateFailed", at_least=1)
    code, out, _ = cli("rollout", "status", value, "-o", "json")
    assert code == 3 and '"phase": "Failed"' in out
    # Fixed, resumed: the held node is gated again and the rest follows.
    kube.patch(NodeStatus, broken, {"status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    with Tooling(kube, pool):
        code, out, err = cli("rollout", "resume", value, "--poll", "0.2")
    assert code == 0, out + err
    assert set(steps(kube, value).values()) == {"done"}


def test_a_gpurollout_written_without_the_cli_is_driven_from_its_spec(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    cli: Cli,
    rollouts: None,
    controller: ControllerProcess,
) -> None:
    """The object is the request: created by kubectl (or a start killed before
    anything else), the controller writes its order and drives it."""
    value = pool[POOL_LABEL]
    nodes = pool_nodes(fake_gpu_nodes, kube, pool, 2)
    spec = {"pool": value, "target": {"driverVersion": NEW}, "canary": 1, "batchSize": 1,
            "maxUnavailable": 1, "gateTimeoutSeconds": 2}  # fmt: skip
    with Tooling(kube, pool):
        kube.create(GPURollout.from_dict({"metadata": {"name": rollout_name(value)}, "spec": spec}))
        wait_for("its end", lambda: set(steps(kube, value).values()) == {"done"}, timeout_s=60)
    code, out, err = cli("rollout", "status", value)
    assert code == 0, out + err
    assert "Completed" in out and f"driven by the controller {controller.identity}" in out
    status = status_of(kube, value)
    assert status["phase"] == "Completed"
    assert [(n["name"], n["batch"], n["step"]) for n in status["nodes"]] == [
        (nodes[0], 0, "done"),
        (nodes[1], 1, "done"),
    ]


def test_a_change_that_never_comes_holds_the_node_and_abort_ends_it_for_good(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    cli: Cli,
    rollouts: None,
    controller: ControllerProcess,
) -> None:
    value = pool[POOL_LABEL]
    canary, *_ = pool_nodes(fake_gpu_nodes, kube, pool, 3)
    # Nobody installs the driver: the canary waits out the change timeout, held.
    code, out, err = cli(
        *START, value, "--driver-version", NEW, "--reason", "r", "--poll", "0.2",
        "--change-timeout", "1",
    )  # fmt: skip
    assert code == 3, out + err
    detail = {n["name"]: n.get("detail") for n in status_of(kube, value)["nodes"]}[canary]
    assert detail == f"no change within 1s: driver {OLD}, not {NEW}"
    code, out, _ = cli("rollout", "abort", value)
    assert code == 0 and "Aborted" in out
    assert status_of(kube, value)["phase"] == "Aborted"
    # Over for good: nothing to resume or pause; the held canary is left to a person.
    assert cli("rollout", "resume", value)[0] == 2
    assert cli("rollout", "pause", value)[0] == 2
    meta = kube.get(Node, canary).metadata
    assert meta is not None and (meta.labels or {})[STATE_LABEL] == "maintenance"


def test_a_roll_out_takes_only_managed_nodes_and_leaves_one_opted_out_alone(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    rollouts: None,
    controller: ControllerProcess,
) -> None:
    """Issue 41: a node opted out (gpuheal.io/managed=false) before the start is left
    out of the order and never touched; one opted out while pending is not started
    (it waits, saying why, and the next node goes instead); one opted out in flight
    is held, saying why, and nothing more is done to it. Each said in an Event."""
    value = pool[POOL_LABEL]
    canary, first, second, third, opted = pool_nodes(fake_gpu_nodes, kube, pool, 5)
    opt_out = {"metadata": {"labels": {MANAGED_LABEL: "false"}}}

    def detail(node: str) -> str:
        return str({n["name"]: n.get("detail", "") for n in status_of(kube, value)["nodes"]}[node])

    kube.patch(Node, opted, opt_out)
    why = f"not managed by gpuheal: it is opted out ({MANAGED_LABEL}=false)"
    # Batch 1 is first, second and third, one out at a time.
    spec = {"pool": value, "target": {"driverVersion": NEW}, "canary": 1, "batchSize": 3,
            "maxUnavailable": 1, "gateTimeoutSeconds": 2, "changeTimeoutSeconds": 120}  # fmt: skip
    with Tooling(kube, pool, skip=[first, third]) as tooling:
        kube.create(GPURollout.from_dict({"metadata": {"name": rollout_name(value)}, "spec": spec}))
        wait_for("the first out", lambda: steps(kube, value).get(first) == "waiting-for-change")
        kube.patch(Node, second, opt_out)
        wait_for("the second waiting", lambda: detail(second) == f"waits: {why}", timeout_s=20)
        tooling.skip = {third}  # the first changes, is gated and returns: room for one
        wait_for("the third out", lambda: steps(kube, value).get(third) == "waiting-for-change")
        assert steps(kube, value)[second] == "pending"  # passed over, untouched
        kube.patch(Node, third, opt_out)
        wait_for("it held", lambda: steps(kube, value).get(third) == "failed-held", timeout_s=20)
    status = status_of(kube, value)
    order = [(n["name"], n["step"]) for n in status["nodes"]]
    assert order == [  # not `opted`
        (canary, "done"), (first, "done"), (second, "pending"), (third, "failed-held"),
    ]  # fmt: skip
    assert (detail(second), detail(third)) == (f"waits: {why}", why)
    assert status["phase"] == "Failed" and third in status["message"]
    for node in (second, third):
        (event,) = events_for(kube, node, "GPUMaintenanceRefused", at_least=1)
        assert event.type == "Warning" and f"roll-out {rollout_name(value)}" in str(event.message)
    for node in (opted, second):
        meta, node_spec = kube.get(Node, node).metadata, kube.get(Node, node).spec
        assert meta is not None and node_spec is not None
        assert STATE_LABEL not in (meta.labels or {}) and not node_spec.unschedulable
        assert MAINTENANCE_ROLLOUT not in (meta.annotations or {})
        assert not events_for(kube, node, "GPUMaintenanceStarted")


class Background:
    """`gpuheal rollout ...` in a child process (to SIGKILL it)."""

    def __init__(self, args: list[str], log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "240"}
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpuheal.cli", *args],
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(5)


def test_a_cli_killed_at_once_leaves_a_12_node_roll_out_the_controller_completes_once(
    kube: Client,
    control_plane: ControlPlane,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    namespace: str,
    config_file: Path,
    settings: dict[str, Any],
    start_controller: StartController,
    cli: Cli,
    rollouts: None,
    audited_controller_user: str,
    tmp_path: Path,
) -> None:
    """Two operators start the pool's roll-out at once: one GPURollout, the other
    refused. The creator is SIGKILLed as soon as it exists; the controller alone
    carries the 12 nodes through, paused and resumed from another terminal on the
    way, every GPU pod evicted exactly once (the API server's audit log)."""
    value = pool[POOL_LABEL]
    nodes = pool_nodes(fake_gpu_nodes, kube, pool, 12)
    for i, node in enumerate(nodes):
        apply(kube, gpu_pod(f"train-{i}", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=12)
    start_controller(settings, user=audited_controller_user).wait_leading()
    log = control_plane.audit_log
    since = offset(log)
    args = [*START, value, "--driver-version", NEW, "--reason", "r", "--canary", "1",
            "--batch-size", "4", "--max-unavailable", "4", "--force", *FAST,
            "--kubeconfig", str(control_plane.kubeconfig),
            "--config", str(config_file)]  # fmt: skip
    operators = [Background(args, tmp_path / f"operator-{i}.log") for i in range(2)]
    try:
        refused = wait_for(
            "one start refused",
            lambda: [o for o in operators if o.process.poll() is not None],
            timeout_s=30,
        )
        assert [o.process.returncode for o in refused] == [2], [o.log.read_text() for o in refused]
        assert "already has a roll-out" in refused[0].log.read_text()
        (creator,) = [o for o in operators if o not in refused]
        creator.kill()  # at once: the roll-out is the controller's alone
    finally:
        for operator in operators:
            if operator.process.poll() is None:
                operator.kill()
    # Only the canary gets its driver at first: the batch after it drains, then waits.
    batch = nodes[1:5]
    with Tooling(kube, pool, skip=set(nodes[1:])):
        wait_for(
            "batch 1 drained and waiting",
            lambda: [steps(kube, value).get(n) for n in batch] == ["waiting-for-change"] * 4,
            timeout_s=90,
        )
    assert status_of(kube, value)["phase"] == "Running"
    # The breaker counts the roll-out's nodes in maintenance, as the controller does.
    code, out, _ = cli("status", "-o", "json")
    assert code == 0 and json.loads(out)["breaker"]["rolling"] == 4
    # Paused from another terminal: the batch in flight finishes, nothing else starts.
    code, out, _ = cli("rollout", "pause", value)
    assert code == 0 and "Paused" in out
    with Tooling(kube, pool):
        wait_for("batch 1 done", lambda: [steps(kube, value).get(n) for n in batch] == ["done"] * 4)
        time.sleep(1)  # passes of the paused roll-out: none takes a node out
        assert [steps(kube, value).get(n) for n in nodes[5:]] == ["pending"] * 7
        code, out, err = cli("rollout", "resume", value, "--no-wait")
        assert code == 0, out + err
        wait_for("the end", lambda: set(steps(kube, value).values()) == {"done"}, timeout_s=120)
    assert status_of(kube, value)["phase"] == "Completed"
    # Every GPU pod evicted exactly once, every node taken out once.
    evicted = evictions(requests(log, user=audited_controller_user, since=since))
    assert sorted(pod for _, pod in evicted) == sorted(f"train-{i}" for i in range(12))
    assert all(codes == [201] for codes in evicted.values()), evicted
    for node in nodes:
        assert len(events_for(kube, node, "GPUMaintenanceStarted", at_least=1)) == 1, node


def test_a_controller_failover_mid_roll_out_loses_nothing_and_its_recovery_gate_follows_it(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    config_file: Path,
    settings: dict[str, Any],
    control_plane: ControlPlane,
    rollouts: None,
    start_controller: StartController,
    tmp_path: Path,
) -> None:
    value = pool[POOL_LABEL]
    canary, *batch = pool_nodes(fake_gpu_nodes, kube, pool, 4)
    replicas = [start_controller(settings), start_controller(settings)]
    leader = wait_for("a leader", lambda: [r for r in replicas if r.leading()], timeout_s=30)[0]
    # The operator's terminal follows the roll-out through the failover.
    follower = Background(
        [*START, value, "--driver-version", NEW, "--reason", "r", "--canary", "1",
         "--batch-size", "3", "--max-unavailable", "3", *FAST,
         "--kubeconfig", str(control_plane.kubeconfig), "--config", str(config_file)],
        tmp_path / "follower.log",
    )  # fmt: skip
    try:
        with Tooling(kube, pool, skip=batch):
            wait_for("the canary rolled", lambda: steps(kube, value).get(canary) == "done")
            # A fault on the rolled canary while the rest of the pool runs the old driver:
            # the controller's recovery gate expects the roll-out's target, and returns it.
            report_fault(kube, canary, "xid-79-rolled")
            wait_for("its quarantine", lambda: our_taint(kube, canary) == "xid-79-rolled")
            clear_fault(kube, canary)
            wait_for("its return", lambda: our_taint(kube, canary) is None, timeout_s=30)
            assert not events_for(kube, canary, "GPUHealthGateFailed")
            wait_for(
                "batch 1 waiting",
                lambda: [steps(kube, value).get(n) for n in batch] == ["waiting-for-change"] * 3,
            )
            assert status_of(kube, value)["driver"] == leader.identity
            leader.kill()  # failover mid-roll-out
            (other,) = [r for r in replicas if r is not leader]
            other.wait_leading()
        with Tooling(kube, pool):
            code = follower.process.wait(60)
        assert code == 0, follower.log.read_text()
    finally:
        if follower.process.poll() is None:
            follower.kill()
    status = status_of(kube, value)
    assert status["phase"] == "Completed"
    assert status["driver"] == other.identity
    assert set(steps(kube, value).values()) == {"done"}
    # Nothing lost or done twice across the failover: each node taken out once.
    for node in (canary, *batch):
        assert len(events_for(kube, node, "GPUMaintenanceStarted", at_least=1)) == 1, node


@pytest.mark.parametrize("passes", [True, False], ids=["validation-passes", "validation-fails"])
def test_a_roll_out_started_with_validate_gates_each_node_with_its_validation_job(
    kube: Client,
    control_plane: ControlPlane,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    settings: dict[str, Any],
    start_controller: StartController,
    rollouts: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    audited_controller_user: str,
    passes: bool,
) -> None:
    """The runbook's gate before uncordon: with --validate (kept in the spec) each
    changed node returns only once its validation Job passes; a failing Job stops
    the roll-out with the canary held and the Job's own words in its detail."""
    value = pool[POOL_LABEL]
    nodes = pool_nodes(fake_gpu_nodes, kube, pool, 3)
    detail = "dcgmi diag -r 2: 8 GPUs" + ("" if passes else ", HBM row remap on GPU 3")
    result = {"result": "pass" if passes else "fail", "tool": "dcgmi-diag", "detail": detail}
    env = {EXIT_CODE_ENV: "0" if passes else "1", MESSAGE_ENV: json.dumps(result)}
    validation = {"enabled": True, "namespace": "gpuheal-system", "timeoutSeconds": 60, "env": env}
    config = {**settings, "healthGate": {"validation": validation}}
    path = tmp_path / "validating.yaml"
    path.write_text(yaml.safe_dump(config))
    start_controller(config, user=audited_controller_user).wait_leading()
    since = offset(control_plane.audit_log)
    with Tooling(kube, pool):
        code = main(
            [*START, value, "--driver-version", NEW, "--reason", "CUDA 12.6", "--canary", "1",
             "--batch-size", "2", "--max-unavailable", "2", "--validate", "--poll", "0.2",
             "--change-timeout", "60", "--gate-timeout", "0",
             "--kubeconfig", str(control_plane.kubeconfig), "--config", str(path)]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert kube.get(GPURollout, rollout_name(value)).spec["validate"] is True
    created = [
        r
        for r in requests(control_plane.audit_log, user=audited_controller_user, since=since)
        if r.verb == "create" and r.resource == "jobs" and r.code == 201
    ]
    status = status_of(kube, value)
    if passes:
        assert code == 0, out + err
        assert status["phase"] == "Completed"
        assert len(created) == 3  # one validation Job per node
    else:
        assert code == 3, out + err
        held = {n["name"]: n for n in status["nodes"]}[nodes[0]]
        assert held["step"] == "failed-held"
        assert "validation" in held["detail"] and "HBM row remap on GPU 3" in held["detail"]
        assert len(created) == 1  # the canary's; nothing after it started
        assert [n["step"] for n in status["nodes"][1:]] == ["pending", "pending"]


class GpuOperator(threading.Thread):
    """gpu-operator's upgrade controller, as far as its state label goes: it starts
    upgrading `node` once the roll-out is under way (drain-required) and says
    upgrade-done once the rest of its batch is done, noting what the roll-out had
    done with the node meanwhile."""

    def __init__(self, kube: Client, pool: str, node: str, batch: list[str]) -> None:
        super().__init__(daemon=True)
        self.kube, self.pool, self.node, self.batch = kube, pool, node, batch
        self.stop = threading.Event()
        self.seen_meanwhile: set[str] = set()
        self.out_of_service = False

    def label(self, state: str) -> None:
        body = {"metadata": {"labels": {DRIVER_UPGRADE_STATE: state}}}
        self.kube.patch(Node, self.node, body, patch_type=PatchType.MERGE)

    def run(self) -> None:
        wait_for("the roll-out under way", lambda: steps(self.kube, self.pool), timeout_s=60)
        self.label("drain-required")
        while not self.stop.is_set():
            now = steps(self.kube, self.pool)
            self.seen_meanwhile.add(now.get(self.node, ""))
            self.out_of_service |= out_of_service(self.kube.get(Node, self.node))
            if all(now.get(n) == "done" for n in self.batch):
                self.label("upgrade-done")
                return
            time.sleep(0.1)

    def __enter__(self) -> GpuOperator:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.join(5)


def test_a_node_gpu_operator_is_upgrading_is_left_alone_until_its_label_says_done(
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    cli: Cli,
    rollouts: None,
    controller: ControllerProcess,
) -> None:
    value = pool[POOL_LABEL]
    canary, upgrading, other = pool_nodes(fake_gpu_nodes, kube, pool, 3)
    for node in (canary, upgrading, other):  # as gpu-operator leaves a finished node
        kube.patch(Node, node, {"metadata": {"labels": {DRIVER_UPGRADE_STATE: "upgrade-done"}}})
    with Tooling(kube, pool), GpuOperator(kube, value, upgrading, [canary, other]) as operator:
        code, out, err = cli(
            *START, value, "--driver-version", NEW, "--reason", "r", "--canary", "1",
            "--batch-size", "2", "--max-unavailable", "2", *FAST,
        )  # fmt: skip
    assert code == 0, out + err
    # Pending all the while gpu-operator upgraded it: never taken out, its batch went on.
    assert operator.seen_meanwhile <= {"pending"}, operator.seen_meanwhile
    assert not operator.out_of_service
    assert set(steps(kube, value).values()) == {"done"}


def test_a_pool_whose_upgrades_gpu_operator_manages_is_not_rolled_out(
    kube: Client, fake_gpu_nodes: FakeNodes, pool: dict[str, str], cli: Cli, rollouts: None
) -> None:
    value = pool[POOL_LABEL]
    first, _ = pool_nodes(fake_gpu_nodes, kube, pool, 2)
    # What gpu-operator writes on every GPU node while autoUpgrade is on.
    annotate(kube, first, {DRIVER_UPGRADE_ENABLED: "true"})
    code, _, err = cli(*START, value, "--driver-version", NEW, "--reason", "r")
    assert code == 2
    assert "gpu-operator upgrades the driver of 1 of its 2 nodes itself" in err
    assert "spec.driver.upgradePolicy.autoUpgrade" in err
    assert steps(kube, value) == {}  # nothing written
