"""Effects on Jobs: the health gate's validation Job (its body in kube/validation.py)."""

from __future__ import annotations

from gpuheal.controller.effects.context import EffectContext, Handler, PassOutcome
from gpuheal.kube import validation
from gpuheal.policy.actions import NodeState
from gpuheal.policy.validation import CreateValidationJob, DeleteValidationJob


async def create_validation_job(
    fx: EffectContext, action: CreateValidationJob, _state: NodeState, _outcome: PassOutcome
) -> str:
    return await validation.create_job(fx.api, action, fx.config())


async def delete_validation_job(
    fx: EffectContext, action: DeleteValidationJob, _state: NodeState, _outcome: PassOutcome
) -> str:
    return await validation.delete_job(fx.api, action, fx.config())


HANDLERS: dict[type, Handler] = {
    CreateValidationJob: create_validation_job,
    DeleteValidationJob: delete_validation_job,
}
