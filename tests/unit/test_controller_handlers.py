"""Which events queue which node: a taint leaving a node frees breaker capacity,
so the nodes of held faults are queued then, whoever removed it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gpuheal.controller.handlers import reconciling
from gpuheal.model import TAINT_KEY, FaultRecord, NodeView, Phase, Taint
from tests.corpus import EKS_NODE, GKE_NODE
from tests.unit.test_controller_echoes import _reconciler


def test_a_taint_leaving_a_node_queues_the_nodes_of_held_faults() -> None:
    async def run() -> None:
        loop, records, _pods = _reconciler()
        held = FaultRecord(f"{GKE_NODE[:20]}-f2", GKE_NODE, "f2", Phase.HELD, resource_version="1")
        records.upsert(held, "1")
        node = NodeView(EKS_NODE, "2", gpus=8, taints=(Taint(TAINT_KEY, "NoSchedule", "f1"),))
        loop.nodes.upsert(node, "2")
        assert {await loop.queue.get(), await loop.queue.get()} == {GKE_NODE, EKS_NODE}
        loop.queue.done(GKE_NODE)
        loop.queue.done(EKS_NODE)
        # Our own untaint, written through inside the reconcile of its node: the node
        # itself is not queued again (an echo), the held fault's node is.
        with reconciling(EKS_NODE):
            loop.nodes.upsert(replace(node, resource_version="3", taints=()), "3")
        assert len(loop.queue) == 1 and await loop.queue.get() == GKE_NODE
        assert loop.handlers.echoes_ignored == 1
        # A label change is no quarantine ending: only its node is news.
        loop.queue.done(GKE_NODE)
        loop.nodes.upsert(replace(node, resource_version="4", taints=(), labels={"a": "b"}), "4")
        assert len(loop.queue) == 1 and await loop.queue.get() == EKS_NODE

    asyncio.run(run())
