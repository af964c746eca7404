"""The drain stage (`full` mode): the fault's node's GPU pods move through the
Eviction API, each asked to checkpoint first where `checkpoint` says so; a
refused eviction waits out its backoff, and is a deletion after
`evictionDeleteAfterSeconds` where allowed. Once none is left the fault is marked
handled (the mark), then its record says Drained."""

from __future__ import annotations

import datetime as dt

from gpuheal.config import Config
from gpuheal.model import Phase, PodView
from gpuheal.policy.actions import (
    Action,
    DeletePod,
    Emit,
    Evict,
    MarkHandled,
    RequestCheckpoint,
    UpdateRecord,
)
from gpuheal.policy.backoff import Blocked
from gpuheal.policy.checkpoint import CheckpointStep, PodCheckpoint, next_look, where
from gpuheal.policy.plan.fault import Fault, entry, gpu_pods, soonest
from gpuheal.vocabulary import Entry, Reason


def drain_step(
    fault: Fault, config: Config, now: dt.datetime
) -> tuple[list[Action], list[Action], float | None]:
    """Evict the GPU pods (the drain); once none is left, mark handled (the mark).
    Also when to look again (None: drained)."""
    state, signal, record = fault.state, fault.signal, fault.record
    if gpu_pods(state):
        return _evictions(fault, config, now)
    # Drained: only now mark the fault handled, then its record.
    actions: list[Action] = []
    if not fault.handled:
        actions.append(MarkHandled(state.node.name, signal.fault_id))
    if record.phase is not Phase.DRAINED:
        actions.append(UpdateRecord(record.name, Phase.DRAINED, entry(now, Entry.DRAIN)))
    return [], actions, None


def _evictions(
    fault: Fault, config: Config, now: dt.datetime
) -> tuple[list[Action], list[Action], float | None]:
    record = fault.record
    pods = gpu_pods(fault.state)
    to_evict = [p for p in pods if not p.deleting]
    standing = _checkpoints(to_evict, fault, config, now)
    ready = [p for p in to_evict if p.key not in standing or standing[p.key].evict_now]
    # A refused eviction waits out its backoff, whatever brings the node back here
    # sooner (a pod event, a watch echo): each attempt is a request and a record write.
    waits = {p.key: _next_attempt(p, _refusal(p, fault), config, now) for p in ready}
    due = [p for p in ready if waits[p.key] <= 0]
    asked = _ask(fault, list(standing.values()), now)
    actions: list[Action] = [*asked, *(_evict_or_delete(p, fault, config, now) for p in due)]
    actions += _checkpoint_outcomes([standing[p.key] for p in due if p.key in standing], fault, now)
    # Only news goes into the record: pods terminating for their grace period
    # (seconds to minutes) or waiting for their next attempt must not rewrite it
    # on every reconcile.
    if due or (record.phase is not Phase.DRAINING and not asked):
        detail = f"{len(to_evict)} to evict, {len(pods) - len(to_evict)} terminating"
        actions.append(
            UpdateRecord(
                record.name,
                Phase.DRAINING,
                entry(now, Entry.EVICT, detail=detail),
                record_evictions=True,
            )
        )
    # Terminating pods (and those tried now) are polled; a waiting one is looked
    # at again when its next attempt is due.
    terminating = len(pods) > len(to_evict)
    requeue = config.eviction_retry_base_seconds if due or terminating else None
    for wait in waits.values():
        if wait > 0:
            requeue = soonest(requeue, wait)
    deadline = next_look(list(standing.values()), now)
    if deadline is not None:
        requeue = soonest(requeue, deadline)
    return actions, [], requeue


def _checkpoints(
    pods: list[PodView], fault: Fault, config: Config, now: dt.datetime
) -> dict[str, PodCheckpoint]:
    """Where each pod stands with its checkpoint (docs/controller.md, "Checkpoint
    before eviction"); empty when the fault moves its pods at once."""
    wanted = config.checkpoint
    if not wanted.applies(fault.signal.reason, fault.signal.severity):
        return {}
    return {p.key: where(p, wanted, now) for p in pods}


