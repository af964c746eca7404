"""The controller's side of the HTTP API: look nodes up, take signals, list faults,
hand the console its caches."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuheal.api.console.feed import ChangeFeed
from gpuheal.api.console.views import Cluster
from gpuheal.clock import iso
from gpuheal.controller.addresses import NodeFinder
from gpuheal.controller.observed_xids import ObservedXids
from gpuheal.controller.reconciler import Reconciler
from gpuheal.kube.api import ApiError, gpufault_path
from gpuheal.kube.event_cache import EventCache
from gpuheal.kube.events import fault_ref, node_ref
from gpuheal.kube.informer import Store
from gpuheal.kube.projections import decode_fault
from gpuheal.kube.writes import action_entry
from gpuheal.model import ActionEntry, FaultRecord, FaultSignal, NodeView, PodView
from gpuheal.policy import history
from gpuheal.policy import release as releasing
from gpuheal.policy.approval import answer_patch, answers_repair, matching, refusal
from gpuheal.sources import registered
from gpuheal.sources.xids import Observed
from gpuheal.vocabulary import Entry, Reason


@dataclass(frozen=True)
class ConsoleCaches:
    """The informers' maps (each informer keeps one dict for its life), for the console."""

    nodes: Mapping[str, NodeView]
    pods: Mapping[str, PodView]
    records: Mapping[str, FaultRecord]
    events: EventCache | None = None  # gpuheal's own Events (the fault page)
    fence: Callable[[], str] = lambda: ""  # which fence a bad DRA GPU gets, said


@dataclass(frozen=True)
class IntakePort:
    """A pushed source's port into the controller (signals.SignalPort)."""

    source: str
    intake: ControllerIntake

    def submit(self, signal: FaultSignal) -> bool:
        return self.intake.submit(signal)

    def resolve(self, node: str, fault_id: str) -> int:
        return self.intake.resolve(node, fault_id, None)

    def managed(self, node: str) -> bool:
        return self.intake.node_status(node) == "managed"

    def settled(self) -> None:
        self.intake.reconciler.external.settled(self.source)


