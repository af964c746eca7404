"""Reconcile one node: gather its state from the caches, plan, execute.

Also keeps the fleet-wide facts the breaker needs (GPU nodes, quarantined
nodes) up to date from informer events, and decides which events enqueue
which node.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import replace

from gpuheal import values
from gpuheal.config import Config
from gpuheal.controller.devices import DeviceReports
from gpuheal.controller.executor import Executor, Outcome, Replan
from gpuheal.controller.leaving import LeavingPods
from gpuheal.controller.notices import notice_for
from gpuheal.controller.notify import Notice
from gpuheal.controller.signals import ExternalSignals
from gpuheal.kube.events import node_ref
from gpuheal.kube.informer import Store
from gpuheal.kube.workqueue import WorkQueue
from gpuheal.metrics import ControllerMetrics
from gpuheal.model import (
    MANAGED_LABEL,
    CanaryView,
    FaultRecord,
    Mode,
    NodeView,
    Phase,
    PodView,
)
from gpuheal.policy.backoff import Blocked, refused_again
from gpuheal.policy.dedupe import BoundedSet, TtlSet
from gpuheal.policy.devices import (
    DeviceAction,
    DevicePlan,
    DeviceState,
    escalation_signal,
    plan_devices,
)
from gpuheal.policy.nodes import gpu_node, in_maintenance
from gpuheal.policy.plan import (
    Action,
    AddTaint,
    DeletePod,
    Evict,
    NodeState,
    Plan,
    current_signal,
    plan,
    plan_node_gone,
)
from gpuheal.policy.pools import driver_version, pool_of
from gpuheal.policy.ratelimit import TokenBucket
from gpuheal.policy.signals import fault_signal

log = logging.getLogger(__name__)

# The Warning Event on a node with GPUs outside the nodeSelector that reports a fault.
UNMANAGED = "GPUNodeUnmanaged"

# The node the current task is reconciling. The informers call their handlers
# synchronously from upsert(), the write-through of our own writes, so an event
# about this node seen while it is set is the echo of a write the reconcile made
# itself: that reconcile's answer (its requeue) already accounts for it, and
# queueing the node again would start one more reconcile per write (a loop, when
# each reconcile writes again). Watch events arrive in the informers' own tasks,
# where this is unset: a change anyone else makes is always seen.
_RECONCILING: ContextVar[str | None] = ContextVar("gpuheal_reconciling", default=None)


class Fleet:
    """Indexes over the caches, kept current by informer handlers."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.gpu_nodes: set[str] = set()
        # Nodes with GPUs that the nodeSelector does not match (and not opted out):
        # their faults do nothing, which must not go unsaid.
        self.unmanaged: set[str] = set()
        self.quarantined: set[str] = set()
        self.pods_by_node: dict[str, set[str]] = defaultdict(set)
        self.records_by_node: dict[str, set[str]] = defaultdict(set)
        self.held: set[str] = set()  # record names in phase Held
        # Driver versions per pool, for the health gate: node -> (pool, version),
        # and per pool the count of each version.
        self.driver_of: dict[str, tuple[str, str]] = {}
        self.pool_drivers: dict[str, Counter[str]] = defaultdict(Counter)

    def selected(self, node: NodeView) -> bool:
        return gpu_node(node.labels, node.gpus, self.config)

    def has_gpus(self, node: NodeView) -> bool:
        """GPU capacity (nvidia.com/gpu), or allocatable GPU resources (MIG profiles)."""
        return node.gpus > 0 or any(
            n > 0 and self.config.is_gpu_resource(name) for name, n in node.allocatable
        )

    def unmanaged_gpu_node(self, node: NodeView) -> bool:
        return (
            not self.selected(node)
            and node.labels.get(MANAGED_LABEL) != "false"
            and self.has_gpus(node)
        )

    def on_node(self, old: NodeView | None, new: NodeView | None) -> None:
        if new is None:
            if old is not None:
                self.gpu_nodes.discard(old.name)
                self.unmanaged.discard(old.name)
                self.quarantined.discard(old.name)
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
        # Only the fault taint counts for the breaker: a node in maintenance carries
        # the maintenance taint, which is a person's decision, not a fault.
        if new.taint() is not None and new.name in self.gpu_nodes:
            self.quarantined.add(new.name)
        else:
            self.quarantined.discard(new.name)
        version = driver_version(new.labels, new.annotations)
        selected = new.name in self.gpu_nodes and version
        self._note_driver(
            new.name, (pool_of(new.labels, self.config), version) if selected else None
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
        counts = Counter(self.pool_drivers.get(pool_of(node.labels, self.config), {}))
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


def _taint_at(decided: Plan) -> int:
    """Where the plan's AddTaint is (its length if there is none)."""
    return next(
        (i for i, a in enumerate(decided.actions) if isinstance(a, AddTaint)),
        len(decided.actions),
    )


def _not_in(actions: tuple[Action, ...], done: tuple[Action, ...]) -> tuple[Action, ...]:
    """The actions of a plan made again within one pass, less those the pass already
    ran: their record writes are gathered for its end, so the caches (and the plan
    made again from them) do not show them yet. The plans share their `now`, so an
    action already run is equal to its repeat."""
    return tuple(a for a in actions if a not in done)


def _meaningful_change(old: NodeView | None, new: NodeView | None) -> bool:
    """Ignore updates that only bump the resourceVersion (heartbeats and the like)."""
    if old is None or new is None:
        return True
    return replace(old, resource_version="") != replace(new, resource_version="")


class Reconciler:
    def __init__(
        self,
        *,
        config: Config,
        nodes: Store[NodeView],
        pods: Store[PodView],
        records: Store[FaultRecord],
        queue: WorkQueue,
        executor: Executor,
        metrics: ControllerMetrics,
        notify: Callable[[Notice], None] = lambda _: None,
        canaries: Mapping[str, CanaryView] | None = None,
        pods_synced: Callable[[], bool] = lambda: True,
    ) -> None:
        self.config = config
        self.nodes = nodes
        self.pods = pods
        self.records = records
        self.queue = queue
        self.executor = executor
        self.metrics = metrics
        self.notify = notify
        self.fleet = Fleet(config)
        self.memory = TtlSet(config.dedupe_ttl_seconds)
        # Faults of unmanaged GPU nodes already reported (node/fault id), bounded.
        self.unmanaged_told = BoundedSet(10_000)
        self.bucket = TokenBucket.full(
            config.rate_limit_per_second, config.rate_limit_burst, time.monotonic()
        )
        # Per node: its pods whose eviction was refused, and when to try each again.
        self.blocked: dict[str, dict[str, Blocked]] = defaultdict(dict)
        self.leaving = LeavingPods()
        self.echoes_ignored = 0  # events of our own writes, not queued (for tests)
        self.external = ExternalSignals(config.external_signal_ttl_seconds)
        self.canaries: Mapping[str, CanaryView] = canaries if canaries is not None else {}
        self.device_reports = DeviceReports(pods_synced)
        # Per node: the eviction rate limit of partial drains, and the device counts.
        self.device_buckets: dict[str, TokenBucket] = {}
        self.device_counts: dict[str, tuple[int, int, int]] = {}
        self.active = False  # only the leader enqueues work
        self._breaker_lock = asyncio.Lock()
        nodes.handlers.append(self._on_node)
        pods.handlers.append(self._on_pod)
        records.handlers.append(self._on_record)

    # -- event routing -------------------------------------------------------

    @contextlib.contextmanager
    def reconciling(self, name: str) -> Iterator[None]:
        """While set, events about `name` from this task are our own writes' echoes."""
        token = _RECONCILING.set(name)
        try:
            yield
        finally:
            _RECONCILING.reset(token)

    def _enqueue(self, node: str) -> None:
        if _RECONCILING.get() == node:
            self.echoes_ignored += 1
            return
        self.queue.add(node)

    def _on_node(self, old: NodeView | None, new: NodeView | None) -> None:
        self.fleet.on_node(old, new)
        self._update_gauges()
        changed = new or old
        if self.active and changed is not None and _meaningful_change(old, new):
            self._enqueue(changed.name)

    def _on_pod(self, old: PodView | None, new: PodView | None) -> None:
        self.fleet.on_pod(old, new)
        self.leaving.on_pod(old, new)
        self.device_reports.on_pod(old, new)
        changed = new or old
        if not (self.active and changed and changed.node):
            return
        # Pods matter while their node is being drained, and when their devices' health changes.
        devices_changed = (old.devices if old else ()) != (new.devices if new else ())
        if devices_changed or self._has_open_record(changed.node):
            self._enqueue(changed.node)

    def on_canary(self, old: CanaryView | None, new: CanaryView | None) -> None:
        changed = new or old
        if self.active and changed is not None and changed.node:
            self._enqueue(changed.node)

    def _on_record(self, old: FaultRecord | None, new: FaultRecord | None) -> None:
        self.fleet.on_record(old, new)
        self._update_gauges()
        if new is None and old is not None and not old.open:
            # Retention deleted a closed record: no plan depends on it (the record of
            # a fault still reported is kept), and thousands of deletes must not
            # queue thousands of reconciles ahead of a fault.
            return
        record = new or old
        if self.active and record is not None and record.node:
            self._enqueue(record.node)

    def reported_faults(self, name: str) -> tuple[str, ...]:
        """The fault ids the node reports now: its own, and active external signals."""
        node = self.nodes.get(name)
        own = fault_signal(node, self.config) if node is not None else None
        return (
            *((own.fault_id,) if own is not None else ()),
            *(s.fault_id for s in self.external.active(name)),
        )

    def _has_open_record(self, node: str) -> bool:
        return any(
            (r := self.records.get(name)) is not None and r.open
            for name in self.fleet.records_by_node.get(node, ())
        )

    def _update_gauges(self) -> None:
        self.metrics.quarantined_nodes.set(len(self.fleet.quarantined))
        self.metrics.unmanaged_gpu_nodes.set(len(self.fleet.unmanaged))
        self.metrics.held_faults.set(len(self.fleet.held))
        self.metrics.queue_depth.set(len(self.queue))

    def enqueue_all(self) -> None:
        for name in (*self.fleet.gpu_nodes, *self.external.nodes()):
            self.queue.add(name)
        for node in list(self.fleet.records_by_node):
            if self._has_open_record(node):
                self.queue.add(node)

    # -- reconcile ------------------------------------------------------------

    def state_of(self, node: NodeView) -> NodeState:
        pods = tuple(
            self.leaving.seen(p)
            for key in self.fleet.pods_by_node.get(node.name, ())
            if (p := self.pods.get(key))
        )
        records = self._records_of(node.name)
        # Device faults that escalated stand for one node-level fault of the node plan.
        escalated = escalation_signal(records) if self.config.device_health.enabled else None
        return NodeState(
            node=node,
            pods=pods,
            records=tuple(r for r in records if not r.device_scope),
            gpu_nodes=len(self.fleet.gpu_nodes),
            quarantined=frozenset(self.fleet.quarantined),
            blocked=dict(self.blocked.get(node.name, {})),
            external=(*self.external.active(node.name), *((escalated,) if escalated else ())),
            pool_drivers=self.fleet.drivers_besides(node),
        )

    def _records_of(self, node: str) -> tuple[FaultRecord, ...]:
        return tuple(
            r for name in self.fleet.records_by_node.get(node, ()) if (r := self.records.get(name))
        )

    def device_state_of(self, node: NodeView) -> DeviceState:
        keys = self.fleet.pods_by_node.get(node.name, ())
        bucket = self._device_bucket(node.name)
        return DeviceState(
            node=node,
            entries=self.device_reports.entries(keys),
            records=self._records_of(node.name),
            canaries={k: c for k, c in self.canaries.items() if c.node == node.name},
            evictions_allowed=int(bucket.tokens),
        )

    def _device_bucket(self, node: str) -> TokenBucket:
        cfg = self.config.device_health
        now = time.monotonic()
        bucket = self.device_buckets.get(node) or TokenBucket.full(
            cfg.evictions_per_minute / 60.0, cfg.eviction_burst, now
        )
        self.device_buckets[node] = bucket = bucket.refill(now)
        return bucket

    async def reconcile(self, name: str) -> float | None:
        """Returns the seconds after which to look at this node again, or None."""
        started = time.monotonic()
        try:
            with self.reconciling(name):
                again = await self._reconcile(name)
            # An external signal's expiry is a change no event will announce.
            expiry = self.external.expires_in(name)
            return again if expiry is None else min(expiry, again if again is not None else expiry)
        finally:
            self.metrics.reconcile_duration.observe(time.monotonic() - started)
            self._update_gauges()

    async def _reconcile(self, name: str) -> float | None:
        """Devices first (their records may escalate to the node), then the node."""
        now = dt.datetime.now(dt.UTC)
        node = self.nodes.get(name)
        if node is None:
            await self._close_records_of_deleted_node(name, now)
            self._forget_devices(name)
            self.blocked.pop(name, None)
            return None
        devices_again = await self._reconcile_devices(node, now)
        node = self.nodes.get(name) or node  # our device marks are on it now (write-through)
        node_again = await self._reconcile_node(node, now)
        if devices_again is None or node_again is None:
            return node_again if devices_again is None else devices_again
        return min(devices_again, node_again)

    async def _reconcile_devices(self, node: NodeView, now: dt.datetime) -> float | None:
        if not (self.config.device_health.enabled and self.fleet.selected(node)):
            return None
        if in_maintenance(node.labels):
            return None  # devices misbehave while people work on them: not faults
        state = self.device_state_of(node)
        decided = plan_devices(state, self.config, now)
        self._device_metrics(node.name, decided)
        if not decided.actions:
            return decided.requeue_after
        if decided.evictions:
            bucket = self.device_buckets[node.name]
            self.device_buckets[node.name] = replace(
                bucket, tokens=bucket.tokens - decided.evictions
            )
        try:
            outcome = await self.executor.run(decided, NodeState(node=node))
        except Replan as why:
            log.info("replanning devices", extra={"node": node.name, "why": str(why)})
            return 0.0
        self._notify(node.name, decided.fault_id, decided.actions, outcome)
        if outcome.blocked:
            return self.queue.add_rate_limited(node.name)
        return decided.requeue_after

    def _device_metrics(self, name: str, decided: DevicePlan) -> None:
        summary = decided.summary
        for age in summary.report_ages:
            self.metrics.device_report_age.observe(age)
        for waited in summary.unknown_for:
            self.metrics.device_unknown_duration.observe(waited)
        self.device_counts[name] = (summary.unknown, summary.suspect, summary.quarantined)
        self._device_gauges()

    def _device_gauges(self) -> None:
        counts = self.device_counts.values()
        self.metrics.devices_unknown.set(sum(c[0] for c in counts))
        self.metrics.devices_suspect.set(sum(c[1] for c in counts))
        self.metrics.devices_quarantined.set(sum(c[2] for c in counts))

    def _forget_devices(self, name: str) -> None:
        self.device_buckets.pop(name, None)
        if self.device_counts.pop(name, None) is not None:
            self._device_gauges()

    async def _reconcile_node(self, node: NodeView, now: dt.datetime) -> float | None:
        decision = self._decide(node, now)
        if decision is None:
            return None
        decided, _ = decision
        if decided.new_quarantine:
            return await self._quarantine(decision, now)
        if not decided.actions:
            return decided.requeue_after
        return await self._execute(decision, now)

    async def _quarantine(self, decision: tuple[Plan, NodeState], now: dt.datetime) -> float | None:
        """Breaker check and taint are one atomic step across workers.

        The record comes first, outside the lock: it is the fault's own exactly-once
        lock and uses none of the breaker's budget, so workers create records side
        by side. Under the lock the plan is made again from the caches, which hold
        every taint placed so far (write-through), so concurrent faults can never
        quarantine more nodes than the breaker allows; only the taint itself is
        written there (a full breaker turns the new record Held instead).
        The record's status and the Events are written after the taint, with the
        rest of the pass: nothing but the record and the taint comes before the
        fence. Evictions run after the lock.
        """
        pass_ = Outcome()
        try:
            again = await self._fence(decision, now, pass_)
        except Exception:
            await self.executor.flush_after_failure(pass_, decision[1])
            raise
        await self.executor.flush(pass_, decision[1])  # what a cut-short pass decided
        return again

    async def _fence(
        self, decision: tuple[Plan, NodeState], now: dt.datetime, pass_: Outcome
    ) -> float | None:
        decided, state = decision
        name = state.node.name
        first = decided.actions[: _taint_at(decided)]
        try:
            await self.executor.run(decided, state, first, pass_, flush=False)
        except Replan as why:
            log.info("replanning", extra={"node": name, "why": str(why)})
            return 0.0
        async with self._breaker_lock:
            node = self.nodes.get(name)
            again = self._decide(node, now) if node else None
            if again is None:
                return None
            decided, state = again
            cut, outcome = 0, None
            if decided.new_quarantine:
                self.bucket, wait = self.bucket.take(time.monotonic())
                if wait > 0:
                    log.info("rate limited", extra={"node": name, "wait_s": round(wait, 3)})
                    return wait
                cut = _taint_at(decided) + 1
                try:
                    outcome = await self.executor.run(
                        decided, state, _not_in(decided.actions[:cut], first), pass_, flush=False
                    )
                except Replan as why:
                    log.info("replanning", extra={"node": name, "why": str(why)})
                    return 0.0
        rest = _not_in(decided.actions[cut:], first)
        if outcome is None:
            # Not a new quarantine any more (the breaker filled: Held): an ordinary plan.
            return await self._execute(again, now, rest, pass_, done=first)
        # Fence first, drain after: the taint's record update and Event now, the
        # evictions on the node's next turn in the queue, so that in a storm every
        # faulty node is tainted before any worker spends its time evicting.
        drain_at = next(
            (i for i, a in enumerate(rest) if isinstance(a, Evict | DeletePod)), len(rest)
        )
        requeue = await self._execute(
            again, now, rest[:drain_at], outcome, done=first + decided.actions[:cut]
        )
        return 0.0 if drain_at < len(rest) else requeue

    def _decide(self, node: NodeView, now: dt.datetime) -> tuple[Plan, NodeState] | None:
        """The plan for a managed node, or None when the node needs nothing."""
        if not self.fleet.selected(node):
            self._unmanaged_fault(node)
            return None
        state = self.state_of(node)
        signal = current_signal(state, self.config)
        if signal and self._remembered(node, signal.fault_id, signal.reason):
            self.metrics.duplicates_suppressed.labels("memory").inc()
            return None
        decided = plan(state, self.config, now)
        self._note_suppressed(decided, node.name)
        return decided, state

    def _unmanaged_fault(self, node: NodeView) -> None:
        """A node with GPUs outside the nodeSelector reports a fault: nothing will be
        done about it, and that is said once per fault (a Warning Event on the node
        and a log line), not silently dropped."""
        if node.name not in self.fleet.unmanaged:
            return
        signal = current_signal(NodeState(node=node), self.config)
        if signal is None or not self.unmanaged_told.add(f"{node.name}/{signal.fault_id}"):
            return
        selector = ",".join(f"{k}={v}" for k, v in sorted(self.config.node_selector.items()))
        log.warning(
            "fault on an unmanaged GPU node",
            extra={"node": node.name, "fault_id": signal.fault_id, "reason": signal.reason},
        )
        self.executor.recorder.emit(
            node_ref(node.name, node.uid, node.resource_version),
            reason=UNMANAGED,
            note=f"{signal.reason} (fault {signal.fault_id}, {signal.source}) reported on a "
            f"node with GPUs that nodeSelector {selector} does not match: gpuheal does not "
            "act on it; label the node to match, or set gpuheal.io/managed=false to "
            "exclude it knowingly",
            action="Ignore",
            warning=True,
        )

    def _remembered(self, node: NodeView, fault_id: str, reason: str) -> bool:
        """Handled recently and nothing about it changed since: skip without planning.

        Only while our taint for this fault is still on the node (or the fault is
        observe-only): a person's untaint must still reach the policy to be noted.
        """
        if not self.memory.contains(f"{node.name}/{fault_id}", time.monotonic()):
            return False
        taint = node.taint()
        observe = self.config.mode_for(reason) is Mode.OBSERVE
        return observe or (taint is not None and taint.value == values.taint_value(fault_id))

    async def _close_records_of_deleted_node(self, name: str, now: dt.datetime) -> None:
        records = tuple(
            r for n in self.fleet.records_by_node.get(name, ()) if (r := self.records.get(n))
        )
        gone = plan_node_gone(records, now)
        if gone.actions:
            await self.executor.run(gone, NodeState(node=NodeView(name, "")))

    async def _execute(
        self,
        decision: tuple[Plan, NodeState],
        now: dt.datetime,
        actions: tuple[Action, ...] | None = None,
        outcome: Outcome | None = None,
        *,
        done: tuple[Action, ...] = (),
    ) -> float | None:
        """Run the plan's `actions` (default all); `done`: what the caller already ran
        of this remediation step, for the notification."""
        decided, state = decision
        name = state.node.name
        actions = decided.actions if actions is None else actions
        try:
            outcome = await self.executor.run(decided, state, actions, outcome)
        except Replan as why:
            log.info("replanning", extra={"node": name, "why": str(why)})
            return 0.0
        self._after(name, decided, done + actions, outcome, now)
        # A refused eviction is not a failed reconcile: its backoff is the pod's own
        # (self.blocked, planned by the policy), not the queue's failure count.
        self.queue.forget(name)
        return decided.requeue_after

    def _notify(
        self,
        name: str,
        fault_id: str,
        ran: tuple[Action | DeviceAction, ...],
        outcome: Outcome,
    ) -> None:
        """Tell the sinks about one remediation step, node or device."""
        notice = notice_for(name, ran, outcome, self.records.get, fault_id)
        if notice is not None:
            self.notify(notice)

    def _note_suppressed(self, decided: Plan, name: str) -> None:
        if decided.suppressed in ("handled", "cooldown"):
            self.metrics.duplicates_suppressed.labels(decided.suppressed).inc()
        if decided.suppressed:
            log.debug(
                "suppressed",
                extra={"node": name, "fault_id": decided.fault_id, "why": decided.suppressed},
            )

    def apply_config(self, config: Config) -> None:
        """Take a reloaded config (mode switch, thresholds, limits) without a restart."""
        self.config = config
        self.fleet.config = config
        self.executor.config = config
        self.queue.set_backoff(
            config.eviction_retry_base_seconds, config.eviction_retry_max_seconds
        )
        self.memory.ttl = config.dedupe_ttl_seconds
        self.external.ttl_s = config.external_signal_ttl_seconds
        self.device_buckets.clear()  # new eviction rates apply from a full bucket
        self.bucket = replace(
            self.bucket, rate=config.rate_limit_per_second, burst=config.rate_limit_burst
        )

    def _after(
        self,
        name: str,
        decided: Plan,
        ran: tuple[Action, ...],
        outcome: Outcome,
        now: dt.datetime,
    ) -> None:
        blocked = self.blocked[name]
        for key in outcome.blocked:
            blocked[key] = refused_again(
                blocked.get(key),
                decided.fault_id,
                now,
                outcome.blocked_by.get(key, ""),
                base=self.config.eviction_retry_base_seconds,
                cap=self.config.eviction_retry_max_seconds,
            )
        on_node = self.fleet.pods_by_node.get(name, set())
        for key in [k for k in blocked if k not in on_node]:
            del blocked[key]  # left by other means (a person, its controller)
        for key in (*outcome.evicted, *outcome.gone):
            blocked.pop(key, None)
        for key, uid in outcome.left.items():
            self.leaving.add(key, uid)
        if not blocked:
            self.blocked.pop(name, None)
        if outcome.handled:
            self.memory.add(f"{name}/{decided.fault_id}", time.monotonic())
        self._notify(name, decided.fault_id, ran, outcome)
        if outcome.untainted:
            # Capacity freed: held faults may proceed now rather than at their next retry.
            for record_name in list(self.fleet.held):
                record = self.records.get(record_name)
                if record is not None:
                    self.queue.add(record.node)
        self.metrics.breaker_open.set(1 if self.fleet.held else 0)
