"""What the controller's informers take in: every object the API server allows."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import Client
from lightkube.types import PatchType

from gpuheal.kube.resources import GPUFault
from gpuheal.model import fault_record_name
from gpuheal.values import node_label
from tests import corpus
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    our_taint,
    report_fault,
)

pytestmark = pytest.mark.timeout(240)


def create_record(kube: Client, node: str, fault_id: str, status: dict[str, Any]) -> str:
    """A GPUFault as a person (or an older controller) may leave it: `status`
    written through the status subresource with a JSON patch, nulls kept."""
    name = fault_record_name(node, fault_id)
    record = {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "GPUFault",
        "metadata": {"name": name, "labels": {"gpuheal.io/node": node_label(node)}},
        "spec": {
            "node": node,
            "faultID": fault_id,
            "scope": "node",
            "source": "agent",
            "reason": "XidCritical79",
            "severity": "P0",
            "detectedAt": "2026-12-01T02:30:12Z",
        },
    }
    kube.create(GPUFault.from_dict(record))
    patch = [{"op": "add", "path": "/status", "value": status}]
    kube.patch(GPUFault.Status, name, patch, patch_type=PatchType.JSON)
    return name


def test_a_gpufault_with_a_null_recovering_since_neither_blocks_the_start_nor_the_remediation(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    quiet, faulty = fake_gpu_nodes(2, labels=pool)
    # status.recoveringSince and status.expiry are nullable in the CRD.
    nulls = {"phase": "Recovering", "recoveringSince": None, "expiry": None}
    elsewhere = corpus.unique_eks_node()  # a node this controller does not manage
    held = create_record(kube, elsewhere, f"{elsewhere}-20261201T023012Z-a1b2c3", nulls)
    stored = kube.get(GPUFault, held)["status"]
    assert "recoveringSince" in stored and stored["recoveringSince"] is None  # kept as null
    create_record(kube, quiet, "xid-48-20261201T023013Z", {"phase": "Resolved"})
    create_record(kube, elsewhere, "xid-79-20261201T023014Z", {"phase": "Resolved"})

    # Before the fix the LIST of GPUFaults failed as a whole: never ready (start times out).
    controller = start_controller(controller_config(pool))

    # One more, while the controller watches: the watch takes it too.
    later = corpus.unique_eks_node()
    create_record(kube, later, f"{later}-20261201T023015Z-d4e5f6", nulls)
    report_fault(kube, faulty, f"{faulty}-20261201T023016Z-0f1e2d")
    wait_for("the faulty node quarantined", lambda: our_taint(kube, faulty), timeout_s=30)
    assert our_taint(kube, quiet) is None

    metrics = controller.metrics()
    for informer in ("nodes", "pods", "gpufaults", "canaries"):
        # Nothing skipped: every object the API server allows is decoded.
        assert f'gpuheal_informer_decode_errors_total{{informer="{informer}"}} 0.0' in metrics
    assert "informer failed" not in controller.log()