class ControllerIntake:
    def __init__(
        self,
        reconciler: Reconciler,
        nodes: Store[NodeView],
        records: Store[FaultRecord],
        *,
        enqueue: Callable[[str], None],
        synced: Any,
        leading: Any,
        caches: ConsoleCaches | None = None,
        changes: ChangeFeed | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.nodes = nodes
        self.records = records
        self.enqueue = enqueue  # a signal taken or dropped is news about its node
        self._synced = synced
        self._leading = leading
        self.finder = NodeFinder(nodes, self._managed, index=reconciler.fleet.addresses)
        self.caches = caches or ConsoleCaches({}, {}, {})
        self.changes = changes or ChangeFeed()
        # Xids that are no node fault, from every pushed source: counted, told the pod.
        self.observed = ObservedXids(
            reconciler.metrics,
            reconciler.executor.effects.recorder,
            self.caches.pods.get,
            ttl_s=reconciler.config().external_signal_ttl_seconds,
        )

    def cluster(self) -> Cluster:
        """The caches as they are, for the console: the informers' own maps, read in
        place (the console renders without awaiting), and the fleet's indexes."""
        fleet = self.reconciler.fleet
        events = self.caches.events
        return Cluster(
            nodes=self.caches.nodes,
            pods=self.caches.pods,
            records=self.caches.records,
            pods_by_node=fleet.pods_by_node,
            records_by_node=fleet.records_by_node,
            gpu_nodes=fleet.gpu_nodes,
            quarantined=len(fleet.quarantined),
            config=self.reconciler.config(),
            leading=self.leading(),
            version=self.changes.tag(),
            events_of=events.of if events is not None else lambda _objects: [],
            events_synced=events is not None and events.synced.is_set(),
            fence=self.caches.fence(),
        )

    def synced(self) -> bool:
        return bool(self._synced())

    def leading(self) -> bool:
        return bool(self._leading())

    def _managed(self, node: NodeView | None) -> bool:
        return node is not None and self.reconciler.fleet.managed(node)

    def find_node(self, label: str, value: str) -> str | None:
        return self.finder.find(label, value)

    def port(self, source: str) -> IntakePort:
        """The port of a pushed source of the controller's own: expected from now,
        so its silence ends no fault until it has looked once."""
        self.reconciler.external.expect(source)
        return IntakePort(source, self)

    def node_status(self, name: str) -> str:
        node = self.nodes.get(name)
        if node is None:
            return "unknown"
        return "managed" if self._managed(node) else "unmanaged"

    def submit(self, signal: FaultSignal) -> bool:
        if not registered(signal.source):
            # The plan hears only registered sources: held, it would never be acted on.
            raise ValueError(f"signal from source {signal.source!r}, not in gpuheal.sources")
        if self.reconciler.external.add(signal):
            self.enqueue(signal.node)
            return True
        # A repeat of a signal held already (Alertmanager's repeat_interval, a poller's
        # next look): it only keeps the signal alive, which the node's next look reads
        # (its requeue follows the expiry), so it is no news about the node. Counted
        # here, where it stops, exactly once per repeat.
        self.reconciler.metrics.duplicates_suppressed.labels("signal").inc()
        return False

    def observe(self, seen: Observed, key: str = "") -> bool:
        if not registered(seen.source):
            raise ValueError(f"Xid from source {seen.source!r}, not in gpuheal.sources")
        return self.observed.observe(seen, key)

    def resolve(self, node: str, fault_id: str | None, source: str | None) -> int:
        """Drop signals of `source` (any source with None) for a node: one or all."""
        held = [
            s for s in self.reconciler.external.active(node) if source is None or s.source == source
        ]
        count = sum(
            self.reconciler.external.resolve(node, s.fault_id)
            for s in held
            if fault_id is None or s.fault_id == fault_id
        )
        if count:
            self.enqueue(node)
        return count

    def _one(self, wanted: str) -> FaultRecord | tuple[int, dict[str, Any]]:
        """The record a person means (a name, else a fault id), or (status, body) why not."""
        records = [
            r
            for names in self.reconciler.fleet.records_by_node.values()
            for name in names
            if (r := self.records.get(name)) is not None
        ]
        found = matching(records, wanted)
        if not found:
            return 404, {"error": f"no GPUFault named {wanted!r} or with that fault id"}
        if len(found) > 1:
            names = ", ".join(sorted(r.name for r in found))
            return 409, {"error": f"fault id {wanted!r} names {len(found)} records: {names}"}
        return found[0]

    async def _write_status(
        self, record: FaultRecord, patch: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        """A person's write on the record's status, on the version the patch names
        (so no write of the reconciler's is lost), cached at once: None, or the 409
        to answer when the record changed meanwhile."""
        executor = self.reconciler.executor
        try:
            raw = await executor.effects.api.patch(gpufault_path(record.name, status=True), patch)
        except ApiError as err:
            if err.code != 409:
                raise
            return 409, {"error": f"GPUFault {record.name} changed meanwhile; look again"}
        executor.effects.caches.put_record(decode_fault(raw))
        return None

    async def answer(self, wanted: str, decision: str, by: str) -> tuple[int, dict[str, Any]]:
        """Write a person's answer on a record awaiting approval (the reconciler acts
        on it when the record's update arrives): (HTTP status, body)."""
        record = self._one(wanted)
        if not isinstance(record, FaultRecord):
            return record
        why_not = refusal(record)
        if why_not is not None:
            return 409, {"error": why_not}
        at = iso(dt.datetime.now(dt.UTC))
        conflict = await self._write_status(record, answer_patch(record, decision, by, at))
        if conflict is not None:
            return conflict
        body: dict[str, Any] = {"name": record.name, "node": record.node}
        body |= {"faultId": record.fault_id, "decision": decision, "by": by, "at": at}
        asked = record.repair_approval
        if answers_repair(record) and asked is not None:
            body["repair"] = {"action": asked.action, "attempt": asked.attempt}
        return 200, body

    async def release(self, wanted: str, by: str) -> tuple[int, dict[str, Any]]:
        """Write a person's release on a record the breaker holds (the reconciler
        lets that fault past the breaker once when the record's update arrives):
        (HTTP status, body)."""
        record = self._one(wanted)
        if not isinstance(record, FaultRecord):
            return record
        why_not = releasing.refusal(record)
        if why_not is not None:
            return 409, {"error": why_not}
        at = iso(dt.datetime.now(dt.UTC))
        conflict = await self._write_status(record, releasing.release_patch(record, by, at))
        if conflict is not None:
            return conflict
        body = {"name": record.name, "node": record.node, "faultId": record.fault_id}
        return 200, body | {"released": True, "by": by, "at": at}

    async def acknowledge(self, wanted: str, by: str) -> tuple[int, dict[str, Any]]:
        """Record that a person is on an open fault: an `acknowledged` entry in the
        record (on the version read, so no write of the reconciler's is lost) and
        a `GPUFaultAcknowledged` Event. Nothing else changes. (HTTP status, body)."""
        record = self._one(wanted)
        if not isinstance(record, FaultRecord):
            return record
        if not record.open:
            return 409, {"error": f"GPUFault {record.name} is {record.phase.value}: closed"}
        at = iso(dt.datetime.now(dt.UTC))
        entry = ActionEntry(at, Entry.ACKNOWLEDGED, "ok", f"by {by}")
        patch = {
            "metadata": {"resourceVersion": record.resource_version},
            "status": {"actions": [action_entry(a) for a in history.append(record.actions, entry)]},
        }
        conflict = await self._write_status(record, patch)
        if conflict is not None:
            return conflict
        node = self.nodes.get(record.node)
        self.reconciler.executor.effects.recorder.emit(
            node_ref(record.node, node.uid, node.resource_version)
            if node
            else node_ref(record.node),
            reason=Reason.ACKNOWLEDGED,
            note=f"fault {record.fault_id} acknowledged by {by}",
            action="Acknowledge",
            related=fault_ref(record.name, record.uid, record.resource_version),
        )
        body = {"name": record.name, "node": record.node, "faultId": record.fault_id}
        return 200, body | {"acknowledged": True, "by": by, "at": at}

    def faults(self, node: str | None, limit: int) -> list[dict[str, Any]]:
        names = (
            self.reconciler.fleet.records_by_node.get(node, set())
            if node
            else {n for names in self.reconciler.fleet.records_by_node.values() for n in names}
        )
        records = [r for name in names if (r := self.records.get(name)) is not None]
        # Open faults first, newest first within each group (sorts are stable).
        records.sort(key=lambda r: r.created_at, reverse=True)
        records.sort(key=lambda r: not r.open)
        return [
            {
                "name": r.name,
                "node": r.node,
                "faultId": r.fault_id,
                "phase": r.phase.value,
                "reason": r.reason,
                "severity": r.severity.value,
                "source": r.source,
                "detectedAt": r.detected_at,
                "createdAt": r.created_at,
                "evictedPods": list(r.evicted_pods),
                "open": r.open,
            }
            for r in records[:limit]
        ]
