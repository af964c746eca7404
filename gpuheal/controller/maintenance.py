"""`gpuheal maintenance start|finish` carried out by the leader: the CLI writes a
request on the node (gpuheal.io/maintenance-request, policy/maintenancewire.py),
this loop finds it in the node informer's cache, carries it out with maintenance's
own steps (ops/maintenance.py: take_out, the gate and the finish write), records
the progress as it goes (gpuheal.io/maintenance-progress: the lines the CLI
prints while it waits) and, once done, the exit code and report, removing the
request in the same write.

A request stays until it is recorded done, and every step is safe to repeat (a
node in maintenance resumes, a drained one has nothing to evict, the gate only
reads), so a new leader after a failover carries on from the node. One task per
node; the request's id ties the record to it, so a request written meanwhile by
someone else is never removed by the record of an older one.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

import aiohttp

from gpuheal.clock import iso
from gpuheal.config import Config
from gpuheal.controller.keyed import KeyedTasks
from gpuheal.controller.said import SaidLines
from gpuheal.kube.api import ApiError, KubeApi, node_path
from gpuheal.kube.events import REPORTING_CONTROLLER
from gpuheal.kube.projections import NodeJson
from gpuheal.model import MAINTENANCE_PROGRESS, MAINTENANCE_REQUEST, NodeView
from gpuheal.ops import exitcodes
from gpuheal.ops.context import Context
from gpuheal.ops.events import emit_node_event
from gpuheal.ops.fleet import why_unmanaged
from gpuheal.ops.gate import get_node
from gpuheal.ops.maintenance import (
    Carried,
    TakeOut,
    WriteError,
    carry_out_finish,
    carry_out_start,
    guarded_write,
    not_managed,
)
from gpuheal.policy.backoff import backoff_delay
from gpuheal.policy.maintenancewire import (
    BadRequestError,
    MaintenanceRequest,
    Progress,
    State,
    Verb,
    kept_lines,
    parse_request,
    request_id_of,
)
from gpuheal.supervisor import Supervisor
from gpuheal.vocabulary import Reason

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0


class MaintenanceLoop:
    """The leader's maintenance requests: one task per node that has one."""

    def __init__(
        self,
        config: Callable[[], Config],
        api: KubeApi,
        *,
        nodes: Callable[[], Iterable[NodeView]],
        identity: str,
        supervisor: Supervisor,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.config = config
        self.api = api
        self.nodes = nodes
        self.identity = identity
        self.now = now
        self._carrying = KeyedTasks("maintenance", supervisor)

    async def run(self) -> None:
        try:
            while True:
                for node in self.nodes():
                    if MAINTENANCE_REQUEST in node.annotations:
                        self._carrying.ensure(node.name, partial(self.carry_out, node.name))
                await asyncio.sleep(self.config().maintenance.poll_seconds)
        finally:
            await self._carrying.cancel_all()

    async def carry_out(self, name: str) -> None:
        """The node's request, read from the API server (the cache may be a step
        behind), until it is recorded done; an API failure is tried again after a
        growing pause."""
        failures = 0
        while True:
            try:
                node = await get_node(self.api, name)
                raw = node.metadata.annotations.get(MAINTENANCE_REQUEST) if node else None
                if node is None or raw is None:
                    return
                try:
                    request = parse_request(raw)
                except BadRequestError as err:
                    await self._refuse(node, raw, f"bad maintenance request: {err}")
                    return
                why = why_unmanaged(node, self.config())
                if why is not None:
                    await self._refuse(node, raw, not_managed(name, why), request)
                    return
                await self._carry_out(node, request)
                return
            except (ApiError, WriteError, aiohttp.ClientError, TimeoutError) as err:
                failures += 1
                wait_s = backoff_delay(failures, 1.0, MAX_BACKOFF_S, jitter=0.2)
                log.warning(
                    "maintenance request not carried out; trying again",
                    extra={"node": name, "error": str(err), "retry_s": wait_s},
                )
                await asyncio.sleep(wait_s)

    def context(self, lines: SaidLines) -> Context:
        return Context(
            api=self.api,
            config=self.config(),
            err=lines.console(),
            now=self.now,
            actor=self.identity,
            reporting_controller=REPORTING_CONTROLLER,
        )

    async def _carry_out(self, node: NodeJson, request: MaintenanceRequest) -> None:
        name = node.metadata.name
        lines = SaidLines({"node": name, "request": request.id, "verb": request.verb.value})
        lines.say(f"{request.verb.value} taken up by the controller {self.identity}")
        log.info("maintenance request taken up", extra={"node": name, "request": request.id})
        await self._progress(name, request, lines)
        ctx = self.context(lines)
        recorder = asyncio.create_task(self._record_progress(name, request, lines))
        try:
            if request.verb is Verb.START:
                carried = await carry_out_start(ctx, node, _take_out(request))
            else:
                carried = await carry_out_finish(
                    ctx,
                    node,
                    validate=request.validate,
                    also=lambda current, code, report: self._done(
                        current, request, lines, code, report
                    ),
                )
        finally:
            recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recorder
        if "error" in carried.report:
            lines.say(str(carried.report["error"]))
        if not carried.recorded:
            await self._record(ctx, node, request, lines, carried)
        log.info(
            "maintenance request done",
            extra={"node": name, "request": request.id, "code": carried.code},
        )

    # -- the record ---------------------------------------------------------------------

    def _progress_value(
        self,
        request_id: str,
        verb: str,
        lines: SaidLines,
        *,
        code: int | None = None,
        report: Mapping[str, Any] | None = None,
    ) -> str:
        done = code is not None
        return Progress(
            id=request_id,
            verb=verb,
            state=State.DONE if done else State.RUNNING,
            by=self.identity,
            at=iso(self.now(), "seconds"),
            lines=kept_lines(lines.lines),
            count=lines.count,
            code=code,
            report=dict(report or {}),
        ).encode()

    async def _progress(self, name: str, request: MaintenanceRequest, lines: SaidLines) -> None:
        """The progress so far: the controller's own annotation, merge-patched."""
        value = self._progress_value(request.id, request.verb.value, lines)
        body = {"metadata": {"annotations": {MAINTENANCE_PROGRESS: value}}}
        await self.api.patch(node_path(name), body)

    async def _record_progress(
        self, name: str, request: MaintenanceRequest, lines: SaidLines
    ) -> None:
        """Each new line recorded, at most once per maintenance.pollSeconds."""
        while True:
            await lines.changed.wait()
            lines.changed.clear()
            try:
                await self._progress(name, request, lines)
            except (ApiError, aiohttp.ClientError, TimeoutError) as err:  # the next line tries
                log.warning("progress not recorded", extra={"node": name, "error": str(err)})
            await asyncio.sleep(self.config().maintenance.poll_seconds)

    def _done(
        self,
        current: NodeJson,
        request: MaintenanceRequest,
        lines: SaidLines,
        code: int,
        report: Mapping[str, Any],
    ) -> dict[str, str | None]:
        """The annotations that record the request done: its result, and the request
        removed unless someone wrote another meanwhile."""
        out: dict[str, str | None] = {
            MAINTENANCE_PROGRESS: self._progress_value(
                request.id, request.verb.value, lines, code=code, report=report
            )
        }
        if request_id_of(current.metadata.annotations.get(MAINTENANCE_REQUEST)) == request.id:
            out[MAINTENANCE_REQUEST] = None
        return out

    async def _record(
        self,
        ctx: Context,
        node: NodeJson,
        request: MaintenanceRequest,
        lines: SaidLines,
        carried: Carried,
    ) -> None:
        def build(current: NodeJson) -> dict[str, Any]:
            annotations = self._done(current, request, lines, carried.code, carried.report)
            return {
                "metadata": {
                    "resourceVersion": current.metadata.resourceVersion,
                    "annotations": annotations,
                }
            }

        fresh = await get_node(self.api, node.metadata.name)
        if fresh is not None:
            await guarded_write(ctx, node.metadata.name, fresh, build)

    async def _refuse(
        self, node: NodeJson, raw: str, why: str, request: MaintenanceRequest | None = None
    ) -> None:
        """A request not carried out (it does not decode, or its node is not one the
        controller manages): recorded done with exit 2 and the reason, and said in a
        Warning Event on the node, changing nothing else (no mark, cordon, taint or
        eviction); the request is removed, so it is refused once."""
        name = node.metadata.name
        log.warning("maintenance request refused", extra={"node": name, "error": why})
        lines = SaidLines({"node": name})
        lines.say(why)
        request_id = request.id if request else request_id_of(raw) or "unreadable"
        verb = request.verb.value if request else ""
        report = {"error": why}
        value = self._progress_value(request_id, verb, lines, code=exitcodes.USAGE, report=report)
        ctx = self.context(lines)

        def build(current: NodeJson) -> dict[str, Any]:
            annotations: dict[str, str | None] = {MAINTENANCE_PROGRESS: value}
            if current.metadata.annotations.get(MAINTENANCE_REQUEST) == raw:
                annotations[MAINTENANCE_REQUEST] = None
            return {
                "metadata": {
                    "resourceVersion": current.metadata.resourceVersion,
                    "annotations": annotations,
                }
            }

        written = await guarded_write(ctx, name, node, build)
        await emit_node_event(
            ctx,
            written,
            reason=Reason.MAINTENANCE_REFUSED,
            note=f"maintenance {verb or 'request'} refused: {why}",
            action="Maintenance",
            warning=True,
        )


def _take_out(request: MaintenanceRequest) -> TakeOut:
    return TakeOut(
        reason=request.reason,
        checkpoint=request.checkpoint,
        checkpoint_wait_s=request.checkpoint_wait_s,
        drain=request.drain,
        drain_timeout_s=request.drain_timeout_s,
        delete_emptydir_data=request.delete_emptydir_data,
        force=request.force,
    )
