"""`gpuheal maintenance start | finish NODE`: requests the leading controller carries
out (gpuheal/controller/maintenance.py), so a drain that takes an hour needs no
terminal kept open, and one identity (the controller's) takes nodes out and
returns them.

The command writes the request on the node (gpuheal.io/maintenance-request,
policy/maintenancewire.py) under the node's resourceVersion, refused while another
is pending, so two operators never overwrite each other. By default it then
follows the controller's record (gpuheal.io/maintenance-progress): each line the
work says (the drain's blockers, the validation Job) on stderr as it comes, then
the report and the exit code `maintenance` has always had. --no-wait returns once
the request is written. Interrupting the wait stops nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from typing import TYPE_CHECKING, Any

from rich.text import Text

from gpuheal.clock import iso
from gpuheal.kube.projections import NodeJson
from gpuheal.model import MAINTENANCE_PROGRESS, MAINTENANCE_REQUEST
from gpuheal.ops import exitcodes
from gpuheal.ops.fleet import why_unmanaged
from gpuheal.ops.gate import GateReport, get_node, node_named
from gpuheal.ops.maintenance import (
    StartReport,
    WriteError,
    guarded_write,
    leftovers,
    not_managed,
)
from gpuheal.ops.output import render
from gpuheal.policy.maintenancewire import (
    MaintenanceRequest,
    Progress,
    State,
    Verb,
    parse_progress,
    parse_request,
    request_id_of,
)
from gpuheal.values import text

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

# Said once when no controller has taken the request up by then.
NO_CONTROLLER_HINT_S = 30.0


class PendingError(Exception):
    """Another maintenance request is pending on the node."""


def _fail(ctx: Context, verb: str, why: str) -> None:
    ctx.err.print(Text(f"gpuheal maintenance {verb}: {why}", style="bold red"))


def _new_request(ctx: Context, verb: Verb, **options: Any) -> MaintenanceRequest:
    return MaintenanceRequest(
        id=secrets.token_hex(6),
        verb=verb,
        by=text(ctx.actor, 256),
        at=iso(ctx.now(), "seconds"),
        **options,
    )


async def _managed_node(ctx: Context, verb: Verb, name: str) -> NodeJson | int:
    """The node, if the controller manages it (by the config the command judges with,
    the controller's): else the refusal, exit 2, before anything is written."""
    node = await node_named(ctx, f"gpuheal maintenance {verb.value}", name)
    if isinstance(node, int):
        return node
    why = why_unmanaged(node, ctx.config)
    if why is not None:
        _fail(ctx, verb.value, not_managed(name, why))
        return exitcodes.USAGE
    return node


async def start(ctx: Context, args: argparse.Namespace) -> int:
    for flag, value in (("--checkpoint-wait", args.checkpoint_wait), ("--timeout", args.timeout)):
        if value is not None and value < 0:
            _fail(ctx, "start", f"{flag} must be 0 or more")
            return exitcodes.USAGE
    node = await _managed_node(ctx, Verb.START, args.node)
    if isinstance(node, int):
        return node
    request = _new_request(
        ctx,
        Verb.START,
        reason=text(args.reason, 256),
        checkpoint=args.checkpoint,
        checkpoint_wait_s=args.checkpoint_wait,
        drain=not args.no_drain,
        drain_timeout_s=args.timeout,
        delete_emptydir_data=args.delete_emptydir_data,
        force=args.force,
    )
    return await _request(ctx, node, request, args)


async def finish(ctx: Context, args: argparse.Namespace) -> int:
    node = await _managed_node(ctx, Verb.FINISH, args.node)
    if isinstance(node, int):
        return node
    if not leftovers(node, ctx.config):
        ctx.err.print(
            Text(
                f"gpuheal maintenance finish: node {args.node} is not in maintenance; "
                "nothing to finish"
            )
        )
        return exitcodes.USAGE
    request = _new_request(ctx, Verb.FINISH, validate=getattr(args, "validate", False))
    return await _request(ctx, node, request, args)


async def _request(
    ctx: Context, node: NodeJson, request: MaintenanceRequest, args: argparse.Namespace
) -> int:
    verb = request.verb.value

    def build(current: NodeJson) -> dict[str, Any]:
        pending = current.metadata.annotations.get(MAINTENANCE_REQUEST)
        if pending is not None:
            raise PendingError(pending)
        return {
            "metadata": {
                "resourceVersion": current.metadata.resourceVersion,
                "annotations": {MAINTENANCE_REQUEST: request.encode()},
            }
        }

    try:
        await guarded_write(ctx, node.metadata.name, node, build)
    except PendingError as pending:
        _fail(ctx, verb, _pending(node.metadata.name, str(pending)))
        return exitcodes.USAGE
    except WriteError as err:
        _fail(ctx, verb, str(err))
        return exitcodes.ERROR
    if not args.wait:
        ctx.err.print(
            Text(
                f"maintenance {verb} of {node.metadata.name} requested (id {request.id}); "
                "the leading controller carries it out: `gpuheal status` and `gpuheal doctor "
                f"{node.metadata.name}` show the node"
            )
        )
        return exitcodes.OK
    return await follow(ctx, node.metadata.name, request, poll_s=args.poll)


def _pending(node: str, raw: str) -> str:
    try:
        said = parse_request(raw).describe()
    except ValueError:
        said = f"id {request_id_of(raw) or '?'}"
    return (
        f"node {node} has a maintenance request pending ({said}): wait for the controller "
        f"to carry it out, or remove it (kubectl annotate node {node} {MAINTENANCE_REQUEST}-)"
    )


async def follow(ctx: Context, name: str, request: MaintenanceRequest, *, poll_s: float) -> int:
    """Read the node every `poll_s` until the controller records the request done,
    printing each new line of its progress on stderr; then the report."""
    shown, carried_by = 0, ""
    started = time.monotonic()
    hinted = False
    verb = request.verb.value
    while True:
        node = await get_node(ctx.api, name)
        if node is None:
            _fail(ctx, verb, f"node {name} was deleted")
            return exitcodes.NOT_FOUND
        annotations = node.metadata.annotations
        progress = parse_progress(annotations.get(MAINTENANCE_PROGRESS))
        if progress is not None and progress.id == request.id:
            if progress.by != carried_by:  # a new leader took it up: its own count
                carried_by, shown = progress.by, 0
            new = min(progress.count - shown, len(progress.lines))
            for line in progress.lines[len(progress.lines) - new :] if new > 0 else ():
                ctx.err.print(Text(line))
            shown = max(shown, progress.count)
            if progress.state is State.DONE:
                return _report(ctx, request, progress)
        elif request_id_of(annotations.get(MAINTENANCE_REQUEST)) != request.id:
            _fail(ctx, verb, "the request was removed before the controller took it up")
            return exitcodes.ERROR
        elif not hinted and time.monotonic() - started > NO_CONTROLLER_HINT_S:
            hinted = True
            ctx.err.print(
                Text(
                    "no controller has taken the request up yet: is `gpuheal controller` "
                    "running and leading, and does its nodeSelector cover the node? (still "
                    "waiting; Ctrl-C stops the wait, not the request)",
                    style="yellow",
                )
            )
        await asyncio.sleep(poll_s)


def _report(ctx: Context, request: MaintenanceRequest, progress: Progress) -> int:
    code = progress.code if progress.code is not None else exitcodes.ERROR
    report = progress.report
    if "error" in report:
        _fail(ctx, request.verb.value, str(report["error"]))
        return code
    if request.verb is Verb.START:
        render(StartReport.from_data(report), ctx.output, ctx.out)
    else:
        render(GateReport.from_data(report), ctx.output, ctx.out)
    return code