def _ask(fault: Fault, standing: list[PodCheckpoint], now: dt.datetime) -> list[Action]:
    """The requests to make now, then their record entry and Event. The entry is
    also written when the pods were asked but the record does not say so (the
    controller stopped between the two)."""
    record, signal = fault.record, fault.signal
    new = [c for c in standing if c.step is CheckpointStep.REQUEST]
    said = any(a.action == Entry.CHECKPOINT_REQUESTED for a in record.actions)
    waiting = [c for c in standing if c.step is CheckpointStep.WAITING]
    if not new and (said or not waiting):
        return []
    asked = new or waiting
    deadline = max(c.deadline for c in asked)
    pods = ", ".join(c.pod.key for c in asked)
    detail = f"{len(asked)} GPU pod(s) asked to checkpoint by {deadline}: {pods}"
    return [
        *(RequestCheckpoint(c.pod, signal.fault_id, c.deadline) for c in new),
        UpdateRecord(
            record.name, Phase.DRAINING, entry(now, Entry.CHECKPOINT_REQUESTED, "waiting", detail)
        ),
        Emit(
            Reason.CHECKPOINT_REQUESTED,
            f"fault {signal.fault_id} ({signal.reason}): {detail}; evicted when each says "
            "done, or at its deadline",
            signal.node,
            record.name,
        ),
    ]


def _checkpoint_outcomes(
    evicted: list[PodCheckpoint], fault: Fault, now: dt.datetime
) -> list[Action]:
    """Per pod evicted after its checkpoint request, why now: it said done, or its
    deadline passed. Once per pod (a blocked eviction is tried again)."""
    record = fault.record
    told = {
        a.detail.partition(": ")[0]
        for a in record.actions
        if a.action in (Entry.CHECKPOINTED, Entry.CHECKPOINT_TIMEOUT)
    }
    actions: list[Action] = []
    for c in evicted:
        if c.pod.key in told:
            continue
        if c.step is CheckpointStep.DONE:
            said = entry(now, Entry.CHECKPOINTED, detail=f"{c.pod.key}: said done")
        else:
            by = f"by {c.deadline}" if c.deadline else "(its deadline is not a time)"
            said = entry(now, Entry.CHECKPOINT_TIMEOUT, "timed-out", f"{c.pod.key}: not done {by}")
        actions.append(UpdateRecord(record.name, Phase.DRAINING, said))
    return actions


def _refusal(pod: PodView, fault: Fault) -> Blocked | None:
    """The pod's refused eviction for this fault (one for an earlier fault is over)."""
    blocked = fault.state.blocked.get(pod.key)
    return blocked if blocked is not None and blocked.fault_id == fault.signal.fault_id else None


def _delete_at(pod: PodView, blocked: Blocked | None, config: Config) -> dt.datetime | None:
    """When a blocked pod may be deleted instead (evictionDeleteAfterSeconds), if ever."""
    limit = config.eviction_delete_after_seconds
    if blocked is None or limit is None or pod.namespace in config.protected_namespaces:
        return None
    return blocked.since + dt.timedelta(seconds=limit)


def _next_attempt(pod: PodView, blocked: Blocked | None, config: Config, now: dt.datetime) -> float:
    """Seconds until the pod's next attempt (0: now): its backoff, or its deletion
    if that comes sooner."""
    if blocked is None:
        return 0.0
    at = blocked.retry_at
    delete_at = _delete_at(pod, blocked, config)
    if delete_at is not None:
        at = min(at, delete_at)
    return max((at - now).total_seconds(), 0.0)


def _evict_or_delete(
    pod: PodView, fault: Fault, config: Config, now: dt.datetime
) -> Evict | DeletePod:
    delete_at = _delete_at(pod, _refusal(pod, fault), config)
    if delete_at is not None and now >= delete_at:
        return DeletePod(pod, fault.signal.fault_id)
    return Evict(pod, fault.signal.fault_id)
