"""The fleet's indexes over the informer caches, kept current by their change
handlers: which nodes are GPU nodes, quarantined or unmanaged; each node's pods
and GPUFault records; held faults; driver versions per pool; nodes by address.

Facts the breaker and the health gate need about the whole fleet, and lookups
that would otherwise scan every cache on every reconcile or alert.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Callable

from gpuheal.clock import parse_time
from gpuheal.config import Config
from gpuheal.controller.addresses import AddressIndex
from gpuheal.kube.informer import Store
from gpuheal.model import MAINTENANCE_ROLLOUT, FaultRecord, NodeView, Phase, PodView
from gpuheal.policy.nodes import gpu_node, gpus, in_maintenance, managed, opted_out
from gpuheal.policy.pools import driver_version, pool_of
from gpuheal.policy.repair import in_flight


class Fleet:
    """Indexes over the caches; `config` is read when an event comes (a reloaded
    nodeSelector applies to the nodes' next events)."""

    def __init__(self, config: Callable[[], Config]) -> None:
        self.config = config
        self.gpu_nodes: set[str] = set()
        # Nodes with GPUs that the nodeSelector does not match (and not opted out):
        # their faults do nothing, which must not go unsaid.
        self.unmanaged: set[str] = set()
        self.quarantined: set[str] = set()
        # GPU nodes a roll-out (`gpuheal rollout`) has in maintenance: the breaker counts
        # them, so that faults and a roll-out together stay within its budget.
        self.rolling: set[str] = set()
        self.pods_by_node: dict[str, set[str]] = defaultdict(set)
        self.records_by_node: dict[str, set[str]] = defaultdict(set)
        self.held: set[str] = set()  # record names in phase Held
        # Nodes with a repair request their agent has not answered (the repair budget).
        # node -> the request's time.
        # Node -> its request in flight: when it was asked for, and which repair.
        self.repairing: dict[str, tuple[dt.datetime, str]] = {}
        # Driver versions per pool, for the health gate: node -> (pool, version),
        # and per pool the count of each version.
        self.driver_of: dict[str, tuple[str, str]] = {}
        self.pool_drivers: dict[str, Counter[str]] = defaultdict(Counter)
        # Every node by name and address, for alerts that name a scrape target.
        self.addresses = AddressIndex()

    def watch(
        self, nodes: Store[NodeView], pods: Store[PodView], records: Store[FaultRecord]
    ) -> None:
        """Keep the indexes current: called before anything else that handles the
        same events, so that those handlers see them current."""
        nodes.handlers.append(self.on_node)
        pods.handlers.append(self.on_pod)
        records.handlers.append(self.on_record)

    def selected(self, node: NodeView) -> bool:
        config = self.config()
        return gpu_node(node.labels, gpus(node, config), config)

    def managed(self, node: NodeView) -> bool:
        """Acted on: selected and not opted out (policy/nodes.py::managed)."""
        config = self.config()
        return managed(node.labels, gpus(node, config), config)

    def has_gpus(self, node: NodeView) -> bool:
        """GPU capacity of any GPU resource (whole GPUs or MIG profiles), or DRA devices."""
        return gpus(node, self.config()) > 0

    def unmanaged_gpu_node(self, node: NodeView) -> bool:
        return not self.selected(node) and not opted_out(node.labels) and self.has_gpus(node)

    def on_node(self, old: NodeView | None, new: NodeView | None) -> None:
        self.addresses.on_node(old, new)
        if new is None:
            if old is not None:
                self.gpu_nodes.discard(old.name)
                self.unmanaged.discard(old.name)
                self.quarantined.discard(old.name)
                self.rolling.discard(old.name)
                self.repairing.pop(old.name, None)
                self._note_driver(old.name, None)
            return
        if self.selected(new):
            self.gpu_nodes.add(new.name)
        else:
            self.gpu_nodes.discard(new.name)
        if self.unmanaged_gpu_node(new):
            self.unmanaged.add(new.name)
        else:
            self.unmanaged.discard(new.name)
        # The fault taint counts for the breaker, and a roll-out's maintenance; a
        # person's one maintenance (the maintenance taint alone) is their decision.
        if new.taint() is not None and new.name in self.gpu_nodes:
            self.quarantined.add(new.name)
        else:
            self.quarantined.discard(new.name)
        if (
            new.name in self.gpu_nodes
            and in_maintenance(new.labels)
            and new.annotations.get(MAINTENANCE_ROLLOUT)
        ):
            self.rolling.add(new.name)
        else:
            self.rolling.discard(new.name)
        request = in_flight(new.annotations)
        if request is not None:
            asked = parse_time(request.time) or dt.datetime.now(dt.UTC)
            self.repairing[new.name] = (asked, request.action.value)
        else:
            self.repairing.pop(new.name, None)
        version = driver_version(new.labels, new.annotations)
        selected = new.name in self.gpu_nodes and version
        self._note_driver(
            new.name, (pool_of(new.labels, self.config()), version) if selected else None
        )

    def _note_driver(self, node: str, entry: tuple[str, str] | None) -> None:
        old = self.driver_of.pop(node, None)
        if old is not None:
            counts = self.pool_drivers[old[0]]
            counts[old[1]] -= 1
            if counts[old[1]] <= 0:
                del counts[old[1]]
            if not counts:
                del self.pool_drivers[old[0]]
        if entry is not None:
            self.driver_of[node] = entry
            self.pool_drivers[entry[0]][entry[1]] += 1

    def drivers_besides(self, node: NodeView) -> dict[str, int]:
        """Driver versions of the other nodes of the node's pool: version -> nodes."""
        counts = Counter(self.pool_drivers.get(pool_of(node.labels, self.config()), {}))
        own = self.driver_of.get(node.name)
        if own is not None:
            counts[own[1]] -= 1
        return {version: n for version, n in counts.items() if n > 0}

    def on_pod(self, old: PodView | None, new: PodView | None) -> None:
        if old is not None and old.node and (new is None or new.node != old.node):
            self.pods_by_node[old.node].discard(old.key)
            if not self.pods_by_node[old.node]:
                del self.pods_by_node[old.node]
        if new is not None and new.node:
            self.pods_by_node[new.node].add(new.key)

    def on_record(self, old: FaultRecord | None, new: FaultRecord | None) -> None:
        if old is not None and (new is None or new.node != old.node):
            self.records_by_node[old.node].discard(old.name)
        if new is not None:
            self.records_by_node[new.node].add(new.name)
            if new.phase is Phase.HELD:
                self.held.add(new.name)
            else:
                self.held.discard(new.name)
        elif old is not None:
            self.held.discard(old.name)

    def repairing_at(self, now: dt.datetime, timeout_s: Callable[[str], float]) -> frozenset[str]:
        """Nodes with a repair in flight: requested, unanswered, and not past its
        action's result timeout (a silent agent must not hold the budget for ever)."""
        return frozenset(
            n
            for n, (at, action) in self.repairing.items()
            if at >= now - dt.timedelta(seconds=timeout_s(action))
        )

    def records_of(self, node: str, records: Store[FaultRecord]) -> tuple[FaultRecord, ...]:
        """The node's records, as the cache holds them now."""
        return tuple(
            r for name in self.records_by_node.get(node, ()) if (r := records.get(name)) is not None
        )

    def has_open_record(self, node: str, records: Store[FaultRecord]) -> bool:
        return any(
            (r := records.get(name)) is not None and r.open
            for name in self.records_by_node.get(node, ())
        )
