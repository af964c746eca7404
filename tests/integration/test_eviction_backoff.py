"""A drain that a PodDisruptionBudget blocks, counted on the API server's side.

The most common drain on a training fleet: a Deployment whose budget allows no
disruption, its pod on the faulty node. The controller must taint the node,
leave the pod, say in the record which budget blocks it, back off as
configured (the apiserver's audit log counts every eviction and record write
it makes), and keep the record's first actions however long the block lasts.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.policy_v1 import PodDisruptionBudget

from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes, wait_nodes_ready
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, gpu_deployment, pod_disruption_budget, wait_pods_running
from tests.corpus import unique_eks_node
from tests.helpers import wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    our_taint,
    pods_on,
    record_of,
    report_fault,
)

pytestmark = pytest.mark.timeout(240)

BASE_S, MAX_S = 2, 10  # evictionRetryBaseSeconds / MaxSeconds: real base, short cap
SETTLE_S = 10  # the first, quick steps of the backoff: 0, 2, 6 s
WINDOW_S = 30  # then half a minute at the cap: about 3 tries (a retry storm: hundreds)
MAX_PER_WINDOW = 5


@pytest.fixture
def eks_node(kube: Client, pool: dict[str, str]) -> Iterator[str]:
    name = unique_eks_node()
    create_gpu_nodes(kube, [name], labels=pool)
    wait_nodes_ready(kube, [name])
    yield name
    delete_nodes(kube, [name])


def _seconds_after(stamp: str, start: dt.datetime) -> float:
    return (dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")) - start).total_seconds()


def test_a_budget_that_allows_no_disruption_is_backed_off_and_named_in_the_record(
    kube: Client,
    control_plane: ControlPlane,
    namespace: str,
    pool: dict[str, str],
    eks_node: str,
    audited_controller_user: str,
    start_controller: StartController,
) -> None:
    labels = {"app": "trainer"}
    apply(kube, gpu_deployment("trainer", namespace, replicas=1, node_selector=pool))
    apply(
        kube,
        pod_disruption_budget("trainer-pdb", namespace, match_labels=labels, max_unavailable=0),
    )
    (pod,) = wait_pods_running(kube, namespace, count=1, labels=labels)
    pod_name = str(pod.metadata.name if pod.metadata else "")

    def budget_observed() -> bool:
        status = kube.get(PodDisruptionBudget, "trainer-pdb", namespace=namespace).status
        return status is not None and status.currentHealthy == 1

    wait_for("the budget's status", budget_observed)
    config = controller_config(pool, evictionRetryBaseSeconds=BASE_S, evictionRetryMaxSeconds=MAX_S)
    start_controller(config, user=audited_controller_user)
    since = audit.offset(control_plane.audit_log)
    started = dt.datetime.now(dt.UTC)
    report_fault(kube, eks_node, "xid-79-gpu-fell-off-the-bus")
    wait_for("the taint", lambda: our_taint(kube, eks_node) is not None, timeout_s=30)
    time.sleep(max(0.0, SETTLE_S + WINDOW_S - (dt.datetime.now(dt.UTC) - started).total_seconds()))

    record = record_of(kube, eks_node)
    name = str(record.metadata.name)
    evictions: list[float] = []
    writes: list[float] = []
    for r in audit.requests(control_plane.audit_log, user=audited_controller_user, since=since):
        if r.verb == "create" and r.resource == "pods/eviction" and r.name == pod_name:
            evictions.append(_seconds_after(r.at, started))
        elif r.verb == "patch" and r.resource == "gpufaults/status" and r.name == name:
            writes.append(_seconds_after(r.at, started))
    late_evictions = [t for t in evictions if t >= SETTLE_S]
    late_writes = [t for t in writes if t >= SETTLE_S]
    print(
        f"evictions: {len(evictions)} in all, {len(late_evictions)} in the {WINDOW_S}s after "
        f"{SETTLE_S}s; record status writes: {len(writes)}, {len(late_writes)} in that time"
    )
    print("eviction times (s):", [round(t, 1) for t in evictions[:40]])
    status: Any = kube.get(GPUFault, name).status or {}
    actions = status["actions"]
    print("record actions (first 3, last):", actions[:3], actions[-1])

    assert pods_on(kube, namespace, eks_node) == {pod_name}  # the budget holds
    assert our_taint(kube, eks_node) is not None
    assert evictions and min(evictions) < SETTLE_S  # tried at once
    assert len(late_evictions) <= MAX_PER_WINDOW, late_evictions
    assert len(late_writes) <= MAX_PER_WINDOW, late_writes

    assert status["phase"] == "Draining"
    assert [a["action"] for a in actions[:2]] == ["detect", "taint"]
    last = actions[-1]
    assert last["action"] == "evict" and last["result"] == "blocked", last
    assert f"{namespace}/{pod_name}" in last["detail"]
    assert f"PodDisruptionBudget {namespace}/trainer-pdb" in last["detail"]
    assert "times since" in last["detail"]  # the attempts folded into one entry
