"""The idle-node sweep as a loop of the leader's: every `sweep.passSeconds`, and at
once when a pod starts waiting for a node, policy/sweep.py plans a pass over the
caches and this loop carries it out:

- an end first (a slot and a node freed): the node's mark written as ended, its
  fence lifted in the same write (kept for a failed check until its fault is
  recorded), then its Job deleted;
- fences of failed checks lifted once their fault's record exists;
- a start: the mark and the fence in one write under the node's
  resourceVersion (a node written meanwhile waits for the next pass), then
  the Job; a Job the API server refuses ends the check as an error at once;
- the failed checks that are faults still submitted as `sweep` signals, and
  the ones no longer so resolved.

Every step is level-triggered from the node's mark: a new leader carries on
from it. A Job no mark names (its end's delete was lost) is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuheal.config import Config
from gpuheal.controller.signals import SignalPort
from gpuheal.kube import validation, writes
from gpuheal.kube.api import ApiError, KubeApi, node_path
from gpuheal.kube.events import EventRecorder, ObjectRef, node_ref
from gpuheal.kube.projections import decode_node
from gpuheal.model import SWEEP, SWEEP_TAINT, FaultRecord, NodeView, PodView
from gpuheal.policy.sweep import (
    JOB_PREFIX,
    End,
    Fleet,
    PendingPod,
    Result,
    Start,
    SweepMark,
    SweepPass,
    parse_mark,
    plan,
)
from gpuheal.policy.validation import DeleteValidationJob, ValidationPod
from gpuheal.sources import sweep as source
from gpuheal.vocabulary import Reason

log = logging.getLogger(__name__)

# A Job of the sweep's that no node's mark names is deleted only once it is this
# old: the mark that names it may not have reached the cache yet.
ORPHAN_AFTER_S = 120.0
MIN_PASS_GAP_S = 1.0

_EVENTS = {
    Result.PASSED: (Reason.SWEEP_PASSED, False),
    Result.FAILED: (Reason.SWEEP_FAILED, True),
    Result.YIELDED: (Reason.SWEEP_YIELDED, False),
    Result.ERROR: (Reason.SWEEP_ERROR, True),
}


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class SweepCaches:
    """What a pass reads, from the controller's informers."""

    nodes: Callable[[], Iterable[NodeView]]
    pods_by_node: Mapping[str, Iterable[str]]
    pod: Callable[[str], PodView | None]
    # Unscheduled pods (None: not watched, the sweep was off at start).
    pending: Callable[[], Iterable[PendingPod]] | None
    checks: Callable[[], Iterable[ValidationPod]]
    records: Callable[[], Iterable[FaultRecord]]
    managed: Callable[[str], bool]
    # A node we just wrote, into the node cache (write-through).
    put_node: Callable[[NodeView], None]


