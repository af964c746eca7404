"""The Node Events the operator commands write (maintenance start and finish, the
gate's refusal at finish): best effort, like the controller's, never a reason to
fail. They are sent at once, not queued: a command is over in seconds and an
operator reading its output expects `kubectl describe node` to show them."""

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
