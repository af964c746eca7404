"""One fault id is one fault, against the real API server and a real controller: a
person re-uses `manual-…` after a newer fault took the node over. The newer fault
keeps its taint and its open record, and the re-use is told once."""

from __future__ import annotations

import pytest
from lightkube import Client

from gpuheal.values import taint_value
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    handled_fault,
    our_taint,
    record_phase,
    report_fault,
)
from tests.integration.test_failures import metric

pytestmark = pytest.mark.integration

FIRST, NEWER = "manual-1765015200", "manual-1765015260"


def test_a_fault_id_reported_again_after_it_was_superseded_changes_nothing(
    kube: Client, pool: dict[str, str], fake_gpu_nodes: FakeNodes, start_controller: StartController
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    controller = start_controller(controller_config(pool, mode="quarantine"))
    controller.wait_leading()
    report_fault(kube, node, FIRST)
    wait_for("the first fault handled", lambda: handled_fault(kube, node) == FIRST)
    report_fault(kube, node, NEWER)
    wait_for("the newer fault handled", lambda: handled_fault(kube, node) == NEWER)
    report_fault(kube, node, FIRST)  # the old command run again
    wait_for(
        "the re-use counted",
        lambda: metric(controller, 'gpuheal_duplicates_suppressed_total{layer="reused"}') == 1,
    )
    (told,) = events_for(kube, node, "GPUFaultIdReused", at_least=1)
    assert FIRST in str(told.message)
    assert our_taint(kube, node) == taint_value(NEWER)
    phases = {r.spec["faultID"]: record_phase(r) for r in faults_of(kube, node)}
    assert phases == {FIRST: "Resolved", NEWER: "Quarantined"}, phases