class SweepLoop:
    def __init__(
        self,
        config: Callable[[], Config],
        api: KubeApi,
        caches: SweepCaches,
        *,
        recorder: EventRecorder,
        port: SignalPort,
        counted: Callable[[str], None] = lambda _result: None,
        looked: Callable[[SweepPass], object] = lambda _seen: None,
        clock: Callable[[], dt.datetime] = _utcnow,
    ) -> None:
        self.config = config
        self.api = api
        self.caches = caches
        self.recorder = recorder
        self.port = port
        self.counted = counted
        self.looked = looked
        self.clock = clock
        self.wake = asyncio.Event()  # set by a new pending pod
        self._held: dict[str, str] = {}  # node -> the fault submitted last pass

    def on_pending(self, old: object, new: object) -> None:
        """A pod started waiting for a node: a running check may have to yield now.
        Only a new one: the scheduler rewrites a waiting pod's status on each try,
        and those updates would wake a pass over the fleet for nothing new."""
        if old is None and new is not None:
            self.wake.set()

    async def run(self) -> None:
        while True:
            # Cleared before the pass: a pod that comes during it or the gap wakes the next.
            self.wake.clear()
            try:
                await self.pass_once()
            except Exception:  # one bad pass must not end the loop
                log.exception("sweep pass failed")
            # A burst of new pending pods wakes one pass a second at the most.
            await asyncio.sleep(MIN_PASS_GAP_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.config().sweep.pass_seconds)

    async def pass_once(self) -> SweepPass:
        config, now = self.config(), self.clock()
        fleet = self._fleet()
        seen = plan(fleet, config, now)
        for end in seen.ends:
            await self._end(end, config)
        for unfence in seen.unfences:
            await self._write(unfence.node, None, fenced=False)
        await self._delete_orphans(fleet, now, config)
        for start in seen.starts:
            await self._start(start, config)
        self._hold(seen)
        self.looked(seen)
        self.port.settled()
        return seen

    def _fleet(self) -> Fleet:
        c = self.caches
        pods = {
            node: [p for key in tuple(keys) if (p := c.pod(key)) is not None]
            for node, keys in tuple(c.pods_by_node.items())
        }
        return Fleet(
            nodes=tuple(c.nodes()),
            pods=pods,
            pending=tuple(c.pending()) if c.pending is not None else (),
            checks={v.job: v for v in c.checks() if v.job.startswith(JOB_PREFIX)},
            records=tuple(c.records()),
            managed=c.managed,
            looking=c.pending is not None,
        )

    async def _start(self, start: Start, config: Config) -> None:
        node = start.node
        if not await self._write(node, start.mark, fenced=True):
            return
        namespace = config.health_gate.validation.namespace
        try:
            said = await validation.create_job(self.api, start.job, config)
        except ApiError as err:
            ended = SweepMark(
                job=start.mark.job, started=start.mark.started, boot=start.mark.boot,
                ended=start.mark.started, result=Result.ERROR.value,
                detail=f"{start.job.name}: the Job was refused: {str(err)[:300]}",
            )  # fmt: skip
            fresh = self._fresh(node)
            await self._end(End(fresh, ended), config)
            return
        log.info(
            "sweep check started",
            extra={"node": node.name, "job": start.job.name, "result": said},
        )
        self._event(
            node,
            Reason.SWEEP_STARTED,
            f"idle-node check Job {namespace}/{start.job.name} started on "
            f"{start.job.gpus} {start.job.resource} (DCGM level {config.sweep.dcgm_level}); "
            "the node takes no new pods until it ends",
            warning=False,
        )
        self.counted("started")

    async def _end(self, end: End, config: Config) -> None:
        mark = end.mark
        if not await self._write(end.node, mark, fenced=end.fenced):
            return
        await validation.delete_job(self.api, DeleteValidationJob(mark.job), config)
        result = Result(mark.result)
        reason, warning = _EVENTS[result]
        note = f"idle-node check {result.value}: {mark.detail}"
        if result is Result.FAILED:
            note += f"; fault {mark.fault} quarantines the node"
        log.info(
            "sweep check ended",
            extra={
                "node": end.node.name, "job": mark.job, "result": mark.result,
                "fault_id": mark.fault, "detail": mark.detail,
            },
        )  # fmt: skip
        self._event(end.node, reason, note, warning=warning)
        self.counted(result.value)

    def _fresh(self, node: NodeView) -> NodeView:
        return next((n for n in self.caches.nodes() if n.name == node.name), node)

    async def _write(self, node: NodeView, mark: SweepMark | None, *, fenced: bool) -> bool:
        """The mark (None: left as it is) and the fence in one write under the node's
        resourceVersion. False when the node changed meanwhile: the next pass
        plans again from the cache."""
        body = _node_patch(node, mark, fenced=fenced)
        try:
            raw = await self.api.patch(node_path(node.name), body)
        except ApiError as err:
            if err.code not in (404, 409):
                raise
            log.debug("sweep write skipped", extra={"node": node.name, "code": err.code})
            return False
        self.caches.put_node(decode_node(raw))
        return True

    async def _delete_orphans(self, fleet: Fleet, now: dt.datetime, config: Config) -> None:
        marks = {n.name: parse_mark(n.annotations.get(SWEEP)) for n in fleet.nodes}
        for job, pod in fleet.checks.items():
            mark = marks.get(pod.node)
            if mark is not None and mark.running and mark.job == job:
                continue
            epoch = job.rsplit("-", 1)[-1]
            if not epoch.isdigit() or now.timestamp() - int(epoch) < ORPHAN_AFTER_S:
                continue
            said = await validation.delete_job(self.api, DeleteValidationJob(job), config)
            if said == "deleted":
                log.info("sweep Job no mark names deleted", extra={"node": pod.node, "job": job})

    def _hold(self, seen: SweepPass) -> None:
        """Submit the failed checks that are faults still; resolve those no longer."""
        now_held = {h.node: h for h in seen.holds}
        for node, fault in list(self._held.items()):
            if now_held.get(node) is None or now_held[node].fault != fault:
                self.port.resolve(node, fault)
                del self._held[node]
                log.info("sweep fault no longer held", extra={"node": node, "fault_id": fault})
        for hold in seen.holds:
            self._held[hold.node] = hold.fault
            self.port.submit(source.signal_for(hold.node, hold.fault, hold.since))

    def _event(self, node: NodeView, reason: str, note: str, *, warning: bool) -> None:
        ref: ObjectRef = node_ref(node.name, node.uid, node.resource_version)
        self.recorder.emit(ref, reason=reason, note=note, action="Sweep", warning=warning)


def _node_patch(node: NodeView, mark: SweepMark | None, *, fenced: bool) -> dict[str, Any]:
    """A merge patch: everyone else's taints as read, the sweep's fence as asked."""
    taints = writes.taints_but(node, SWEEP_TAINT)
    if fenced:
        taints.append({"key": SWEEP_TAINT, "effect": "NoSchedule"})
    metadata: dict[str, Any] = {"resourceVersion": node.resource_version}
    if mark is not None:
        metadata["annotations"] = {SWEEP: mark.encode()}
    return {"metadata": metadata, "spec": {"taints": taints}}
