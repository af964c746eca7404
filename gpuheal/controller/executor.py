"""Carry out a plan's actions against the API server, in order.

Each action is idempotent: creating a record that exists, adding a taint that
is there, evicting a pod that is gone — all end in the same state. Every
write's response is fed back into the caches (write-through), so the next
plan sees our own writes even before the watch delivers them.

A pass writes each record's status once: its UpdateRecord actions (and a new
record's `detect` entry) are gathered and written together when the pass ends
(`flush`), after the actions they record; its Events are sent then too, one
per Emit, and one for all the pods the pass evicted. So nothing but the record
(the lock) and the taint stands between a fault and its fence.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuheal import values
from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.controller.replace import call_hook
from gpuheal.kube import validation, writes
from gpuheal.kube.api import ApiError, KubeApi, gpufault_path, node_path, pod_path
from gpuheal.kube.events import EventRecorder, ObjectRef, fault_ref, node_ref, pod_ref
from gpuheal.kube.projections import decode_fault, decode_meta, decode_node
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import (
    CANARY_LABEL,
    CHECKPOINT_REQUESTED,
    FAULT_TIME,
    HANDLED_FAULT_ID,
    QUARANTINED_DEVICES,
    REPAIR_REQUEST,
    STATE_LABEL,
    SUSPECT_DEVICES,
    TAINT_KEY,
    UNKNOWN_DEVICES,
    ActionEntry,
    CanaryView,
    FaultRecord,
    FaultSignal,
    NodeView,
    Phase,
    PodView,
    RepairApproval,
)
from gpuheal.policy import history
from gpuheal.policy.devices import (
    CreateCanary,
    CreateDeviceRecord,
    DeleteCanary,
    DeviceAction,
    DevicePlan,
    DeviceReleased,
    MarkDevices,
)
from gpuheal.policy.plan import (
    STATE_QUARANTINED,
    Action,
    AddTaint,
    CreateRecord,
    DeletePod,
    Emit,
    Evict,
    MarkHandled,
    NodeState,
    Plan,
    Planned,
    RemoveTaint,
    ReplaceIntent,
    RequestCheckpoint,
    UpdateRecord,
)
from gpuheal.policy.repair import RequestRepair, repair_metric
from gpuheal.policy.replace import CallReplace
from gpuheal.policy.validation import CreateValidationJob, DeleteValidationJob
from gpuheal.vocabulary import Entry, Reason

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5
# A pass's evictions in flight at once (a node's GPU pods: 8 on most GPU nodes).
EVICTIONS_IN_FLIGHT = 8
CRASH_ENV = "GPUHEAL_CRASH_AFTER"


# What the Eviction API says when a budget refuses (policy/v1 DisruptionBudgetCause):
# "The disruption budget <name> needs 1 healthy pods and has 1 currently".
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"
_BUDGET_NAME = re.compile(r"^The disruption budget (\S+)")


def refused_by(err: ApiError, namespace: str) -> str:
    """What refused an eviction (429), for people: the PodDisruptionBudget the API
    server names in the answer's causes, else its message (e.g. API throttling)."""
    for cause in err.causes:
        if cause.type != DISRUPTION_BUDGET_CAUSE:
            continue
        found = _BUDGET_NAME.match(cause.message)
        if found:
            return f"PodDisruptionBudget {namespace}/{found[1]}"
        return (
            f"a PodDisruptionBudget ({cause.message})" if cause.message else "a PodDisruptionBudget"
        )
    return err.message or err.reason or "429"


def _with_evictions(entry: ActionEntry, outcome: PassOutcome) -> ActionEntry:
    """The eviction round's record entry, with what came of it."""
    detail, result = entry.detail, entry.result
    if outcome.evicted:
        detail += f"; evicted {len(outcome.evicted)}"
    if outcome.blocked:
        refused = ", ".join(
            f"{k} by {outcome.blocked_by.get(k, '?')}" for k in sorted(outcome.blocked)
        )
        detail, result = f"{detail}; blocked: {refused}", "blocked"
    return replace(entry, detail=detail, result=result)


