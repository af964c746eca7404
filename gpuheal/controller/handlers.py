"""Which watch events queue which node (the predicates), and the one rule that
keeps a reconcile from queueing itself: the echo of its own write.

The informers call their handlers synchronously, from the watch (someone's
change) and from upsert() (the write-through of our own writes). The fleet's
indexes and the reconciler's memories handle the same events first (see Fleet);
these handlers only decide what to queue, and only while this replica leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import replace

from gpuheal.controller.fleet import Fleet
from gpuheal.kube.informer import Store
from gpuheal.kube.workqueue import WorkQueue
from gpuheal.model import CanaryView, FaultRecord, FenceView, NodeView, PodView
from gpuheal.policy.validation import ValidationPod

# The node the current task is reconciling. An event about this node seen while it
# is set is the echo of a write the reconcile made itself: that reconcile's answer
# (its requeue) already accounts for it, and queueing the node again would start
# one more reconcile per write (a loop, when each reconcile writes again). Watch
# events arrive in the informers' own tasks, where this is unset: a change anyone
# else makes is always seen.
_RECONCILING: ContextVar[str | None] = ContextVar("gpuheal_reconciling", default=None)

log = logging.getLogger(__name__)


@contextlib.contextmanager
def reconciling(name: str) -> Iterator[None]:
    """While set, events about `name` from this task are our own writes' echoes."""
    token = _RECONCILING.set(name)
    try:
        yield
    finally:
        _RECONCILING.reset(token)


def meaningful_change(old: NodeView | None, new: NodeView | None) -> bool:
    """Ignore updates that only bump the resourceVersion (heartbeats and the like)."""
    if old is None or new is None:
        return True
    return replace(old, resource_version="") != replace(new, resource_version="")


class EventHandlers:
    """Queue the nodes that watch events concern, while `active` (this replica leads)."""

    def __init__(
        self,
        queue: WorkQueue,
        fleet: Fleet,
        records: Store[FaultRecord],
        *,
        external_nodes: Callable[[], list[str]] = list,
    ) -> None:
        self.queue = queue
        self.fleet = fleet
        self.records = records
        self.external_nodes = external_nodes  # nodes holding signals from outside them
        self.active = False
        self.echoes_ignored = 0  # events of our own writes, not queued (for tests)

    def watch(
        self,
        nodes: Store[NodeView],
        pods: Store[PodView],
        records: Store[FaultRecord],
        canaries: Store[CanaryView] | None = None,
        fences: Iterable[Store[FenceView]] = (),
    ) -> None:
        nodes.handlers.append(self.on_node)
        pods.handlers.append(self.on_pod)
        records.handlers.append(self.on_record)
        if canaries is not None:
            canaries.handlers.append(self.on_canary)
        for cache in fences:
            cache.handlers.append(self.on_fence)

    def _enqueue(self, node: str) -> None:
        if _RECONCILING.get() == node:
            self.echoes_ignored += 1
            return
        self.queue.add(node)

    def on_node(self, old: NodeView | None, new: NodeView | None) -> None:
        changed = new or old
        if self.active and changed is not None and meaningful_change(old, new):
            self._enqueue(changed.name)
        if self.active and _untainted(old, new):
            self._held_may_proceed()

    def on_pod(self, old: PodView | None, new: PodView | None) -> None:
        changed = new or old
        if not (self.active and changed and changed.node):
            return
        # Pods matter while their node is being drained, and when their devices' health changes.
        devices_changed = (old.devices if old else ()) != (new.devices if new else ())
        if devices_changed or self.fleet.has_open_record(changed.node, self.records):
            self._enqueue(changed.node)

    def on_canary(self, old: CanaryView | None, new: CanaryView | None) -> None:
        changed = new or old
        if self.active and changed is not None and changed.node:
            self._enqueue(changed.node)

    def on_fence(self, old: FenceView | None, new: FenceView | None) -> None:
        """One of our device fences came or went (ours, or a person's delete): its
        node's device plan compares it with the faults that want it."""
        changed = new or old
        if self.active and changed is not None and changed.node:
            self._enqueue(changed.node)

    def on_validation(self, old: ValidationPod | None, new: ValidationPod | None) -> None:
        """A validation pod moved (scheduled, ended, refused): its node's gate may decide."""
        changed = new or old
        if self.active and changed is not None and changed.node:
            self._enqueue(changed.node)

    def on_record(self, old: FaultRecord | None, new: FaultRecord | None) -> None:
        if new is None and old is not None and not old.open:
            # Retention deleted a closed record: no plan depends on it (the record of
            # a fault still reported is kept), and thousands of deletes must not
            # queue thousands of reconciles ahead of a fault.
            return
        record = new or old
        if self.active and record is not None and record.node:
            self._enqueue(record.node)

    async def resync(self, every: Callable[[], float]) -> None:
        """Every `every()` seconds (resyncSeconds), queue every node the leader looks
        after, from the caches (no API request): a safety net for a change no event
        announced."""
        while True:
            await asyncio.sleep(every())
            if self.active:
                self.enqueue_all()
                log.debug("resync", extra={"queued": len(self.queue)})

    def enqueue_all(self) -> None:
        """Every node the leader looks after: GPU nodes, nodes holding external
        signals, nodes with an open record (level-triggered start and resync)."""
        for name in (*self.fleet.gpu_nodes, *self.external_nodes()):
            self.queue.add(name)
        for node in list(self.fleet.records_by_node):
            if self.fleet.has_open_record(node, self.records):
                self.queue.add(node)

    def _held_may_proceed(self) -> None:
        """Capacity freed: the nodes of held faults are queued now rather than at
        their next retry (whoever's write freed it: their node is not its node)."""
        for record_name in list(self.fleet.held):
            record = self.records.get(record_name)
            if record is not None:
                self.queue.add(record.node)


def _untainted(old: NodeView | None, new: NodeView | None) -> bool:
    """Our taint left a node (untainted, or the node deleted): one quarantine fewer."""
    return old is not None and old.taint() is not None and (new is None or new.taint() is None)
