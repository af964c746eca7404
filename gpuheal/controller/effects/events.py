"""Effects that tell people: the plan's Events, queued during the pass and sent
when it ends (after the record they point to), one Event per fault for the pods a
pass evicted, and Warnings on a pod."""

from __future__ import annotations

from gpuheal.controller.effects.context import EffectContext, Handler, PassOutcome
from gpuheal.kube.events import ObjectRef, fault_ref, pod_ref
from gpuheal.model import PodView
from gpuheal.policy.actions import Emit, NodeState
from gpuheal.vocabulary import Reason


async def queue(fx: EffectContext, action: Emit, _state: NodeState, outcome: PassOutcome) -> str:
    """Sent when the pass ends, after the record it names is written."""
    outcome.emits.append(action)
    return "queued"


def send(fx: EffectContext, action: Emit, state: NodeState) -> None:
    record = fx.caches.record(action.record) if action.record else None
    node = fx.node_ref(action.node, state)
    fault = (
        fault_ref(action.record, record.uid, record.resource_version)
        if record is not None
        else fault_ref(action.record)
    )
    verb = action.reason.removeprefix("GPUFault").removeprefix("GPUPod").removeprefix("GPU")
    # On the Node only, its record named as related: the record's own history
    # (status.actions, shown by `kubectl describe gpufault`) is the durable copy,
    # and a second Event per step would double the requests for nothing.
    fx.recorder.emit(
        node,
        reason=action.reason,
        note=action.note,
        action=verb,
        warning=action.warning,
        related=fault if action.record else None,
    )


def tell_evictions(fx: EffectContext, outcome: PassOutcome) -> None:
    """One Event on the Node per fault for all the pods the pass evicted, not one per
    pod: the pods are on their way out (a Pod's Events go with it), and the node is
    where people look for what was done about its fault."""
    by_fault: dict[tuple[str, str], list[str]] = {}
    for node, fault_id, pod in outcome.untold:
        by_fault.setdefault((node, fault_id), []).append(pod)
    outcome.untold = []
    for (node, fault_id), pods in by_fault.items():
        fx.recorder.emit(
            fx.node_ref(node),
            reason=Reason.EVICTED,
            note=f"evicted {len(pods)} GPU pod{'s' if len(pods) != 1 else ''} for fault "
            f"{fault_id}: {', '.join(pods)}",
            action="Evict",
        )


def warn_on_pod(fx: EffectContext, pod: PodView, reason: str, note: str, *, action: str) -> None:
    """A Warning Event on the Pod, in its namespace (where its owner looks), its Node
    named as related."""
    fx.recorder.emit(
        _pod_ref(pod),
        reason=reason,
        note=note,
        action=action,
        warning=True,
        related=fx.node_ref(pod.node),
    )


def _pod_ref(pod: PodView) -> ObjectRef:
    return pod_ref(pod.namespace, pod.name, pod.uid, pod.resource_version)


HANDLERS: dict[type, Handler] = {Emit: queue}
