"""Effects on DeviceTaintRules: the device fence of one DRA GPU, created and deleted
(policy/devicefence.py decides which). Its name is its record's, so a create that
finds it there (AlreadyExists) and a delete that finds it gone (NotFound) are
success: a controller killed at any step leaves one rule, and a second try no
other."""

from __future__ import annotations

from gpuheal.controller.effects.context import EffectContext, Handler, PassOutcome
from gpuheal.kube.api import ApiError, device_taint_rule_path
from gpuheal.kube.projections import decode_fence, decode_meta
from gpuheal.policy.actions import NodeState
from gpuheal.policy.devicefence import FenceDevice, Unfence
from gpuheal.policy.fence import device_taint_rule


async def fence_device(
    fx: EffectContext, action: FenceDevice, _state: NodeState, _outcome: PassOutcome
) -> str:
    body = device_taint_rule(
        node=action.node,
        record=action.record,
        fault_id=action.fault_id,
        reason=action.reason,
        device=action.device,
        effect=action.effect,
        expires=action.expires,
        version=action.api_version,
        kind=action.kind,
    )
    try:
        raw = await fx.api.create(device_taint_rule_path("", action.api_version), body)
    except ApiError as err:
        if err.code != 409:
            raise
        return "present"
    fx.caches.put_fence(decode_fence(raw), decode_meta(raw).resourceVersion)
    return "created"


async def unfence(
    fx: EffectContext, action: Unfence, _state: NodeState, _outcome: PassOutcome
) -> str:
    try:
        await fx.api.delete(device_taint_rule_path(action.name, action.api_version))
    except ApiError as err:
        if err.code != 404:
            raise
        return "gone"
    return "deleted"


HANDLERS: dict[type, Handler] = {FenceDevice: fence_device, Unfence: unfence}
