"""The controller's own writes do not start more work; what others write does.

The write-through of a write a reconcile makes runs the informer handlers
inside that reconcile; queueing the node again there started one more
reconcile per write, and with a refused eviction (each attempt writes the
record) a loop of about 10 evictions and 10 record writes a second.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import cast

from gpuheal.config import Config
from gpuheal.controller.effects.context import WriteThrough
from gpuheal.controller.executor import Executor
from gpuheal.controller.fleet import Fleet
from gpuheal.controller.handlers import EventHandlers, reconciling
from gpuheal.controller.reconciler import Reconciler
from gpuheal.controller.signals import ExternalSignals
from gpuheal.kube.api import KubeApi, gpufault_path, node_path
from gpuheal.kube.events import EventRecorder
from gpuheal.kube.informer import Informer
from gpuheal.kube.projections import FaultJson, NodeJson, PodJson, fault_record, node_view
from gpuheal.kube.workqueue import WorkQueue
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import FaultRecord, NodeView, Phase, PodView
from tests.corpus import EKS_NODE, GKE_NODE


@dataclass
class Loop:
    """The controller's loop over in-memory informers: indexes, handlers, reconciler."""

    reconciler: Reconciler
    handlers: EventHandlers
    fleet: Fleet
    queue: WorkQueue
    external: ExternalSignals
    nodes: Informer[NodeJson, NodeView]


def _reconciler() -> tuple[Loop, Informer[FaultJson, FaultRecord], Informer[PodJson, PodView]]:
    api = cast(KubeApi, None)  # nothing here talks to a server
    config = Config()
    nodes: Informer[NodeJson, NodeView] = Informer(
        api, node_path(), NodeJson, node_view, lambda n: n.name, name="nodes"
    )
    pods: Informer[PodJson, PodView] = Informer(
        api, "/api/v1/pods", PodJson, lambda p: cast(PodView, p), lambda p: p.key, name="pods"
    )
    records: Informer[FaultJson, FaultRecord] = Informer(
        api, gpufault_path(), FaultJson, fault_record, lambda r: r.name, name="gpufaults"
    )
    metrics = ControllerMetrics()
    caches = WriteThrough.over(nodes, records, pods)
    executor = Executor(
        api,
        caches=caches,
        recorder=EventRecorder(api, "unit"),
        metrics=metrics,
        config=lambda: config,
    )
    fleet, queue = Fleet(lambda: config), WorkQueue()
    fleet.watch(nodes, pods, records)
    external = ExternalSignals(config.external_signal_ttl_seconds)
    reconciler = Reconciler(
        config=lambda: config,
        nodes=nodes,
        pods=pods,
        records=records,
        fleet=fleet,
        external=external,
        executor=executor,
        metrics=metrics,
    )
    handlers = EventHandlers(queue, fleet, records, external_nodes=external.nodes)
    handlers.watch(nodes, pods, records)
    handlers.active = True
    return Loop(reconciler, handlers, fleet, queue, external, nodes), records, pods


def _record(node: str, version: str) -> FaultRecord:
    return FaultRecord(f"{node[:20]}-f1", node, "f1", Phase.DRAINING, resource_version=version)


def test_our_own_writes_while_reconciling_a_node_do_not_queue_it_again() -> None:
    async def run() -> None:
        loop, records, pods = _reconciler()
        with reconciling(EKS_NODE):
            records.upsert(_record(EKS_NODE, "10"), "10")  # our status write
            pod = PodView("ml", "trainer-0", "uid-0", EKS_NODE, "Running", "11", gpu=True)
            pods.upsert(pod, "11")
            # Another node's change seen meanwhile is news.
            records.upsert(_record(GKE_NODE, "12"), "12")
        assert loop.handlers.echoes_ignored == 2
        assert len(loop.queue) == 1
        assert await loop.queue.get() == GKE_NODE
        # The same kind of change from anyone else (a watch event, outside any
        # reconcile) queues the node.
        records.upsert(_record(EKS_NODE, "13"), "13")
        assert len(loop.queue) == 1
        assert loop.fleet.records_by_node[EKS_NODE]  # the indexes saw every write

    asyncio.run(run())


def test_retention_deleting_closed_records_queues_no_node() -> None:
    """Thousands of closed records deleted by retention must not queue thousands of
    reconciles ahead of a fault; an open record deleted (by a person) is news."""

    async def run() -> None:
        loop, records, _ = _reconciler()
        closed = replace(_record(EKS_NODE, "20"), phase=Phase.RESOLVED)
        records.upsert(closed, "20")
        loop.queue.done(await loop.queue.get())  # its creation was news
        records._apply(closed.name, None, "21")  # the watch's DELETED event
        assert len(loop.queue) == 0
        assert (
            EKS_NODE not in loop.fleet.records_by_node or not (loop.fleet.records_by_node[EKS_NODE])
        )
        opened = _record(GKE_NODE, "22")
        records.upsert(opened, "22")
        loop.queue.done(await loop.queue.get())
        records._apply(opened.name, None, "23")
        assert len(loop.queue) == 1

    asyncio.run(run())
