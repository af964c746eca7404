"""The node agent through a 60 s API outage: faults found while the API server
is down are reported once it is back, no agent crashes, and each fault keeps
one id (one GPUFault record, quarantined once)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal.model import FAULT_ID, HANDLED_FAULT_ID, TAINT_KEY
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.nodes import create_gpu_nodes, wait_nodes_ready
from gpuheal.sim.resources import GPUFault
from tests.chaos.storm import Replicas
from tests.helpers import unique, wait_for

OUTAGE_S = 60
POOL = "gpuheal.chaos/pool"
XID_79 = "NVRM: Xid (PCI:0000:1c:00): 79, pid=2843, name=python3, GPU has fallen off the bus."


@pytest.fixture
def agents(
    chaos_plane: ControlPlane, chaos_kube: Client, workdir: Path
) -> Iterator[dict[str, AgentProcess]]:
    pool = {POOL: unique("agents")}
    prefix = unique("agpu")
    nodes = create_gpu_nodes(chaos_kube, [f"{prefix}-{i}" for i in range(3)], labels=pool)
    wait_nodes_ready(chaos_kube, nodes)
    started = {n: AgentProcess(workdir, chaos_plane.kubeconfig, n) for n in nodes}
    for agent in started.values():
        agent.component.start()
    for agent in started.values():
        agent.start_wait()
    yield started
    for agent in started.values():
        agent.stop()
        print(f"--- agent {agent.node} log (tail) ---\n{agent.log()[-2000:]}")


def node_annotations(kube: Client, node: str) -> dict[str, str]:
    found: Any = kube.get(Node, node)
    return dict(found.metadata.annotations or {})


def reported_healthy(kube: Client, node: str) -> bool:
    found: Any = kube.get(Node, node)
    return any(c.reason == "GPUsHealthy" for c in found.status.conditions or [])


def handled(kube: Client, node: str) -> bool:
    seen = node_annotations(kube, node)
    return FAULT_ID in seen and seen.get(HANDLED_FAULT_ID) == seen[FAULT_ID]


@pytest.mark.timeout(600)
def test_faults_during_a_60s_api_outage_are_reported_once_it_is_back(
    chaos_plane: ControlPlane,
    chaos_kube: Client,
    workdir: Path,
    agents: dict[str, AgentProcess],
) -> None:
    first, second, healthy = list(agents)
    found: Any = chaos_kube.get(Node, first)
    controllers = Replicas(chaos_plane, workdir, {POOL: found.metadata.labels[POOL]})
    controllers.start()
    wait_for("agents report healthy", lambda: all(reported_healthy(chaos_kube, n) for n in agents))

    chaos_plane.stop_apiserver()
    try:
        time.sleep(5)
        agents[first].kernel(XID_79)
        time.sleep(OUTAGE_S / 2)
        agents[second].set_device(3, lost=True)
        time.sleep(OUTAGE_S / 2 - 5)
        assert all(a.component.exit_code() is None for a in agents.values()), "an agent died"
    finally:
        chaos_plane.start_apiserver()

    wait_for(
        "both faults handled",
        lambda: handled(chaos_kube, first) and handled(chaos_kube, second),
        timeout_s=120,
    )
    ids = {n: node_annotations(chaos_kube, n)[FAULT_ID] for n in (first, second)}
    time.sleep(3)  # fifteen more probe rounds: the ids must not churn
    assert {n: node_annotations(chaos_kube, n)[FAULT_ID] for n in (first, second)} == ids
    assert FAULT_ID not in node_annotations(chaos_kube, healthy)
    for node in (first, second):
        records: list[Any] = list(chaos_kube.list(GPUFault, labels={"gpuheal.io/node": node}))
        assert [r.spec["faultID"] for r in records] == [ids[node]]
        found = chaos_kube.get(Node, node)
        taints = found.spec.taints or []
        assert [t.value for t in taints if t.key == TAINT_KEY] == [ids[node]]
    assert all(a.component.exit_code() is None for a in agents.values())
    for node in (first, second):
        # They did try during the outage: the reports above came from retries.
        assert agents[node].metric("gpuheal_agent_report_failures_total") >= 1
    controllers.stop()
