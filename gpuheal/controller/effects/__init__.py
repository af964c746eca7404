"""The effects: what each kind of action does to the world, one module per resource
(records, nodes, pods, events, jobs, hooks, fences), each registering one handler per
action type. An effect builds its bodies through gpuheal/kube/writes.py, writes
through to the caches and says what came of it; it makes no policy choice (what to
do, in which order, under which guard is the plan's, gpuheal/policy/plan/)."""

from __future__ import annotations

from typing import Any

from gpuheal.controller.effects import events, fences, hooks, jobs, nodes, pods, records
from gpuheal.controller.effects.context import Handler

HANDLERS: dict[type, Handler] = {
    **records.HANDLERS,
    **nodes.HANDLERS,
    **pods.HANDLERS,
    **events.HANDLERS,
    **jobs.HANDLERS,
    **fences.HANDLERS,
    **hooks.HANDLERS,
}


def handler_for(kind: type[Any]) -> Handler:
    """The handler of an action of type `kind`: its own, else its nearest base's (AwaitApproval
    and WouldQuarantine are UpdateRecords to the records effect; ReplaceIntent is
    one too, with a handler of its own)."""
    for base in kind.__mro__:
        if base in HANDLERS:
            return HANDLERS[base]
    raise TypeError(f"no effect carries out {kind.__name__}")
