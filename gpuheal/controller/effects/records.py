"""Effects on GPUFault records: the record created first (the fault's lock), the
pass's entries gathered as its news and written in one status PATCH."""

from __future__ import annotations

import logging
from typing import Any

from gpuheal.controller.effects.context import (
    CONFLICT_RETRIES,
    EffectContext,
    Handler,
    PassOutcome,
    RecordNews,
    Replan,
)
from gpuheal.kube import writes
from gpuheal.kube.api import ApiError, gpufault_path
from gpuheal.kube.projections import decode_fault
from gpuheal.model import ActionEntry, FaultRecord, FaultSignal
from gpuheal.policy import history
from gpuheal.policy.actions import CreateRecord, NodeState, ReplaceIntent, UpdateRecord
from gpuheal.policy.devices import CreateDeviceRecord, DeviceReleased
from gpuheal.policy.repair import repair_metric

log = logging.getLogger(__name__)


async def create_record(
    fx: EffectContext, action: CreateRecord, _state: NodeState, _outcome: PassOutcome
) -> str:
    """The record alone: its status (the CRD's subresource: a create cannot carry
    it), `detect` entry first, is the plan's UpdateRecords, written when the pass
    ends, or on the drain pass for a new quarantine (Plan.steps)."""
    sig = action.signal
    record = await _create_lock(
        fx, action.name, writes.fault_record(action.name, sig, action.mode, action.supersedes)
    )
    fx.metrics.faults_detected.labels(record.source, record.reason, sig.severity.value).inc()
    if sig.altered:
        _input_altered(fx, sig)
    return "created"


async def _create_lock(fx: EffectContext, name: str, body: dict[str, Any]) -> FaultRecord:
    """Create a GPUFault record, the fault's cross-replica lock
    (docs/architecture.md#exactly-once). AlreadyExists: the fault is owned (by us
    before a restart, or another replica): the cache takes the record as it is and
    the node is planned again (Replan)."""
    try:
        raw = await fx.api.create(gpufault_path(), body)
    except ApiError as err:
        if err.code != 409:
            raise
        fx.metrics.duplicates_suppressed.labels("record").inc()
        fx.caches.put_record(decode_fault(await fx.api.get(gpufault_path(name))))
        raise Replan(f"GPUFault {name} already exists") from err
    record = decode_fault(raw)
    fx.caches.put_record(record)
    return record


def _input_altered(fx: EffectContext, sig: FaultSignal) -> None:
    """Said once per fault (its record is created once): the source reported what
    the API server cannot carry, and the fault goes on normalized."""
    for name in sig.altered:
        fx.metrics.inputs_altered.labels(sig.source.split("/", 1)[0], name).inc()
    log.warning(
        "fault input normalized",
        extra={"node": sig.node, "fault_id": sig.fault_id, "fields": list(sig.altered)},
    )


async def create_device_record(
    fx: EffectContext, action: CreateDeviceRecord, _state: NodeState, _outcome: PassOutcome
) -> str:
    """The device fault's record: created first, it is the lock (node, resource,
    resourceID, episode are in its name), as for node faults."""
    rec = action.record
    await _create_lock(fx, rec.name, writes.device_record(rec, fx.config().mode_for(rec.reason)))
    fx.metrics.faults_detected.labels(rec.source, rec.reason, rec.severity.value).inc()
    if rec.contact_support:
        fx.metrics.contact_support.inc()
    status = writes.record_status(
        rec.phase, list(rec.actions), expiry=rec.expiry, contactSupport=rec.contact_support
    )
    raw = await fx.api.patch(gpufault_path(rec.name, status=True), status)
    fx.caches.put_record(decode_fault(raw))
    return "created"


async def update_record(
    fx: EffectContext, action: UpdateRecord, _state: NodeState, outcome: PassOutcome
) -> str:
    """Gathered into the record's news: written once, when the pass ends."""
    gather(fx, action, outcome)
    return action.phase.value


def gather(fx: EffectContext, action: UpdateRecord, outcome: PassOutcome) -> None:
    """An entry into its record's news (and the repairs metric, when it counts one)."""
    counted = repair_metric(action.entry)
    if counted is not None:
        fx.metrics.repairs.labels(*counted).inc()
    news = outcome.news.get(action.name)
    if news is None:
        outcome.news[action.name] = news = RecordNews(action.phase)
    news.add(action)


async def write_intent(
    fx: EffectContext, action: ReplaceIntent, _state: NodeState, outcome: PassOutcome
) -> str:
    """The intent of a provider-hook call, written now (with what the pass decided
    about the record before it): the call comes only after it is stored."""
    gather(fx, action, outcome)
    await write_news(fx, action.name, outcome.news.pop(action.name), outcome)
    return "intent"


async def count_release(
    fx: EffectContext, action: DeviceReleased, _state: NodeState, _outcome: PassOutcome
) -> str:
    """A device record released: counted (nothing to write, the record says it)."""
    fx.metrics.device_releases.inc()
    if action.false_quarantine:
        fx.metrics.device_false_quarantines.inc()
    return "counted"


async def write_news(fx: EffectContext, name: str, news: RecordNews, outcome: PassOutcome) -> None:
    """The record's news in one status PATCH, under its resourceVersion."""
    for _ in range(CONFLICT_RETRIES):
        record = fx.caches.record(name)
        if record is None:
            record = decode_fault(await fx.api.get(gpufault_path(name)))
        # A repeat of the last entry (the same refusal, attempt after attempt) is
        # folded into it; the first entries are kept however long the history gets.
        actions: list[ActionEntry] = list(record.actions)
        for entry, evictions in news.entries:
            actions = history.append(
                actions,
                history.with_evictions(entry, outcome.evicted, outcome.blocked_by)
                if evictions
                else entry,
            )
        evicted = (
            sorted({*record.evicted_pods, *outcome.evicted})
            if news.evictions and outcome.evicted
            else None
        )
        body = writes.news_patch(
            record.resource_version,
            news.phase,
            actions,
            evicted=evicted,
            recovering_since=news.recovering_since,
            expiry=news.expiry,
            plan=news.plan.status() if news.plan is not None else None,
            contact_support=news.contact_support,
            repair_approval=news.repair_approval,
        )
        try:
            raw = await fx.api.patch(gpufault_path(name, status=True), body)
        except ApiError as err:
            if err.code != 409:
                raise
            fx.caches.put_record(decode_fault(await fx.api.get(gpufault_path(name))))
            continue
        fx.caches.put_record(decode_fault(raw))
        return
    raise Replan(f"GPUFault {name}: conflicts did not settle")


HANDLERS: dict[type, Handler] = {
    CreateRecord: create_record,
    CreateDeviceRecord: create_device_record,
    UpdateRecord: update_record,
    ReplaceIntent: write_intent,
    DeviceReleased: count_release,
}