class Replan(Exception):  # noqa: N818 -- a signal to the reconciler, not a failure
    """The world moved under the plan (someone else's record, a conflict): plan again."""


@dataclass
class WriteThrough:
    """Write-through hooks into the informers' stores."""

    node: Callable[[str], NodeView | None]
    record: Callable[[str], FaultRecord | None]
    put_node: Callable[[NodeView], None]
    put_record: Callable[[FaultRecord], None]
    put_pod: Callable[[PodView], None]
    put_canary: Callable[[CanaryView], None] = lambda _: None


@dataclass
class PassOutcome:
    evicted: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    blocked_by: dict[str, str] = field(default_factory=dict)  # pod key -> what refused it
    gone: list[str] = field(default_factory=list)
    left: dict[str, str] = field(default_factory=dict)  # pod key -> UID evicted or deleted
    untainted: bool = False
    handled: bool = False
    # Not yet written: what the pass decided about each record, its Events, the
    # pods it evicted and has not told of (fault id, "ns/pod[ off bad device d]").
    news: dict[str, RecordNews] = field(default_factory=dict)
    emits: list[Emit] = field(default_factory=list)
    untold: list[tuple[str, str, str]] = field(default_factory=list)  # + node


@dataclass
class RecordNews:
    """A record's status as one pass leaves it: the pass's entries in order, the
    last phase and field values it set."""

    phase: Phase
    entries: list[tuple[ActionEntry, bool]] = field(default_factory=list)  # (entry, + evictions)
    recovering_since: str | None = None
    expiry: str | None = None
    plan: Planned | None = None
    evictions: bool = False
    contact_support: bool = False
    repair_approval: RepairApproval | None = None

    def add(self, action: UpdateRecord) -> None:
        self.phase = action.phase
        self.entries.append((action.entry, action.record_evictions))
        self.evictions = self.evictions or action.record_evictions
        if action.recovering_since is not None:
            self.recovering_since = action.recovering_since
        if action.expiry is not None:
            self.expiry = action.expiry
        if action.plan is not None:
            self.plan = action.plan
        self.contact_support = self.contact_support or action.contact_support
        if action.repair_approval is not None:
            self.repair_approval = action.repair_approval


class Crashpoint:
    """Test hook: SIGKILL this process right after the N-th action of a kind.

    GPUHEAL_CRASH_AFTER=AddTaint (or AddTaint:2). Unset in production.
    """

    def __init__(self, spec: str | None) -> None:
        kind, _, count = (spec or "").partition(":")
        self.kind = kind
        self.remaining = int(count or "1")

    def after(self, action: Action | DeviceAction) -> None:
        if self.kind and type(action).__name__ == self.kind:
            self.remaining -= 1
            if self.remaining <= 0:
                log.warning("crashpoint reached", extra={"action": self.kind})
                os.kill(os.getpid(), signal.SIGKILL)

    @classmethod
    def from_env(cls) -> Crashpoint:
        return cls(os.environ.get(CRASH_ENV))


