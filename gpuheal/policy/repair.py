"""The repair step: after the drain, ask the node's agent to carry out the fault's
recommended repair (a GPU reset, a reboot), exactly once per attempt, within a
cluster-wide budget, and escalate reset -> reboot -> a person.

Level-triggered like the rest of the plan: every decision is derived from what is
observed, the node's request and result annotations (policy/repairwire.py) and the
record's entries, never from memory. The attempt number is in the request, and the
attempt's action follows from it (the ladder), so a restarted or new controller
continues where the node is: a request present is never made again, a result is
recorded once (its entry names the attempt).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gpuheal import values
from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.model import (
    APPROVED,
    REPAIR_REQUEST,
    REPAIR_RESULT,
    ActionEntry,
    FaultRecord,
    FaultSignal,
    RepairApproval,
)
from gpuheal.policy.breaker import repair_capacity
from gpuheal.policy.repairwire import (
    Outcome,
    RepairRequest,
    RepairResult,
    decode_request,
    decode_result,
    fault_digest,
)
from gpuheal.policy.replace import CallReplace, replace_step
from gpuheal.sources.annotations import SOURCE as AGENT_SOURCE
from gpuheal.vocabulary import Entry, Reason
from gpuheal.xid import CATALOGUE, RECOVERY_ACTIONS, Action

# repair.replace: the controller calls the provider's hook (policy/replace.py).
REPLACE = "replace"

# Reasons the agent reports that are not Xid rows, with their repair.
_AGENT_REASONS = {
    "GpuFellOffBus": Action.REBOOT,
    "GpuLost": Action.REBOOT,
    "GpuMissing": Action.REBOOT,
    "EccUncorrectable": Action.RESET_GPU,
    # NVIDIA's row-remapping guide: a pending remap takes effect at the next reset; a
    # failed one means the GPU is out of spare rows (its RMA criterion).
    "RowRemapPending": Action.RESET_GPU,
    "RowRemapFailure": Action.CONTACT_SUPPORT,
    "RetiredPagesPending": Action.RESET_GPU,
    "NvlinkDown": Action.RESET_GPU,
}


def recommended(reason: str, config: Config) -> Action:
    """The repair a fault reason calls for: the config's, else the Xid catalogue's
    (`none` for a reason neither knows: nothing is repaired blind)."""
    chosen = config.repair.action_by_reason.get(reason)
    if chosen is not None:
        # `replace` is the controller's (replaced()), not an action of the agent's.
        return Action.NONE if chosen in ("none", REPLACE) else Action(chosen)
    for row in (*CATALOGUE.values(), *RECOVERY_ACTIONS.values()):
        if row.reason == reason:
            return row.action
    return _AGENT_REASONS.get(reason, Action.NONE)


def ladder(first: Action, devices: tuple[str, ...], config: Config) -> tuple[Action, ...]:
    """The actions of attempts 1, 2, ...: resets (when the fault names its GPUs),
    then reboots. Past its end: a person."""
    cfg = config.repair
    resets = (Action.RESET_GPU,) * cfg.reset_attempts if devices else ()
    reboots = (Action.REBOOT,) * cfg.reboot_attempts
    if first is Action.RESET_GPU:
        return resets + reboots
    if first is Action.REBOOT:
        return reboots
    return ()


@dataclass(frozen=True)
class RequestRepair:
    """Write the repair request on the node (the controller's annotation)."""

    node: str
    request: RepairRequest

    @property
    def value(self) -> str:
        return self.request.encode()


@dataclass(frozen=True)
class Said:
    """An Event of the repair step."""

    reason: str
    note: str
    warning: bool = False


@dataclass(frozen=True)
class RepairStep:
    """What the repair step decided: the request to write (at most one), the
    record's entries and Events, whether the record now says contact support."""

    request: RequestRepair | None = None
    entries: tuple[ActionEntry, ...] = ()
    said: tuple[Said, ...] = ()
    contact_support: bool = False
    requeue_after: float | None = None
    suppressed: str | None = None
    # status.repairApproval to write: the attempt a person is asked to approve.
    ask: RepairApproval | None = None
    # repair.replace: the provider hook's call (after its intent entry, if new).
    replace: CallReplace | None = None

    @property
    def acts(self) -> bool:
        return bool(self.request or self.entries)


@dataclass(frozen=True)
class Subject:
    """The fault whose node is drained, and what the step may look at."""

    node: str
    annotations: dict[str, str]
    signal: FaultSignal | None  # None: the fault cleared (only results are recorded)
    record: FaultRecord
    node_records: tuple[FaultRecord, ...] = ()
    gpu_nodes: int = 0
    # Nodes with a repair in flight (this one included if it has).
    repairing: frozenset[str] = frozenset()
    devices: tuple[str, ...] = ()  # the fault's GPUs (a reset's)
    provider_id: str = ""  # the node's spec.providerID (a replace's)


_STEPS: dict[str, str] = {
    Entry.REPAIR_REQUESTED: "requested",
    Entry.REPAIRED: "done",
    Entry.WOULD_REPAIR: "proposed",
    Entry.REPAIR_EXHAUSTED: "contact-support",
    Entry.REPAIR_AWAITING_APPROVAL: "awaiting-approval",
    Entry.REPAIR_APPROVED: "approved",
    Entry.REPAIR_REJECTED: "rejected",
    Entry.REPAIR_APPROVAL_EXPIRED: "approval-expired",
    Entry.REPLACE_REQUESTED: "requested",
    Entry.REPLACE_ACCEPTED: "accepted",
    Entry.REPLACE_FAILED: "failed",
}


def repair_metric(entry: ActionEntry) -> tuple[str, str] | None:
    """(action, step) of a record entry of this step, for gpuheal_repairs_total;
    None for any other entry."""
    if entry.action == Entry.REPAIR_FAILED:
        step_name = entry.result
    elif entry.action in _STEPS:
        step_name = _STEPS[entry.action]
    else:
        return None
    word = entry.detail.split(" ", 1)[0]
    action = word if word in (Action.RESET_GPU.value, Action.REBOOT.value, REPLACE) else "none"
    return action, step_name


def _entry(now: dt.datetime, action: str, result: str, detail: str) -> ActionEntry:
    return ActionEntry(iso(now), action, result, values.text(detail, values.DETAIL_MAX))


def _tag(action: Action, attempt: int) -> str:
    return f"{action.value} attempt {attempt}"


def _said(record: FaultRecord, actions: tuple[str, ...], tag: str) -> bool:
    return any(a.action in actions and a.detail.startswith(tag + ":") for a in record.actions)


def awaiting_approval(record: FaultRecord) -> RepairApproval | None:
    """The repair attempt of an open record that waits for a person's answer now
    (asked, unanswered, not expired); None when none does."""
    asked = record.repair_approval
    if asked is None or asked.decision or not record.open:
        return None
    tag = f"{asked.action} attempt {asked.attempt}"
    return None if _said(record, (Entry.REPAIR_APPROVAL_EXPIRED,), tag) else asked


def current(subject: Subject) -> tuple[RepairRequest | None, RepairResult | None]:
    """The node's request for this fault, and its result (None: none yet)."""
    digest = fault_digest(subject.record.fault_id)
    request = decode_request(subject.annotations.get(REPAIR_REQUEST))
    if request is None or request.fault != digest:
        return None, None
    result = decode_result(subject.annotations.get(REPAIR_RESULT))
    return request, result if result is not None and result.answers(request) else None


def in_flight(annotations: dict[str, str]) -> RepairRequest | None:
    """The node's request its agent has not answered (the budget counts it)."""
    request = decode_request(annotations.get(REPAIR_REQUEST))
    if request is None:
        return None
    result = decode_result(annotations.get(REPAIR_RESULT))
    return request if result is None or not result.answers(request) else None


def outcome_only(subject: Subject, now: dt.datetime) -> RepairStep:
    """The fault cleared: record the result that came (once); nothing new is asked."""
    request, result = current(subject)
    if request is None:
        return RepairStep()
    return _recorded(subject, request, result, now)


def _recorded(
    subject: Subject, request: RepairRequest, result: RepairResult | None, now: dt.datetime
) -> RepairStep:
    """The request's entry when the record lacks it (we stopped between the two), and
    the result's entry and Event, once."""
    tag = _tag(request.action, request.attempt)
    entries: tuple[ActionEntry, ...] = ()
    if not _said(subject.record, (Entry.REPAIR_REQUESTED,), tag):
        what = _what(request.action, subject)
        entries = (_entry(now, Entry.REPAIR_REQUESTED, "waiting", f"{tag}: {what}"),)
    if result is None or _said(subject.record, (Entry.REPAIRED, Entry.REPAIR_FAILED), tag):
        return RepairStep(entries=entries)
    fault = subject.record.fault_id
    if result.outcome is Outcome.DONE:
        entry = _entry(now, Entry.REPAIRED, "ok", f"{tag}: {result.detail}")
        said = Said(Reason.REPAIRED, f"fault {fault}: {tag} done by the agent: {result.detail}")
    else:
        entry = _entry(now, Entry.REPAIR_FAILED, result.outcome.value, f"{tag}: {result.detail}")
        note = f"fault {fault}: {tag} {result.outcome.value}: {result.detail}"
        said = Said(Reason.REPAIR_FAILED, note, warning=True)
    return RepairStep(entries=(*entries, entry), said=(said,))


def _what(action: Action, subject: Subject) -> str:
    if action is Action.RESET_GPU:
        return f"reset {', '.join(subject.devices)}"
    return f"reboot {subject.node}"


def _merge(*steps: RepairStep) -> RepairStep:
    requeue = [s.requeue_after for s in steps if s.requeue_after is not None]
    return RepairStep(
        request=next((s.request for s in steps if s.request), None),
        entries=tuple(e for s in steps for e in s.entries),
        said=tuple(x for s in steps for x in s.said),
        contact_support=any(s.contact_support for s in steps),
        requeue_after=min(requeue) if requeue else None,
        suppressed=next((s.suppressed for s in steps if s.suppressed), None),
        ask=next((s.ask for s in steps if s.ask), None),
        replace=next((s.replace for s in steps if s.replace), None),
    )


def step(subject: Subject, config: Config, now: dt.datetime) -> RepairStep:  # noqa: PLR0911 -- a return per stage of the attempt
    """The repair step of a drained node whose fault is still reported."""
    cfg = config.repair
    signal = subject.signal
    if not cfg.enabled or signal is None or signal.source != AGENT_SOURCE:
        # Only the agent's own report: the agent acts on the fault it reported.
        return RepairStep()
    record = subject.record
    reason = record.reason or signal.reason
    if cfg.acts and cfg.replace.configured and cfg.action_by_reason.get(reason) == REPLACE:
        return _replace_step(subject, config, now)
    steps = ladder(recommended(reason, config), subject.devices, config)
    if not steps:
        return RepairStep()
    if not cfg.acts:
        return _proposed(subject, steps[0], now)
    request, result = current(subject)
    done: RepairStep = RepairStep()
    if request is not None:
        done = _recorded(subject, request, result, now)
        tag = _tag(request.action, request.attempt)
        if result is None:
            waited = (now - (parse_time(request.time) or now)).total_seconds()
            timeout = cfg.result_timeout(request.action.value)
            left = timeout - waited
            if left > 0:
                return _merge(done, RepairStep(requeue_after=left, suppressed="repairing"))
            timed_out = _entry(
                now, Entry.REPAIR_FAILED, "timed-out",
                f"{tag}: no result from the agent within {timeout:g}s",
            )  # fmt: skip
            note = f"fault {record.fault_id}: {tag}: no result from the agent in time"
            if not _said(record, (Entry.REPAIR_FAILED,), tag):
                done = _merge(
                    done,
                    RepairStep(
                        entries=(timed_out,), said=(Said(Reason.REPAIR_FAILED, note, True),)
                    ),
                )
        elif result.outcome is Outcome.DONE:
            # The fault is still reported: give the agent's next rounds time to clear it.
            settled = (now - (parse_time(result.time) or now)).total_seconds()
            left = cfg.settle_seconds - settled
            if left > 0:
                return _merge(done, RepairStep(requeue_after=left, suppressed="settling"))
            if not _said(record, (Entry.REPAIR_FAILED,), tag):
                detail = (
                    f"{tag}: done, and the fault is still reported {cfg.settle_seconds:g}s after"
                )
                ineffective = _entry(now, Entry.REPAIR_FAILED, "ineffective", detail)
                note = f"fault {record.fault_id}: {detail}"
                done = _merge(
                    done,
                    RepairStep(
                        entries=(ineffective,), said=(Said(Reason.REPAIR_FAILED, note, True),)
                    ),
                )
    attempt = 1 if request is None else request.attempt + 1
    return _merge(done, _next(subject, steps, attempt, config, now))


def _next(
    subject: Subject, steps: tuple[Action, ...], attempt: int, config: Config, now: dt.datetime
) -> RepairStep:
    """Attempt `attempt`: requested within the budget, or a person is asked."""
    cfg = config.repair
    record = subject.record
    if attempt > len(steps):
        if cfg.replace.configured:
            return _replace_step(subject, config, now)
        return _exhausted(subject, f"{len(steps)} repair attempt(s) did not clear the fault", now)
    recent = _requests_within(subject, cfg.window_seconds, now)
    if recent >= cfg.max_attempts_per_node:
        return _exhausted(
            subject,
            f"{recent} repair requests on {subject.node} within {cfg.window_seconds:g}s "
            f"(repair.maxAttemptsPerNode {cfg.max_attempts_per_node})",
            now,
        )
    action = steps[attempt - 1]
    approved = RepairStep()
    if cfg.approval_for(action.value):
        approved, go = _approval(subject, action, attempt, config, now)
        if not go:
            return approved
    others = len(subject.repairing - {subject.node})
    capacity = repair_capacity(subject.gpu_nodes, config)
    if others >= capacity:
        last = record.actions[-1] if record.actions else None
        held = (
            ()
            if last is not None and last.action == Entry.REPAIR_HELD
            else (
                _entry(
                    now, Entry.REPAIR_HELD, "waiting",
                    f"{others} repairs in flight (budget {capacity}); waits",
                ),
            )
        )  # fmt: skip
        return _merge(
            approved,
            RepairStep(
                entries=held, requeue_after=config.hold_retry_seconds, suppressed="repair-budget"
            ),
        )
    request = RepairRequest(action, fault_digest(record.fault_id), attempt, iso(now, "seconds"))
    tag = _tag(action, attempt)
    what = _what(action, subject)
    asked = RepairStep(
        request=RequestRepair(subject.node, request),
        entries=(_entry(now, Entry.REPAIR_REQUESTED, "waiting", f"{tag}: {what}"),),
        said=(
            Said(
                Reason.REPAIR_REQUESTED,
                f"fault {record.fault_id} ({record.reason}): {tag} requested: {what}",
            ),
        ),
        requeue_after=cfg.result_timeout(action.value),
    )
    return _merge(approved, asked)


def _approval(
    subject: Subject, action: Action, attempt: int, config: Config, now: dt.datetime
) -> tuple[RepairStep, bool]:
    """repair.approval: the attempt waits for a person (status.repairApproval). True
    once approved (with its entry, once); else what the record says meanwhile: the
    question (once), the wait, or the refusal or expiry and a person asked instead."""
    record = subject.record
    tag = _tag(action, attempt)
    asked = record.repair_approval
    expiry = config.approval.expiry_seconds
    if asked is None or (asked.attempt, asked.action) != (attempt, action.value):
        what = _what(action, subject)
        note = (
            f"fault {record.fault_id} ({record.reason}): {tag} awaits approval: {what}. "
            f"Approve or reject with `gpuheal approve|reject {record.name}` within {expiry:g}s"
        )
        return RepairStep(
            ask=RepairApproval(attempt, action.value, iso(now, "seconds")),
            entries=(_entry(now, Entry.REPAIR_AWAITING_APPROVAL, "waiting", f"{tag}: {what}"),),
            said=(Said(Reason.REPAIR_AWAITING_APPROVAL, note),),
            requeue_after=expiry,
            suppressed="repair-awaiting-approval",
        ), False
    if _said(record, (Entry.REPAIR_APPROVAL_EXPIRED,), tag):
        # An answer that came after the expiry was recorded changes nothing.
        return _exhausted(subject, f"{tag}: approval expired", now), False
    if asked.decision:
        return _answered(subject, asked, tag, now)
    waited = (now - (parse_time(asked.since) or now)).total_seconds()
    if waited < expiry:
        return RepairStep(
            requeue_after=expiry - waited, suppressed="repair-awaiting-approval"
        ), False
    why = f"{tag}: no answer within {expiry:g}s (approval.expirySeconds)"
    expired = RepairStep(
        entries=(_entry(now, Entry.REPAIR_APPROVAL_EXPIRED, "expired", why),),
        said=(
            Said(
                Reason.REPAIR_APPROVAL_EXPIRED,
                f"fault {record.fault_id}: {why}; not carried out",
                True,
            ),
        ),
    )
    return _merge(expired, _exhausted(subject, why, now)), False


def _answered(
    subject: Subject, asked: RepairApproval, tag: str, now: dt.datetime
) -> tuple[RepairStep, bool]:
    """A person's answer to the attempt: approved (its entry and Event, once) goes
    on; rejected is recorded once, and a person is asked instead."""
    record = subject.record
    by = f"by {asked.by} at {asked.at}"
    if asked.decision == APPROVED:
        if _said(record, (Entry.REPAIR_APPROVED,), tag):
            return RepairStep(), True
        note = f"fault {record.fault_id}: {tag} approved {by}"
        return RepairStep(
            entries=(_entry(now, Entry.REPAIR_APPROVED, "ok", f"{tag}: approved {by}"),),
            said=(Said(Reason.REPAIR_APPROVED, note),),
        ), True
    # Rejected.
    ended = RepairStep()
    if not _said(record, (Entry.REPAIR_REJECTED,), tag):
        note = f"fault {record.fault_id}: {tag} rejected {by}; not carried out"
        ended = RepairStep(
            entries=(_entry(now, Entry.REPAIR_REJECTED, "rejected", f"{tag}: rejected {by}"),),
            said=(Said(Reason.REPAIR_REJECTED, note, warning=True),),
        )
    return _merge(ended, _exhausted(subject, f"{tag} rejected {by}", now)), False


def _requests_within(subject: Subject, window: float, now: dt.datetime) -> int:
    since = now - dt.timedelta(seconds=window)
    count = 0
    others = (r for r in subject.node_records if r.name != subject.record.name)
    for record in (*others, subject.record):
        for entry in record.actions:
            at = parse_time(entry.time)
            if entry.action == Entry.REPAIR_REQUESTED and at is not None and at >= since:
                count += 1
    return count


def _exhausted(subject: Subject, why: str, now: dt.datetime) -> RepairStep:
    """No more repairs: the node stays held, a person is asked, once."""
    record = subject.record
    if any(a.action == Entry.REPAIR_EXHAUSTED for a in record.actions):
        return RepairStep(suppressed="contact-support")
    note = (
        f"fault {record.fault_id} ({record.reason}) on {subject.node}: {why}; the node stays "
        "quarantined: contact support"
    )
    return RepairStep(
        entries=(_entry(now, Entry.REPAIR_EXHAUSTED, "contact-support", why),),
        said=(Said(Reason.CONTACT_SUPPORT, note, warning=True),),
        contact_support=True,
    )


def _proposed(subject: Subject, action: Action, now: dt.datetime) -> RepairStep:
    """Propose mode: the record says what would be done (once); the node is not asked."""
    record = subject.record
    if any(a.action == Entry.WOULD_REPAIR for a in record.actions):
        return RepairStep(suppressed="proposed")
    tag = _tag(action, 1)
    what = _what(action, subject)
    return RepairStep(
        entries=(_entry(now, Entry.WOULD_REPAIR, "propose", f"{tag}: {what}"),),
        said=(
            Said(
                Reason.REPAIR_PROPOSED,
                f"fault {record.fault_id} ({record.reason}): would {what} "
                "(repair.mode is propose; nothing asked of the agent)",
            ),
        ),
    )


def _replace_step(subject: Subject, config: Config, now: dt.datetime) -> RepairStep:
    """The provider's hook, in the policy's terms (policy/replace.py); past its
    attempts a person is asked, as after the ladder."""
    decided = replace_step(
        subject.node, subject.record, subject.provider_id, config.repair.replace, now
    )
    if decided.exhausted:
        return _exhausted(subject, decided.exhausted, now)
    said = tuple(Said(r, n, w) for r, n, w in decided.said)
    return RepairStep(
        replace=decided.call,
        said=said,
        requeue_after=decided.requeue_after,
        suppressed=decided.suppressed,
    )
