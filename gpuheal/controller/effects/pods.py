"""Effects on pods: the checkpoint request, the eviction (through the Eviction
API, so PodDisruptionBudgets hold), the delete past a budget, and the canary pods
a device's release waits on."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from gpuheal.controller.effects.context import (
    CONFLICT_RETRIES,
    EffectContext,
    Handler,
    PassOutcome,
    Replan,
)
from gpuheal.controller.effects.events import warn_on_pod
from gpuheal.kube import writes
from gpuheal.kube.api import ApiError, claim_path, pod_path
from gpuheal.kube.projections import decode_meta
from gpuheal.model import CHECKPOINT_REQUESTED, CanaryView, PodView
from gpuheal.policy.actions import DeletePod, Evict, NodeState, RequestCheckpoint
from gpuheal.policy.devices import CreateCanary, DeleteCanary
from gpuheal.vocabulary import Reason

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


async def request_checkpoint(
    fx: EffectContext, action: RequestCheckpoint, _state: NodeState, _outcome: PassOutcome
) -> str:
    """The checkpoint request on the pod, written once: the write is guarded by the
    pod's resourceVersion, so a request made meanwhile (by the leader before a
    failover, or `maintenance start`) is never overwritten: its deadline stands."""
    pod = action.pod
    path = pod_path(pod.namespace, pod.name)
    version = pod.resource_version
    for _ in range(CONFLICT_RETRIES):
        try:
            raw = await fx.api.patch(path, writes.checkpoint_request(action.deadline, version))
        except ApiError as err:
            if err.code == 404:
                return "gone"
            if err.code != 409:
                raise
            try:
                fresh = decode_meta(await fx.api.get(path))
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
        fx.caches.put_pod(
            replace(
                pod, checkpoint_requested=action.deadline, resource_version=written.resourceVersion
            )
        )
        return "requested"
    raise Replan(f"pod {pod.key}: conflicts did not settle")


async def evict(fx: EffectContext, action: Evict, _state: NodeState, outcome: PassOutcome) -> str:
    pod = action.pod
    try:
        await fx.api.create(f"{pod_path(pod.namespace, pod.name)}/eviction", writes.eviction(pod))
    except ApiError as err:
        if err.code == 404 or (err.code == 409 and "UID" in err.message):
            outcome.gone.append(pod.key)
            _count_eviction(fx, action, "gone")
            return "gone"
        if err.code == 429:
            by = refused_by(err, pod.namespace)
            outcome.blocked.append(pod.key)
            outcome.blocked_by[pod.key] = by
            _count_eviction(fx, action, "blocked")
            if pod.key not in fx.blocked_told:  # one Event per blocked pod
                fx.blocked_told.add(pod.key)
                detail = "; ".join(c.message for c in err.causes if c.message)
                warn_on_pod(
                    fx,
                    pod,
                    Reason.EVICTION_BLOCKED,
                    f"eviction of {pod.key} for fault {action.fault_id} refused by "
                    f"{by}: {detail or err.message}; retrying with backoff",
                    action="Evict",
                )
            return "blocked"
        _count_eviction(fx, action, "failed")
        raise
    _leaving(fx, pod, outcome, "evicted")
    where = f" off bad device {action.device}" if action.device else ""
    outcome.untold.append((pod.node, action.fault_id, f"{pod.key}{where}"))
    if action.device:
        fx.metrics.device_migrations.labels("evicted").inc()
    return "evicted"


def _count_eviction(fx: EffectContext, action: Evict, result: str) -> None:
    fx.metrics.pods_evicted.labels(result).inc()
    if action.device:
        fx.metrics.device_migrations.labels(result).inc()


def _leaving(fx: EffectContext, pod: PodView, outcome: PassOutcome, result: str) -> None:
    """A pod we evicted or deleted: mark it leaving in the cache, record it."""
    fx.caches.put_pod(replace(pod, deleting=True))
    outcome.evicted.append(pod.key)
    outcome.left[pod.key] = pod.uid
    fx.metrics.pods_evicted.labels(result).inc()


async def delete_pod(
    fx: EffectContext, action: DeletePod, _state: NodeState, outcome: PassOutcome
) -> str:
    pod = action.pod
    try:
        await fx.api.delete(pod_path(pod.namespace, pod.name), writes.pod_delete(pod))
    except ApiError as err:
        if err.code in (404, 409):
            outcome.gone.append(pod.key)
            return "gone"
        raise
    _leaving(fx, pod, outcome, "deleted")
    # Rare and past a budget: said on the Pod itself.
    warn_on_pod(
        fx,
        pod,
        Reason.EVICTED,
        f"deleted GPU pod {pod.key} for fault {action.fault_id}: eviction stayed "
        f"blocked for {fx.config().eviction_delete_after_seconds:g}s",
        action="Delete",
    )
    return "deleted"


async def create_canary(
    fx: EffectContext, action: CreateCanary, _state: NodeState, _outcome: PassOutcome
) -> str:
    cfg = fx.config().device_health
    claim = ""
    if action.dra:
        if action.device is None:
            return "unplaced"  # no slice publishes the device: the canary times out
        claim = action.name
        device_class = cfg.canary_device_classes.get(action.device.kind, "")
        body = writes.canary_claim(
            claim, cfg.canary_namespace, action.record, action.device, device_class
        )
        await _create(fx, claim_path(cfg.canary_namespace), body)
    body = writes.canary_pod(
        action.name,
        cfg.canary_namespace,
        action.node,
        action.record,
        action.resource,
        image=cfg.canary_image,
        command=list(cfg.canary_command),
        timeout_seconds=cfg.canary_timeout_seconds,
        claim=claim,
    )
    if not await _create(fx, pod_path(cfg.canary_namespace), body):
        return "present"
    fx.caches.put_canary(CanaryView(action.name, action.node, "Pending"))
    return "created"


async def _create(fx: EffectContext, path: str, body: dict[str, Any]) -> bool:
    """Create; False when it is there already (AlreadyExists: an earlier try's)."""
    try:
        await fx.api.create(path, body)
    except ApiError as err:
        if err.code != 409:
            raise
        return False
    return True


async def delete_canary(
    fx: EffectContext, action: DeleteCanary, _state: NodeState, _outcome: PassOutcome
) -> str:
    """The canary pod, and its claim where it had one (a DRA device's): both named
    after the canary, so a delete that finds either gone is done."""
    namespace = fx.config().device_health.canary_namespace
    gone = not await _delete(fx, pod_path(namespace, action.name))
    if action.dra:
        await _delete(fx, claim_path(namespace, action.name))
    return "gone" if gone else "deleted"


async def _delete(fx: EffectContext, path: str) -> bool:
    """Delete; False when it was gone already."""
    try:
        await fx.api.delete(path)
    except ApiError as err:
        if err.code != 404:
            raise
        return False
    return True


HANDLERS: dict[type, Handler] = {
    RequestCheckpoint: request_checkpoint,
    Evict: evict,
    DeletePod: delete_pod,
    CreateCanary: create_canary,
    DeleteCanary: delete_canary,
}