class Executor:
    def __init__(
        self,
        api: KubeApi,
        *,
        caches: WriteThrough,
        recorder: EventRecorder,
        metrics: ControllerMetrics,
        config: Callable[[], Config],
        crashpoint: Crashpoint | None = None,
    ) -> None:
        self.api = api
        self.caches = caches
        self.recorder = recorder
        self.metrics = metrics
        self.config = config  # the controller's current config, read where needed
        self.crashpoint = crashpoint or Crashpoint(None)
        self._blocked_reported: set[str] = set()

    async def run(
        self,
        plan: Plan | DevicePlan,
        state: NodeState,
        actions: tuple[Action | DeviceAction, ...] | None = None,
        outcome: PassOutcome | None = None,
        *,
        flush: bool = True,
    ) -> PassOutcome:
        """Run `actions` (default: all of the plan's), adding to `outcome` if given;
        then write what they decided about records and send their Events, unless
        `flush` is False (the caller runs more of the same pass, and flushes)."""
        outcome = outcome or PassOutcome()
        try:
            for step in _steps(plan.actions if actions is None else actions):
                if len(step) == 1:
                    await self._run_one(plan, step[0], state, outcome)
                else:
                    await self._run_together(plan, step, state, outcome)
        except Exception:
            if flush:
                await self.flush_after_failure(outcome, state)
            raise
        if flush:
            await self.flush(outcome, state)
        return outcome

    async def _run_together(
        self,
        plan: Plan | DevicePlan,
        evictions: tuple[Action | DeviceAction, ...],
        state: NodeState,
        outcome: PassOutcome,
    ) -> None:
        """A pass's evictions at once, up to EVICTIONS_IN_FLIGHT: each is its own
        pod's request, and one after the other a storm's drains took four times
        as long as its taints. All of them finish (and are recorded) before the
        first error, if any, ends the pass."""
        gate = asyncio.Semaphore(EVICTIONS_IN_FLIGHT)

        async def one(action: Action | DeviceAction) -> None:
            async with gate:
                await self._run_one(plan, action, state, outcome)

        results = await asyncio.gather(*(one(a) for a in evictions), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _run_one(
        self,
        plan: Plan | DevicePlan,
        action: Action | DeviceAction,
        state: NodeState,
        outcome: PassOutcome,
    ) -> None:
        started = time.monotonic()
        result = await self._do(action, state, outcome)
        log.info(
            "action",
            extra={
                "node": state.node.name,
                "fault_id": plan.fault_id,
                "action": type(action).__name__,
                "result": result,
                "duration_ms": round((time.monotonic() - started) * 1000, 1),
            },
        )
        if not isinstance(action, Emit):
            self.metrics.remediations.labels(type(action).__name__, result).inc()
        self.crashpoint.after(action)

    async def flush_after_failure(self, outcome: PassOutcome, state: NodeState) -> None:
        """A pass cut short by an error: what its finished actions did is still
        written (best effort: the error that cut it short is the one reported)."""
        try:
            await self.flush(outcome, state)
        except Exception as err:  # the pass's own error follows
            log.warning(
                "record not written after a failed step",
                extra={"node": state.node.name, "error": str(err)},
            )

    async def flush(self, outcome: PassOutcome, state: NodeState) -> None:
        """Write each record's news in one status PATCH, then send the pass's Events
        (they follow the record they point to)."""
        while outcome.news:
            name, news = next(iter(outcome.news.items()))
            await self._write_status(name, news, outcome)
            del outcome.news[name]
        emits, outcome.emits = outcome.emits, []
        for action in emits:
            self._emit(action, state)
        self._tell_evictions(outcome)

    async def _do(  # noqa: PLR0911, PLR0912 -- one dispatch arm per action kind
        self,
        action: Action | DeviceAction,
        state: NodeState,
        outcome: PassOutcome,
    ) -> str:
        if isinstance(
            action, CreateDeviceRecord | MarkDevices | CreateCanary | DeleteCanary | DeviceReleased
        ):
            return await self._do_device(action)
        if isinstance(action, CreateValidationJob):
            return await validation.create_job(self.api, action, self.config())
        if isinstance(action, DeleteValidationJob):
            return await validation.delete_job(self.api, action, self.config())
        match action:
            case CreateRecord():
                return await self._create_record(action, outcome)
            case ReplaceIntent():
                return await self._write_intent(action, outcome)
            case UpdateRecord():
                return self._update_record(action, outcome)
            case AddTaint():
                return await self._set_taint(action.node, action, state)
            case RemoveTaint():
                result = await self._set_taint(action.node, None, state)
                # "label-removed": a person had removed the taint, only our label went.
                outcome.untainted = result != "label-removed"
                return result
            case RequestCheckpoint():
                return await self._request_checkpoint(action)
            case Evict():
                return await self._evict(action, outcome)
            case DeletePod():
                return await self._delete(action, outcome)
            case MarkHandled():
                outcome.handled = True
                return await self._mark_handled(action)
            case RequestRepair():
                return await self._request_repair(action)
            case CallReplace():
                return await self._call_replace(action, outcome)
            case Emit():
                outcome.emits.append(action)
                return "queued"

    async def _do_device(
        self,
        action: CreateDeviceRecord | MarkDevices | CreateCanary | DeleteCanary | DeviceReleased,
    ) -> str:
        match action:
            case CreateDeviceRecord():
                return await self._create_device_record(action)
            case MarkDevices():
                return await self._mark_devices(action)
            case CreateCanary():
                return await self._create_canary(action)
            case DeleteCanary():
                return await self._delete_canary(action)
            case DeviceReleased():
                self.metrics.device_releases.inc()
                if action.false_quarantine:
                    self.metrics.device_false_quarantines.inc()
                return "counted"

    # -- records -----------------------------------------------------------

    async def _create_record(self, action: CreateRecord, outcome: PassOutcome) -> str:
        sig = action.signal
        record = await self._create_lock(
            action.name, writes.fault_record(action.name, sig, action.mode)
        )
        self.metrics.faults_detected.labels(record.source, record.reason, sig.severity.value).inc()
        if sig.altered:
            self._input_altered(sig)
        # The status (the CRD's subresource: a create cannot carry it) is written
        # with the rest of the pass: after the taint, not before it.
        now = iso(dt.datetime.now(dt.UTC))
        entry = ActionEntry(time=now, action=Entry.DETECT, result="ok", detail=sig.source)
        outcome.news[action.name] = RecordNews(action.phase, [(entry, False)])
        return "created"

    async def _create_lock(self, name: str, body: dict[str, Any]) -> FaultRecord:
        """Create a GPUFault record, the fault's cross-replica lock
        (docs/architecture.md#exactly-once). AlreadyExists: the
        fault is owned (by us before a restart, or another replica): the cache takes
        the record as it is and the node is planned again (Replan)."""
        try:
            raw = await self.api.create(gpufault_path(), body)
        except ApiError as err:
            if err.code != 409:
                raise
            self.metrics.duplicates_suppressed.labels("record").inc()
            self.caches.put_record(decode_fault(await self.api.get(gpufault_path(name))))
            raise Replan(f"GPUFault {name} already exists") from err
        record = decode_fault(raw)
        self.caches.put_record(record)
        return record

    def _input_altered(self, sig: FaultSignal) -> None:
        """Said once per fault (its record is created once): the source reported
        what the API server cannot carry, and the fault goes on normalized."""
        for name in sig.altered:
            self.metrics.inputs_altered.labels(sig.source.split("/", 1)[0], name).inc()
        log.warning(
            "fault input normalized",
            extra={"node": sig.node, "fault_id": sig.fault_id, "fields": list(sig.altered)},
        )

    async def _create_device_record(self, action: CreateDeviceRecord) -> str:
        """The device fault's record: created first, it is the lock (node, resource,
        resourceID, episode are in its name), as for node faults."""
        rec = action.record
        await self._create_lock(
            rec.name, writes.device_record(rec, self.config().mode_for(rec.reason))
        )
        self.metrics.faults_detected.labels(rec.source, rec.reason, rec.severity.value).inc()
        if rec.contact_support:
            self.metrics.contact_support.inc()
        status = writes.record_status(
            rec.phase, list(rec.actions), expiry=rec.expiry, contactSupport=rec.contact_support
        )
        raw = await self.api.patch(gpufault_path(rec.name, status=True), status)
        self.caches.put_record(decode_fault(raw))
        return "created"

    async def _mark_devices(self, action: MarkDevices) -> str:
        marks = {
            QUARANTINED_DEVICES: action.quarantined,
            SUSPECT_DEVICES: action.suspect,
            UNKNOWN_DEVICES: action.unknown,
        }
        # Merge patch: only our keys; an empty list removes its annotation.
        annotations = {k: ",".join(v) or None for k, v in marks.items()}
        raw = await self.api.patch(
            node_path(action.node), {"metadata": {"annotations": annotations}}
        )
        self.caches.put_node(decode_node(raw))
        return "marked"

    async def _create_canary(self, action: CreateCanary) -> str:
        cfg = self.config().device_health
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": action.name,
                "namespace": cfg.canary_namespace,
                "labels": {CANARY_LABEL: "true"},
                "annotations": {"gpuheal.io/fault-record": action.record},
            },
            "spec": {
                "nodeName": action.node,  # pinned: the scheduler would keep off a quarantined node
                "restartPolicy": "Never",
                "activeDeadlineSeconds": int(cfg.canary_timeout_seconds),
                "automountServiceAccountToken": False,
                "tolerations": [{"key": TAINT_KEY, "operator": "Exists"}],
                "containers": [
                    {
                        "name": "canary",
                        "image": cfg.canary_image,
                        "command": list(cfg.canary_command),
                        "resources": {"limits": {action.resource: "1"}},
                    }
                ],
            },
        }
        try:
            await self.api.create(pod_path(cfg.canary_namespace), body)
        except ApiError as err:
            if err.code != 409:
                raise
            return "present"
        self.caches.put_canary(CanaryView(action.name, action.node, "Pending"))
        return "created"

    async def _delete_canary(self, action: DeleteCanary) -> str:
        try:
            await self.api.delete(
                pod_path(self.config().device_health.canary_namespace, action.name)
            )
        except ApiError as err:
            if err.code != 404:
                raise
            return "gone"
        return "deleted"

    def _update_record(self, action: UpdateRecord, outcome: PassOutcome) -> str:
        """Gathered into the record's news: written once, when the pass ends."""
        counted = repair_metric(action.entry)
        if counted is not None:
            self.metrics.repairs.labels(*counted).inc()
        news = outcome.news.get(action.name)
        if news is None:
            outcome.news[action.name] = news = RecordNews(action.phase)
        news.add(action)
        return action.phase.value

    async def _write_status(self, name: str, news: RecordNews, outcome: PassOutcome) -> None:
        for _ in range(CONFLICT_RETRIES):
            record = self.caches.record(name)
            if record is None:
                record = decode_fault(await self.api.get(gpufault_path(name)))
            # A repeat of the last entry (the same refusal, attempt after attempt) is
            # folded into it; the first entries are kept however long the history gets.
            actions: list[ActionEntry] = list(record.actions)
            for entry, evictions in news.entries:
                actions = history.append(
                    actions, _with_evictions(entry, outcome) if evictions else entry
                )
            status: dict[str, Any] = {
                "phase": news.phase.value,
                "actions": [writes.action_entry(a) for a in actions],
            }
            if news.evictions and outcome.evicted:
                status["evictedPods"] = sorted({*record.evicted_pods, *outcome.evicted})
            if news.recovering_since is not None:
                status["recoveringSince"] = news.recovering_since or None
            if news.expiry is not None:
                status["expiry"] = news.expiry
            if news.plan is not None:
                status["plan"] = news.plan.status()
            if news.contact_support:
                status["contactSupport"] = True
            if news.repair_approval is not None:
                status["repairApproval"] = writes.repair_approval(news.repair_approval)
            body = {"metadata": {"resourceVersion": record.resource_version}, "status": status}
            try:
                raw = await self.api.patch(gpufault_path(name, status=True), body)
            except ApiError as err:
                if err.code != 409:
                    raise
                self.caches.put_record(decode_fault(await self.api.get(gpufault_path(name))))
                continue
            self.caches.put_record(decode_fault(raw))
            return
        raise Replan(f"GPUFault {name}: conflicts did not settle")

    # -- the node ------------------------------------------------------------

    async def _set_taint(self, name: str, add: AddTaint | None, state: NodeState) -> str:
        """Add (or with None remove) our taint, under optimistic concurrency; with the
        fault's handled mark where the plan merged it (AddTaint.with_mark)."""
        node = self.caches.node(name) or state.node
        wanted = values.taint_value(add.fault_id) if add is not None else None
        for _ in range(CONFLICT_RETRIES):
            ours = node.taint()
            label = node.labels.get(STATE_LABEL)
            if (
                add is not None
                and ours is not None
                and (ours.value, ours.effect)
                == (
                    wanted,
                    add.effect,
                )
            ):
                return "present"
            if add is None and ours is None and label != STATE_QUARANTINED:
                return "absent"
            # Our label says "quarantined" and goes with our taint; any other state
            # (a person's "maintenance") is not ours to set or remove.
            state_label: str | None = None
            if add is not None and label in (None, STATE_QUARANTINED):
                state_label = STATE_QUARANTINED
            elif add is None and label == STATE_QUARANTINED:
                state_label = ""
            body = writes.taint_patch(
                node,
                add.fault_id if add is not None else None,
                add.effect if add is not None else "",
                state=state_label,
            )
            if add is not None and add.with_mark:
                marks = writes.handled_patch(add.fault_id, iso(dt.datetime.now(dt.UTC)))
                body["metadata"]["annotations"] = marks["metadata"]["annotations"]
            try:
                raw = await self.api.patch(node_path(name), body)
            except ApiError as err:
                if err.code != 409:
                    raise
                # Someone else wrote the node meanwhile: read it fresh and try again.
                node = decode_node(await self.api.get(node_path(name)))
                self.caches.put_node(node)
                continue
            updated = decode_node(raw)
            self.caches.put_node(updated)
            if add is not None:
                self._observe_time_to_quarantine(state.node)
                return "tainted"
            # Without our taint (a person removed it) only our state label went.
            return "untainted" if ours is not None else "label-removed"
        raise Replan(f"node {name}: conflicts did not settle")

    def _observe_time_to_quarantine(self, node: NodeView) -> None:
        reported = parse_time(node.annotations.get(FAULT_TIME, ""))
        if reported is not None:
            elapsed = (dt.datetime.now(dt.UTC) - reported).total_seconds()
            self.metrics.time_to_quarantine.observe(max(0.0, elapsed))

    async def _request_repair(self, action: RequestRepair) -> str:
        """The repair request on the node: one attempt, written once (a request
        already there is the same attempt: a restarted pass does not ask again)."""
        node = self.caches.node(action.node)
        if node is not None and node.annotations.get(REPAIR_REQUEST) == action.value:
            return "present"
        body = {"metadata": {"annotations": {REPAIR_REQUEST: action.value}}}
        raw = await self.api.patch(node_path(action.node), body)
        self.caches.put_node(decode_node(raw))
        return "requested"

    async def _write_intent(self, action: ReplaceIntent, outcome: PassOutcome) -> str:
        """The intent of a provider-hook call, written now (with what the pass decided
        about the record before it): the call comes only after it is stored."""
        self._update_record(action, outcome)
        await self._write_status(action.name, outcome.news.pop(action.name), outcome)
        return "intent"

    async def _call_replace(self, action: CallReplace, outcome: PassOutcome) -> str:
        """The provider's hook, once for this look; its outcome goes into the record
        with the pass's news, and an Event."""
        accepted, detail = await call_hook(self.config().repair.replace, action)
        entry = action.outcome(accepted, detail, dt.datetime.now(dt.UTC))
        self._update_record(UpdateRecord(action.record, action.phase, entry), outcome)
        reason = Reason.REPLACE_ACCEPTED if accepted else Reason.REPLACE_FAILED
        note = f"fault {action.fault_id}: {entry.detail}"
        outcome.emits.append(Emit(reason, note, action.node, action.record, warning=not accepted))
        return entry.action

    async def _mark_handled(self, action: MarkHandled) -> str:
        node = self.caches.node(action.node)
        if node is not None and node.annotations.get(HANDLED_FAULT_ID) == values.fault_id(
            action.fault_id
        ):
            return "present"  # written with the taint
        body = writes.handled_patch(action.fault_id, iso(dt.datetime.now(dt.UTC)))
        raw = await self.api.patch(node_path(action.node), body)
        self.caches.put_node(decode_node(raw))
        return "marked"

    # -- pods ----------------------------------------------------------------

    async def _request_checkpoint(self, action: RequestCheckpoint) -> str:
        """The checkpoint request on the pod, written once: the write is guarded by
        the pod's resourceVersion, so a request made meanwhile (by the leader before
        a failover, or `maintenance start`) is never overwritten: its deadline stands."""
        pod = action.pod
        path = pod_path(pod.namespace, pod.name)
        version = pod.resource_version
        for _ in range(CONFLICT_RETRIES):
            meta: dict[str, Any] = {"annotations": {CHECKPOINT_REQUESTED: action.deadline}}
            if version:
                meta["resourceVersion"] = version
            try:
                raw = await self.api.patch(path, {"metadata": meta})
            except ApiError as err:
                if err.code == 404:
                    return "gone"
                if err.code != 409:
                    raise
                try:
                    fresh = decode_meta(await self.api.get(path))
                except ApiError as gone:
                    if gone.code != 404:
                        raise
                    return "gone"
                if fresh.uid != pod.uid:
                    return "gone"  # another pod of that name: not the one planned for
                if CHECKPOINT_REQUESTED in fresh.annotations:
                    return "present"
                version = fresh.resourceVersion
                continue
            written = decode_meta(raw)
            self.caches.put_pod(
                replace(
                    pod,
                    checkpoint_requested=action.deadline,
                    resource_version=written.resourceVersion,
                )
            )
            return "requested"
        raise Replan(f"pod {pod.key}: conflicts did not settle")

    async def _evict(self, action: Evict, outcome: PassOutcome) -> str:
        pod = action.pod
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
            "deleteOptions": {"preconditions": {"uid": pod.uid}},
        }
        try:
            await self.api.create(f"{pod_path(pod.namespace, pod.name)}/eviction", body)
        except ApiError as err:
            if err.code == 404 or (err.code == 409 and "UID" in err.message):
                outcome.gone.append(pod.key)
                self._count_eviction(action, "gone")
                return "gone"
            if err.code == 429:
                by = refused_by(err, pod.namespace)
                outcome.blocked.append(pod.key)
                outcome.blocked_by[pod.key] = by
                self._count_eviction(action, "blocked")
                if pod.key not in self._blocked_reported:  # one Event per blocked pod
                    self._blocked_reported.add(pod.key)
                    detail = "; ".join(c.message for c in err.causes if c.message)
                    self._warn_on_pod(
                        pod,
                        Reason.EVICTION_BLOCKED,
                        f"eviction of {pod.key} for fault {action.fault_id} refused by "
                        f"{by}: {detail or err.message}; retrying with backoff",
                        action="Evict",
                    )
                return "blocked"
            self._count_eviction(action, "failed")
            raise
        self._pod_leaving(pod, outcome, "evicted")
        where = f" off bad device {action.device}" if action.device else ""
        outcome.untold.append((pod.node, action.fault_id, f"{pod.key}{where}"))
        if action.device:
            self.metrics.device_migrations.labels("evicted").inc()
        return "evicted"

    def _count_eviction(self, action: Evict, result: str) -> None:
        self.metrics.pods_evicted.labels(result).inc()
        if action.device:
            self.metrics.device_migrations.labels(result).inc()

    def _pod_leaving(self, pod: PodView, outcome: PassOutcome, result: str) -> None:
        """A pod we evicted or deleted: mark it leaving in the cache, record it."""
        self.caches.put_pod(replace(pod, deleting=True))
        outcome.evicted.append(pod.key)
        outcome.left[pod.key] = pod.uid
        self.metrics.pods_evicted.labels(result).inc()

    def _tell_evictions(self, outcome: PassOutcome) -> None:
        """One Event on the Node per fault for all the pods the pass evicted, not one
        per pod: the pods are on their way out (a Pod's Events go with it), and the
        node is where people look for what was done about its fault."""
        by_fault: dict[tuple[str, str], list[str]] = {}
        for node, fault_id, pod in outcome.untold:
            by_fault.setdefault((node, fault_id), []).append(pod)
        outcome.untold = []
        for (node, fault_id), pods in by_fault.items():
            self.recorder.emit(
                self._node_ref(node),
                reason=Reason.EVICTED,
                note=f"evicted {len(pods)} GPU pod{'s' if len(pods) != 1 else ''} for fault "
                f"{fault_id}: {', '.join(pods)}",
                action="Evict",
            )

    async def _delete(self, action: DeletePod, outcome: PassOutcome) -> str:
        pod = action.pod
        body = {"preconditions": {"uid": pod.uid}}
        try:
            await self.api.delete(pod_path(pod.namespace, pod.name), body)
        except ApiError as err:
            if err.code in (404, 409):
                outcome.gone.append(pod.key)
                return "gone"
            raise
        self._pod_leaving(pod, outcome, "deleted")
        # Rare and past a budget: said on the Pod itself.
        self._warn_on_pod(
            pod,
            Reason.EVICTED,
            f"deleted GPU pod {pod.key} for fault {action.fault_id}: eviction stayed "
            f"blocked for {self.config().eviction_delete_after_seconds:g}s",
            action="Delete",
        )
        return "deleted"

    # -- audit ---------------------------------------------------------------

    def _node_ref(self, name: str, state: NodeState | None = None) -> ObjectRef:
        """The Node as Events name it: with its UID (kubectl describe selects by it)."""
        node = self.caches.node(name)
        if node is None and state is not None and state.node.name == name:
            node = state.node
        return node_ref(name, node.uid, node.resource_version) if node else node_ref(name)

    def _warn_on_pod(self, pod: PodView, reason: str, note: str, *, action: str) -> None:
        """A Warning Event on the Pod, in its namespace (where its owner looks), its
        Node named as related."""
        self.recorder.emit(
            _pod_ref(pod),
            reason=reason,
            note=note,
            action=action,
            warning=True,
            related=self._node_ref(pod.node),
        )

    def _emit(self, action: Emit, state: NodeState) -> None:
        record = self.caches.record(action.record) if action.record else None
        node = self._node_ref(action.node, state)
        fault = (
            fault_ref(action.record, record.uid, record.resource_version)
            if record is not None
            else fault_ref(action.record)
        )
        verb = action.reason.removeprefix("GPUFault").removeprefix("GPUPod").removeprefix("GPU")
        # On the Node only, its record named as related: the record's own history
        # (status.actions, shown by `kubectl describe gpufault`) is the durable
        # copy, and a second Event per step would double the requests for nothing.
        self.recorder.emit(
            node,
            reason=action.reason,
            note=action.note,
            action=verb,
            warning=action.warning,
            related=fault if action.record else None,
        )


def _pod_ref(pod: PodView) -> ObjectRef:
    return pod_ref(pod.namespace, pod.name, pod.uid, pod.resource_version)


def _steps(
    actions: tuple[Action | DeviceAction, ...],
) -> list[tuple[Action | DeviceAction, ...]]:
    """The actions in order, with each run of consecutive evictions (or checkpoint
    requests) as one step: they are independent of each other, everything else
    keeps its order."""
    steps: list[tuple[Action | DeviceAction, ...]] = []
    for action in actions:
        # Checkpoint requests too: each is its own pod's write.
        if (
            isinstance(action, Evict | RequestCheckpoint)
            and steps
            and type(steps[-1][-1]) is type(action)
        ):
            steps[-1] = (*steps[-1], action)
        else:
            steps.append((action,))
    return steps
