"""The Node Events of maintenance's steps (started, finished, the gate's refusal),
written by whoever runs them: the leader carrying out a maintenance request or a
roll-out (reportingController gpuheal.io/controller, ctx.reporting_controller).
Best effort, never a reason to fail; sent at once, not queued through the
controller's recorder: a person waiting on the request expects `kubectl describe
node` to show them as the step ends."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import aiohttp
from rich.text import Text

from gpuheal.kube.api import ApiError
from gpuheal.kube.events import EVENT_NAMESPACE, event_body, node_ref
from gpuheal.kube.projections import NodeJson

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

EVENTS = f"/apis/events.k8s.io/v1/namespaces/{EVENT_NAMESPACE}/events"


async def emit_node_event(
    ctx: Context, node: NodeJson, *, reason: str, note: str, action: str, warning: bool = False
) -> None:
    """One events.k8s.io/v1 Event on the Node (by its UID, so `kubectl describe node`
    lists it); a failure is a warning, not an error."""
    meta = node.metadata
    body = event_body(
        node_ref(meta.name, meta.uid, meta.resourceVersion),
        reason=reason,
        note=note,
        action=action,
        warning=warning,
        related=None,
        instance=ctx.actor or "gpuheal-cli",
        now=ctx.now().astimezone(dt.UTC),
        controller=ctx.reporting_controller,
    )
    try:
        await ctx.api.create(EVENTS, body)
    except (ApiError, aiohttp.ClientError, TimeoutError) as err:
        why = str(err) or type(err).__name__
        ctx.err.print(Text(f"warning: Event {reason} not recorded: {why}", style="yellow"))
