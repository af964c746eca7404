"""External signals (alerts, DCGM, manual requests) end when they expire, and
the node's reconcile is told when that is, so it is looked at again then."""

from __future__ import annotations

import asyncio

from gpuheal.controller.signals import ExternalSignals
from gpuheal.kube.informer import Informer
from gpuheal.model import FaultSignal, NodeView, Severity
from tests.corpus import EKS_NODE, GKE_NODE
from tests.unit.test_controller_echoes import _reconciler


def _alert(
    node: str = EKS_NODE, fault_id: str = "am-f1a2b3c4d5e6f7a8-20261129100000"
) -> FaultSignal:
    return FaultSignal(node, fault_id, "DcgmXidError", "alertmanager", Severity.P0)


def test_a_signal_expires_its_ttl_after_it_was_last_seen() -> None:
    held = ExternalSignals(ttl_s=60)
    assert held.add(_alert(), now=0.0)
    assert held.expires_in(EKS_NODE, now=10.0) == 50.0
    assert not held.add(_alert(), now=30.0)  # Alertmanager's repeat: seen again
    assert held.expires_in(EKS_NODE, now=40.0) == 50.0
    held.add(_alert(fault_id="am-2"), now=35.0)
    assert held.expires_in(EKS_NODE, now=40.0) == 50.0  # the soonest of the node's
    assert held.active(EKS_NODE, now=89.9) != ()
    assert held.active(EKS_NODE, now=95.0) == ()  # expired at 90 and 95
    assert held.expires_in(EKS_NODE, now=95.0) is None
    assert held.expires_in(GKE_NODE, now=0.0) is None
    assert held.nodes() == []


def test_the_reconcile_of_a_node_holding_a_signal_answers_when_it_expires() -> None:
    # Before: nothing looked at the node when its alert expired, so a quarantine
    # caused only by the alert stayed until some unrelated event touched the node.
    async def run() -> None:
        loop, _records, _pods = _reconciler()
        reconciler = loop.reconciler
        loop.external.ttl_s = 120
        # A node the controller does not manage (no GPU label): no plan, no request.
        nodes = loop.nodes
        assert isinstance(nodes, Informer)
        nodes.upsert(NodeView(EKS_NODE, "1"), "1")
        assert (await reconciler.reconcile(EKS_NODE)).requeue_after is None
        loop.external.add(_alert())
        again = (await reconciler.reconcile(EKS_NODE)).requeue_after
        assert again is not None and 119 < again <= 120
        # A node deleted meanwhile: its expiry still ends the signal, once.
        loop.external.add(_alert(GKE_NODE), now=0.0)
        assert (await reconciler.reconcile(GKE_NODE)).requeue_after is None  # long expired
        assert loop.external.nodes() == [EKS_NODE]

    asyncio.run(run())
