"""The idle-node sweep on the real control plane: the leader fences idle GPU nodes
one at a time (sweep.maxConcurrent) while the validation Job runs on them (the Job
controller makes its pod, the scheduler places it through the fence it
tolerates, kwok plays its container: gpuheal/sim/stages.py), and lifts the fence
after. What must not happen is tested as much: a node running a GPU pod is never
checked, a check never keeps a pending GPU pod waiting (it yields, the pod lands
on the node), and a failed check is one fault, recorded once, held until a person
lets it go."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.model import SWEEP, SWEEP_TAINT
from gpuheal.policy.sweep import Result, SweepMark, parse_mark
from gpuheal.sim.stages import EXIT_CODE_ENV, HANG_ENV, MESSAGE_ENV
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from gpuheal.values import node_label
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    our_taint,
)

pytestmark = pytest.mark.timeout(240)

NAMESPACE = "gpuheal-system"  # the crds fixture makes it
POOL_LABEL = "gpuheal.io/pool"
PASS = {"result": "pass", "tool": "dcgmi-diag", "detail": "dcgmi diag -r 3: 8 GPUs, all tests pass"}
FAIL = {"result": "fail", "tool": "dcgmi-diag", "detail": "Diagnostic: GPU 5 SM stress: miscompare"}


PASSING = {EXIT_CODE_ENV: "0", MESSAGE_ENV: json.dumps(PASS)}


def sweeping(
    pool: dict[str, str], env: dict[str, str], pools: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """The sweep on, one check at a time, a pass a second; the Jobs end as their
    env says (the kwok stages), each pool's over the fleet's."""
    validation = {
        "namespace": NAMESPACE,
        "env": env,
        "byPool": {name: {"env": env} for name, env in pools.items()},
    }
    return controller_config(
        pool,
        healthGate={"validation": validation},
        sweep={"enabled": True, "maxConcurrent": 1, "passSeconds": 1},
    )


def mark_of(kube: Client, node: str) -> SweepMark | None:
    meta = kube.get(Node, node).metadata
    return parse_mark(((meta.annotations if meta else None) or {}).get(SWEEP))


def fenced(kube: Client, node: str) -> bool:
    taints = kube.get(Node, node).spec.taints or []  # type: ignore[union-attr]
    return any(t.key == SWEEP_TAINT for t in taints)


def ended(kube: Client, node: str) -> SweepMark | None:
    mark = mark_of(kube, node)
    return mark if mark is not None and not mark.running else None


def sweep_jobs(kube: Client, node: str) -> list[Job]:
    selector: dict[str, Any] = {"gpuheal.io/node": node_label(node), "gpuheal.io/sweep": "true"}
    return list(kube.list(Job, namespace=NAMESPACE, labels=selector))


def test_idle_nodes_are_checked_one_at_a_time_and_a_busy_one_never(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    idle = fake_gpu_nodes(3, labels=pool)
    (busy,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_pod("train-0", namespace, gpus=8, node_name=busy))
    wait_pods_running(kube, namespace, count=1)
    start_controller(sweeping(pool, PASSING, {}))

    def all_ended() -> list[SweepMark] | None:
        found = [ended(kube, n) for n in idle]
        return [m for m in found if m is not None] if all(found) else None

    marks = wait_for("every idle node checked", all_ended, timeout_s=60)
    assert marks is not None
    assert [m.result for m in marks] == [Result.PASSED] * 3
    assert all("dcgmi diag -r 3: 8 GPUs, all tests pass: pass" in m.detail for m in marks)
    # One at a time: each check started after the one before it ended.
    spans = sorted((m.started, m.ended) for m in marks)
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))
    assert not any(fenced(kube, n) for n in idle)
    wait_for("the Jobs deleted", lambda: not any(sweep_jobs(kube, n) for n in idle))
    assert mark_of(kube, busy) is None and not fenced(kube, busy)
    for node in idle:
        assert len(events_for(kube, node, "GPUSweepStarted", at_least=1)) == 1
        assert len(events_for(kube, node, "GPUSweepPassed", at_least=1)) == 1
    time.sleep(3)  # three more passes: nothing is checked again within intervalHours
    assert [ended(kube, n) for n in idle] == marks
    assert not any(faults_of(kube, n) for n in (*idle, busy))


def test_a_check_yields_to_a_pending_gpu_pod_which_lands_on_the_node(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    hanging = {**pool, POOL_LABEL: f"hang-{namespace}"}
    (node,) = fake_gpu_nodes(1, labels=hanging)
    start_controller(sweeping(pool, {HANG_ENV: "1"}, {}))
    wait_for("the check running", lambda: fenced(kube, node) and sweep_jobs(kube, node))

    def check_running() -> bool:
        pods = kube.list(Pod, namespace=NAMESPACE, labels={"gpuheal.io/sweep": "true"})
        return any(p.status and p.status.phase == "Running" for p in pods)

    wait_for("its pod running", check_running)

    started = time.monotonic()
    wanted = {POOL_LABEL: hanging[POOL_LABEL]}
    apply(kube, gpu_pod("train-1", namespace, gpus=8, node_selector=wanted))
    wait_pods_running(kube, namespace, count=1)
    landed = time.monotonic() - started
    pod = kube.get(Pod, "train-1", namespace=namespace)
    assert pod.spec is not None and pod.spec.nodeName == node
    mark = ended(kube, node)
    assert mark is not None and mark.result == Result.YIELDED
    assert f"pending pod {namespace}/train-1 wants the node's GPUs" in mark.detail
    assert not fenced(kube, node)
    wait_for("the Job deleted", lambda: not sweep_jobs(kube, node))
    assert events_for(kube, node, "GPUSweepYielded", at_least=1)
    assert not faults_of(kube, node)
    print(f"the pending pod ran on the node {landed:.1f} s after it was created")


def test_a_failed_check_is_one_fault_held_until_a_person_lets_it_go(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    failing = {**pool, POOL_LABEL: f"bad-{pool['gpuheal.test/pool']}"}
    (node,) = fake_gpu_nodes(1, labels=failing)
    env = {EXIT_CODE_ENV: "1", MESSAGE_ENV: json.dumps(FAIL)}
    start_controller(sweeping(pool, PASSING, {failing[POOL_LABEL]: env}))

    mark = wait_for("the check failed", lambda: ended(kube, node), timeout_s=60)
    assert mark is not None
    assert mark.result == Result.FAILED and mark.fault.startswith("sweep-")
    assert "GPU 5 SM stress: miscompare: fail (exited 1" in mark.detail
    wait_for("quarantined", lambda: our_taint(kube, node))
    (record,) = faults_of(kube, node)
    assert record.spec["source"] == "sweep" and record.spec["reason"] == "SweepFailed"
    assert record.spec["faultID"] == mark.fault
    # The fence goes once the fault's own taint holds the node.
    wait_for("the sweep's fence lifted", lambda: not fenced(kube, node))
    (event,) = events_for(kube, node, "GPUSweepFailed", at_least=1)
    assert mark.fault in (event.message or "") and "miscompare" in (event.message or "")
    time.sleep(3)  # held: no second check, no second fault
    assert ended(kube, node) == mark and len(faults_of(kube, node)) == 1
    assert our_taint(kube, node)

    # A person swapped the card (here: moved the node to a pool whose checks pass)
    # and removed the mark: the fault ends, the node returns, and is checked afresh.
    fixed = {POOL_LABEL: f"fixed-{pool['gpuheal.test/pool']}"}
    kube.patch(Node, node, {"metadata": {"labels": fixed, "annotations": {SWEEP: None}}})
    wait_for("returned", lambda: our_taint(kube, node) is None, timeout_s=30)
    wait_for("Resolved", lambda: faults_of(kube, node)[0].status.get("phase") == "Resolved")
    again = wait_for("checked afresh", lambda: ended(kube, node), timeout_s=60)
    assert again is not None
    assert again.result == Result.PASSED and again.job != mark.job
    assert len(faults_of(kube, node)) == 1
