"""The whole chain on the node names real fleets have: an EKS name outside
us-east-1 (43 characters) and an on-prem FQDN at the 253-character limit.

The real agent reads an Xid 79 from its kernel log on such a node; the
controller quarantines it, evicts its GPU pods once and returns it after a
reboot. Before gpuheal.values, the agent's fault id (the node name and 24
characters) went unchanged into the taint value, the API server refused it
(63 bytes at most) and the node was never quarantined.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal import values
from gpuheal.model import (
    FAULT_DEVICES,
    FAULT_ID,
    FAULT_REASON,
    FAULT_TIME,
    HANDLED_FAULT_ID,
    STATUS,
)
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes, wait_nodes_ready
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from tests.corpus import EKS_NODE, GPU_UUIDS, unique_eks_node, unique_fqdn
from tests.helpers import wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    node_annotations,
    our_taint,
    pods_on,
    pods_told_evicted,
    record_phase,
)

pytestmark = pytest.mark.timeout(240)

XID_79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=2843, name=python3, GPU has fallen off the bus."


@pytest.mark.parametrize("shape", ["eks", "fqdn-253"])
def test_an_xid_79_on_a_real_shaped_node_is_quarantined_evicted_once_and_recovered(
    shape: str,
    control_plane: ControlPlane,
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    agents: list[AgentProcess],
    start_controller: StartController,
) -> None:
    bad = EKS_NODE if shape == "eks" else unique_fqdn(253)
    good = unique_eks_node()
    create_gpu_nodes(kube, [bad, good], labels=pool)
    try:
        wait_nodes_ready(kube, [bad, good])
        for i in range(2):
            apply(kube, gpu_pod(f"train-{i}", namespace, node_name=bad))
        wait_pods_running(kube, namespace, count=2)
        start_controller(controller_config(pool))
        for node in (bad, good):
            agents.append(AgentProcess(tmp_path, control_plane.kubeconfig, node).start())
        agent = agents[0]

        agent.kernel(XID_79)
        wait_for("the node quarantined", lambda: our_taint(kube, bad) is not None, timeout_s=30)
        reported = node_annotations(kube, bad)[FAULT_ID]
        # The agent's id is the node name and 24 characters: past the record's 256 on
        # the long name, where the fault goes on under its normalized id, said once.
        carried = values.fault_id(reported)
        assert (carried == reported) == (len(reported) <= values.FIELD_MAX)
        taint = our_taint(kube, bad)
        assert taint == values.taint_value(carried) and taint is not None and len(taint) <= 63
        wait_for("GPU pods evicted", lambda: not pods_on(kube, namespace, bad), timeout_s=60)
        wait_for("handled", lambda: node_annotations(kube, bad).get(HANDLED_FAULT_ID) == carried)
        (record,) = faults_of(kube, bad)
        assert record.spec["faultID"] == carried and record.spec["node"] == bad
        normalized = events_for(kube, bad, "GPUFaultInputNormalized")
        assert len(normalized) == (0 if carried == reported else 1)
        assert sorted((record.status or {}).get("evictedPods", [])) == [
            f"{namespace}/train-0",
            f"{namespace}/train-1",
        ]
        assert len(pods_told_evicted(kube, bad, at_least=2)) == 2
        assert len(events_for(kube, bad, "GPUFaultQuarantined", at_least=1)) == 1
        assert our_taint(kube, good) is None

        # The repair a person (or a reboot daemon) does: the node comes back with a fresh
        # kernel log; the agent reports it healthy and the controller returns it.
        agent.stop()
        agent.reboot()
        agent.start()
        wait_for("the node returned", lambda: our_taint(kube, bad) is None, timeout_s=90)
        name = record.metadata.name
        wait_for("record Resolved", lambda: record_phase(kube.get(GPUFault, name)) == "Resolved")
        assert len(faults_of(kube, bad)) == 1
        assert len(pods_told_evicted(kube, bad, at_least=2)) == 2
        assert len(events_for(kube, bad, "GPUFaultRecovered", at_least=1)) == 1
    finally:
        delete_nodes(kube, [bad, good])


def test_an_annotation_that_cannot_be_written_as_is_is_acted_on_and_said_once(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    start_controller: StartController,
) -> None:
    """What `kubectl annotate` can put on a node and no taint, label or record can
    carry as is: the fault is quarantined under its normalized id, and the
    normalization is said once (one Event, one count per field), however often
    the annotation is written again."""
    node = unique_fqdn(253)
    create_gpu_nodes(kube, [node], labels=pool)
    try:
        wait_nodes_ready(kube, [node])
        controller = start_controller(controller_config(pool))
        odd = {
            STATUS: "faulty",
            FAULT_ID: "xid 79 on GPU-5b2f4a8e-9c1d-3f7a-b0e2-4d6c8a1f3e95\n" * 8,
            FAULT_REASON: "GPU has fallen off the bus. " * 12,
            FAULT_DEVICES: ",".join(GPU_UUIDS * 13),  # 104 devices
        }
        for attempt in range(20):
            kube.patch(Node, node, {"metadata": {"annotations": odd | {FAULT_TIME: f"t{attempt}"}}})
        wait_for("the node quarantined", lambda: our_taint(kube, node) is not None, timeout_s=30)
        carried = values.fault_id(odd[FAULT_ID])
        assert our_taint(kube, node) == values.taint_value(carried)
        (record,) = faults_of(kube, node)
        spec = record.spec
        assert spec["faultID"] == carried and len(spec["devices"]) == values.DEVICES_MAX
        assert spec["reason"] == values.text(odd[FAULT_REASON]) and spec["detectedAt"] == ""
        events = events_for(kube, node, "GPUFaultInputNormalized")
        assert len(events) == 1, [e.message for e in events]
        metrics = controller.metrics()
        for field in ("fault-id", "fault-reason", "fault-time", "fault-devices"):
            line = (
                "gpuheal_fault_inputs_normalized_total"
                f'{{field="{field}",source="node-annotation"}} 1.0'
            )
            assert line in metrics, field
    finally:
        delete_nodes(kube, [node])
