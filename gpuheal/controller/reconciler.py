"""Reconcile one node: gather its state from the caches, plan, have the plan
carried out, and answer what the queue should do about it next (a Result).

Which events queue a node is the event handlers' (handlers.py); the fleet's
indexes are Fleet's (fleet.py); the queue's bookkeeping is the worker's
(worker.py); what to do, in which steps and under which guard, is the policy's
(policy/plan/), decided once per look; carrying the steps out is the runner's
(runner.py). What is left here is the state the policy reads and this process's
memories of what was done (refused evictions, pods leaving, faults handled).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from gpuheal import values
from gpuheal.config import Config
from gpuheal.controller.devices import DeviceReports
from gpuheal.controller.effects.context import PassOutcome, Replan
from gpuheal.controller.executor import Executor
from gpuheal.controller.fleet import Fleet
from gpuheal.controller.handlers import reconciling
from gpuheal.controller.leaving import LeavingPods
from gpuheal.controller.notices import notice_for
from gpuheal.controller.notify import Notice
from gpuheal.controller.result import DONE, Result
from gpuheal.controller.runner import AT_ONCE, Runner
from gpuheal.controller.signals import ExternalSignals
from gpuheal.kube.events import ObjectRef, node_ref, pod_ref
from gpuheal.kube.informer import Store
from gpuheal.kube.rollouts import RolloutState
from gpuheal.metrics.controller import ControllerMetrics, DeviceCounts
from gpuheal.model import CanaryView, FaultRecord, NodeView, PodView
from gpuheal.policy import agentdevice
from gpuheal.policy.actions import Action, NodeState, Plan
from gpuheal.policy.backoff import Blocked, refused_again
from gpuheal.policy.dedupe import BoundedSet
from gpuheal.policy.devicefence import Fences
from gpuheal.policy.devices import DeviceAction, DevicePlan, DeviceState, plan_devices
from gpuheal.policy.drivertaints import DriverReport
from gpuheal.policy.drivertaints import reports as driver_reports
from gpuheal.policy.nodes import in_maintenance
from gpuheal.policy.plan import current_signal, plan, plan_node_gone, reported
from gpuheal.policy.pools import NO_POOL, pool_of
from gpuheal.policy.ratelimit import TokenBucket
from gpuheal.policy.recent import HandledFaults
from gpuheal.policy.rollout import RolloutDriver, rollout_name
from gpuheal.policy.unreadable import Unreadable, unreadable, unreadable_pod
from gpuheal.policy.validation import ValidationPod
from gpuheal.sources import Seen
from gpuheal.vocabulary import Reason

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self,
        *,
        config: Callable[[], Config],
        nodes: Store[NodeView],
        pods: Store[PodView],
        records: Store[FaultRecord],
        fleet: Fleet,
        external: ExternalSignals,
        executor: Executor,
        metrics: ControllerMetrics,
        notify: Callable[[Notice], None] = lambda _: None,
        canaries: Mapping[str, CanaryView] | None = None,
        pods_synced: Callable[[], bool] = lambda: True,
        rollouts: Store[RolloutState] | None = None,
        validations: Callable[[], Iterable[ValidationPod]] = tuple,
        fences: Callable[[str], Fences] = lambda _node: Fences(),
    ) -> None:
        self.config = config  # the controller's current config, read where needed
        self.nodes = nodes
        self.pods = pods
        self.records = records
        self.fleet = fleet
        self.external = external
        self.executor = executor
        self.metrics = metrics
        self.notify = notify
        # Faults this process marked handled lately (the recently-handled rule's memory).
        self.handled = HandledFaults()
        # Faults of unmanaged GPU nodes already reported (node/fault id), bounded.
        self.unmanaged_told = BoundedSet(10_000)
        self.reused_told = BoundedSet(10_000)  # node/fault id reported again, said once
        self.unreadable_told = BoundedSet(10_000)  # node/annotation/value, said once
        first = config()
        self.bucket = TokenBucket.full(
            first.rate_limit_per_second, first.rate_limit_burst, time.monotonic()
        )
        # Per node: its pods whose eviction was refused, and when to try each again.
        self.blocked: dict[str, dict[str, Blocked]] = defaultdict(dict)
        self.leaving = LeavingPods()
        self.canaries: Mapping[str, CanaryView] = canaries if canaries is not None else {}
        self.fences = fences  # a node's device fences (DeviceTaintRules), and if any can be
        # GPURollouts by name: the gate's driver rule follows a pool's roll-out.
        self.rollouts = rollouts
        self.validations = validations  # our validation Jobs' pods (healthGate.validation)
        self.device_reports = DeviceReports(pods_synced)
        # Per node: the eviction rate limit of partial drains, and the device counts
        # (the device gauges sum them when scraped).
        self.device_buckets: dict[str, TokenBucket] = {}
        self.device_counts: dict[str, DeviceCounts] = {}
        self.runner = Runner(executor, self._replan, self._take_token)
        pods.handlers.append(self._on_pod)

    def _on_pod(self, old: PodView | None, new: PodView | None) -> None:
        """Keep this reconciler's memories of pods: those it made leave, device reports."""
        self.leaving.on_pod(old, new)
        self.device_reports.on_pod(old, new)

    def reported_faults(self, name: str) -> tuple[str, ...]:
        """The fault ids the node's sources report now (without the node: the
        external signals held for it)."""
        node = self.nodes.get(name)
        external = self.external.active(name)
        if node is None:
            return tuple(s.fault_id for s in external)
        records = self.fleet.records_of(name, self.records)
        seen = Seen(node, self.config(), external, records, self._device_fence(name))
        return tuple(s.fault_id for s in reported(seen))

    def _device_fence(self, node: str) -> bool:
        """A device of the node can be fenced alone: the DeviceTaintRule API is served."""
        return self.fences(node).available

    # -- state ------------------------------------------------------------------

    def state_of(self, node: NodeView) -> NodeState:
        pods = tuple(
            self.leaving.seen(p)
            for key in self.fleet.pods_by_node.get(node.name, ())
            if (p := self.pods.get(key))
        )
        records = self.fleet.records_of(node.name, self.records)
        return NodeState(
            node=node,
            pods=pods,
            records=tuple(r for r in records if not r.device_scope),
            gpu_nodes=len(self.fleet.gpu_nodes),
            quarantined=frozenset(self.fleet.quarantined | self.fleet.rolling),
            blocked=dict(self.blocked.get(node.name, {})),
            external=self.external.active(node.name),
            unsettled=self.external.unsettled(),
            device_records=tuple(r for r in records if r.device_scope),
            pool_drivers=self.fleet.drivers_besides(node),
            rollout=self._rollout_view(node),
            handled_lately=self.handled.of(node.name, time.monotonic()),
            validations={v.job: v for v in self.validations() if v.node == node.name},
            repairing=self.fleet.repairing_at(
                dt.datetime.now(dt.UTC), self.config().repair.result_timeout
            ),
            device_fence=self._device_fence(node.name),
        )

    def _rollout_view(self, node: NodeView) -> RolloutDriver | None:
        if self.rollouts is None:
            return None
        pool = pool_of(node.labels, self.config())
        rollout = self.rollouts.get(rollout_name(pool)) if pool != NO_POOL else None
        return rollout.driver_view(node.name) if rollout is not None else None

    def device_state_of(self, node: NodeView) -> DeviceState:
        keys = self.fleet.pods_by_node.get(node.name, ())
        bucket = self._device_bucket(node.name)
        return DeviceState(
            node=node,
            entries=self.device_reports.entries(keys),
            records=self.fleet.records_of(node.name, self.records),
            canaries={k: c for k, c in self.canaries.items() if c.node == node.name},
            fences=self.fences(node.name),
            driver=(*self._driver_reports(node, keys), *self._agent_reports(node, keys)),
            evictions_allowed=int(bucket.tokens),
        )

    def _driver_reports(self, node: NodeView, keys: Iterable[str]) -> tuple[DriverReport, ...]:
        """What the DRA driver's taints on the node's devices say, with their holders."""
        if not any(d.taints for d in node.devices):
            return ()
        pods = (p for key in tuple(keys) if (p := self.pods.get(key)) is not None and p.held)
        return driver_reports(node.devices, pods, self.config().xid_overrides)

    def _agent_reports(self, node: NodeView, keys: Iterable[str]) -> tuple[DriverReport, ...]:
        """The agent's finding when it stays on one DRA card (policy/agentdevice.py)."""
        if not node.devices:
            return ()
        records = self.fleet.records_of(node.name, self.records)
        fence = self._device_fence(node.name)
        seen = Seen(node, self.config(), records=records, device_fence=fence)
        pods = (p for key in tuple(keys) if (p := self.pods.get(key)) is not None and p.held)
        return agentdevice.reports(seen, pods)

    def _device_bucket(self, node: str) -> TokenBucket:
        """The node's partial-drain bucket, refilled; new eviction rates (a reloaded
        config) apply from a full bucket."""
        cfg = self.config().device_health
        rate, burst = cfg.evictions_per_minute / 60.0, cfg.eviction_burst
        now = time.monotonic()
        bucket = self.device_buckets.get(node)
        if bucket is None or (bucket.rate, bucket.burst) != (rate, burst):
            bucket = TokenBucket.full(rate, burst, now)
        self.device_buckets[node] = bucket = bucket.refill(now)
        return bucket

    def _take_token(self) -> float:
        """Take a quarantine token: 0.0, or the seconds until one is there. The
        rate and burst in force are read now (a reload keeps the tokens)."""
        cfg = self.config()
        bucket = self.bucket
        if (bucket.rate, bucket.burst) != (cfg.rate_limit_per_second, cfg.rate_limit_burst):
            bucket = replace(bucket, rate=cfg.rate_limit_per_second, burst=cfg.rate_limit_burst)
        self.bucket, wait = bucket.take(time.monotonic())
        return wait

    # -- reconcile ----------------------------------------------------------------

    async def reconcile(self, name: str) -> Result:
        """What was done is in the caches and the records; what comes next, in the Result."""
        started = time.monotonic()
        try:
            with reconciling(name):
                result = await self._reconcile(name)
            # An external signal's expiry is a change no event will announce.
            expiry = self.external.expires_in(name)
            return result if expiry is None else result.combine(Result(requeue_after=expiry))
        finally:
            self.metrics.reconcile_duration.observe(time.monotonic() - started)

    async def _reconcile(self, name: str) -> Result:
        """Devices first (their records may escalate to the node), then the node."""
        now = dt.datetime.now(dt.UTC)
        node = self.nodes.get(name)
        if node is None:
            await self._close_records_of_deleted_node(name, now)
            self._forget(name)
            return DONE
        devices = await self._reconcile_devices(node, now)
        node = self.nodes.get(name) or node  # our device marks are on it now (write-through)
        return devices.combine(await self._reconcile_node(node, now))

    def _forget(self, name: str) -> None:
        """The node is gone: what this process kept about it goes too."""
        self.device_buckets.pop(name, None)
        self.device_counts.pop(name, None)
        self.blocked.pop(name, None)
        self.handled.forget(name)

    async def _reconcile_devices(self, node: NodeView, now: dt.datetime) -> Result:
        config = self.config()
        if not (config.device_health.enabled and self.fleet.selected(node)):
            return DONE
        if in_maintenance(node.labels):
            return DONE  # devices misbehave while people work on them: not faults
        state = self.device_state_of(node)
        decided = plan_devices(state, config, now)
        self._device_metrics(node.name, decided)
        if not decided.actions:
            return Result(decided.requeue_after)
        if decided.evictions:
            bucket = self.device_buckets[node.name]
            self.device_buckets[node.name] = replace(
                bucket, tokens=bucket.tokens - decided.evictions
            )
        try:
            outcome = await self.executor.run(decided, NodeState(node=node))
        except Replan as why:
            log.info("replanning devices", extra={"node": node.name, "why": str(why)})
            return AT_ONCE
        self._notify(node.name, decided.fault_id, decided.actions, outcome)
        if outcome.blocked:
            # A refused device eviction is tried again after the node's backoff.
            return Result(rate_limited=True)
        return Result(decided.requeue_after)

    def _device_metrics(self, name: str, decided: DevicePlan) -> None:
        summary = decided.summary
        for age in summary.report_ages:
            self.metrics.device_report_age.observe(age)
        for waited in summary.unknown_for:
            self.metrics.device_unknown_duration.observe(waited)
        self.device_counts[name] = (summary.unknown, summary.suspect, summary.quarantined)

    async def _reconcile_node(self, node: NodeView, now: dt.datetime) -> Result:
        decision = self._decide(node, now)
        if decision is None:
            return DONE
        decided, state = decision
        carried = await self.runner.carry_out(decided, state, now)
        if isinstance(carried, Result):
            return carried
        self._after(node.name, carried.decided, carried.ran, carried.outcome, now)
        # A refused eviction is not a failed reconcile: its backoff is the pod's own
        # (self.blocked, planned by the policy), not the queue's failure count.
        return carried.result

    def _decide(self, node: NodeView, now: dt.datetime) -> tuple[Plan, NodeState] | None:
        """The plan for a managed node (the policy decides everything, once), or None
        for a node outside the nodeSelector."""
        if not self.fleet.selected(node):
            self._unmanaged_fault(node)
            return None
        state = self.state_of(node)
        self._unreadable(node, state.pods)
        decided = plan(state, self.config(), now)
        self._note_suppressed(decided, node.name)
        if decided.suppressed == "reused":
            self._reused_fault_id(node, decided.fault_id)
        return decided, state

    def _replan(self, name: str, now: dt.datetime) -> tuple[Plan, NodeState] | None:
        """The plan made again from the caches (the runner's guards ask for it)."""
        node = self.nodes.get(name)
        return self._decide(node, now) if node else None

    def _unmanaged_fault(self, node: NodeView) -> None:
        """A node with GPUs outside the nodeSelector reports a fault: nothing will be
        done about it, and that is said once per fault (a Warning Event on the node
        and a log line), not silently dropped."""
        if node.name not in self.fleet.unmanaged:
            return
        config = self.config()
        # Its own report: an unmanaged node holds no external signal, nor records.
        signal = current_signal(Seen(node, config))
        if signal is None or not self.unmanaged_told.add(f"{node.name}/{signal.fault_id}"):
            return
        selector = ",".join(f"{k}={v}" for k, v in sorted(config.node_selector.items()))
        log.warning(
            "fault on an unmanaged GPU node",
            extra={"node": node.name, "fault_id": signal.fault_id, "reason": signal.reason},
        )
        self.executor.effects.recorder.emit(
            node_ref(node.name, node.uid, node.resource_version),
            reason=Reason.NODE_UNMANAGED,
            note=f"{signal.reason} (fault {signal.fault_id}, {signal.source}) reported on a "
            f"node with GPUs that nodeSelector {selector} does not match: gpuheal does not "
            "act on it; label the node to match, or set gpuheal.io/managed=false to "
            "exclude it knowingly",
            action="Ignore",
            warning=True,
        )

    def _unreadable(self, node: NodeView, pods: Iterable[PodView]) -> None:
        """Each gpuheal annotation value on the node, or on one of its pods, that its
        readers cannot read (policy/unreadable.py), told once: a warning log, the
        metric and a Warning Event, so the person who wrote it learns what it does."""
        for bad in unreadable(node.annotations):
            ref = node_ref(node.name, node.uid, node.resource_version)
            self._tell_unreadable(ref, bad, {"node": node.name})
        for pod in pods:
            if (found := unreadable_pod(pod)) is not None:
                ref = pod_ref(pod.namespace, pod.name, pod.uid, pod.resource_version)
                self._tell_unreadable(ref, found, {"node": node.name, "pod": pod.key})

    def _tell_unreadable(self, ref: ObjectRef, bad: Unreadable, where: dict[str, str]) -> None:
        value = hashlib.sha256(bad.value.encode()).hexdigest()
        if not self.unreadable_told.add(f"{ref.namespace}/{ref.name}/{bad.annotation}/{value}"):
            return
        self.metrics.annotations_unreadable.labels(bad.annotation).inc()
        log.warning(
            "annotation unreadable",
            extra={
                **where,
                "annotation": bad.annotation,
                "value": values.text(bad.value, 128),
                "why": bad.why,
            },
        )
        self.executor.effects.recorder.emit(
            ref,
            reason=Reason.ANNOTATION_UNREADABLE,
            note=f"{bad.annotation}={values.text(bad.value, 128)!r}: {bad.why}",
            action="Ignore",
            warning=True,
        )

    def _reused_fault_id(self, node: NodeView, fault_id: str) -> None:
        """A fault id reported again after its record closed (or after a newer fault
        superseded it) is a stale report and changes nothing (policy/plan/admit.py::stale):
        said once per node and id, with a warning log, an Event and the metric, so a
        person who re-used an id (`manual-001`) learns why nothing happened."""
        if not self.reused_told.add(f"{node.name}/{fault_id}"):
            return
        self.metrics.duplicates_suppressed.labels("reused").inc()
        log.warning("fault id reported again", extra={"node": node.name, "fault_id": fault_id})
        self.executor.effects.recorder.emit(
            node_ref(node.name, node.uid, node.resource_version),
            reason=Reason.FAULT_ID_REUSED,
            note=f"fault {fault_id} was reported again after its record closed: one fault id "
            "is one fault, so nothing is done; report a new fault under a new id",
            action="Ignore",
            warning=True,
        )

    async def _close_records_of_deleted_node(self, name: str, now: dt.datetime) -> None:
        gone = plan_node_gone(self.fleet.records_of(name, self.records), now)
        if gone.actions:
            await self.executor.run(gone, NodeState(node=NodeView(name, "")))

    def _notify(
        self,
        name: str,
        fault_id: str,
        ran: tuple[Action | DeviceAction, ...],
        outcome: PassOutcome,
        reason: str = "",
    ) -> None:
        """Tell the sinks about one remediation step, node or device."""
        notice = notice_for(name, ran, outcome, self.records.get, fault_id, reason=reason)
        if notice is not None:
            self.notify(notice)

    def _note_suppressed(self, decided: Plan, name: str) -> None:
        if decided.suppressed in ("handled", "cooldown", "memory"):
            self.metrics.duplicates_suppressed.labels(decided.suppressed).inc()
        if decided.suppressed:
            log.debug(
                "suppressed",
                extra={"node": name, "fault_id": decided.fault_id, "why": decided.suppressed},
            )

    def _after(
        self,
        name: str,
        decided: Plan,
        ran: tuple[Action, ...],
        outcome: PassOutcome,
        now: dt.datetime,
    ) -> None:
        config = self.config()
        blocked = self.blocked[name]
        for key in outcome.blocked:
            blocked[key] = refused_again(
                blocked.get(key),
                decided.fault_id,
                now,
                outcome.blocked_by.get(key, ""),
                base=config.eviction_retry_base_seconds,
                cap=config.eviction_retry_max_seconds,
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
            self.handled.add(name, decided.fault_id, time.monotonic(), config.dedupe_ttl_seconds)
        self._notify(name, decided.fault_id, ran, outcome, decided.reason)
