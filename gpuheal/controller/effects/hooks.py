"""Effects outside the cluster: the provider's replace hook (controller/replace.py)."""

from __future__ import annotations

import datetime as dt

from gpuheal.controller.effects.context import EffectContext, Handler, PassOutcome
from gpuheal.controller.effects.records import gather
from gpuheal.controller.replace import call_hook
from gpuheal.policy.actions import Emit, NodeState, UpdateRecord
from gpuheal.policy.replace import CallReplace


async def call_replace(
    fx: EffectContext, action: CallReplace, _state: NodeState, outcome: PassOutcome
) -> str:
    """The provider's hook, once for this look; its outcome goes into the record with
    the pass's news, and its Event (both as the policy words them) after it."""
    accepted, detail = await call_hook(fx.config().repair.replace, action)
    entry = action.outcome(accepted, detail, dt.datetime.now(dt.UTC))
    gather(fx, UpdateRecord(action.record, action.phase, entry), outcome)
    reason, note, warning = action.told(accepted, entry)
    outcome.emits.append(Emit(reason, note, action.node, action.record, warning=warning))
    return entry.action


HANDLERS: dict[type, Handler] = {CallReplace: call_replace}
