"""repair.replace: the node replaced through the provider's hook (a webhook or a
command), called by the controller, for clouds where a node is replaced rather
than repaired. Pure: the decision; the call is the controller's
(gpuheal/controller/replace.py).

Exactly once in effect, across controller restarts and failovers: before each call
the record gets its intent, a `replace-requested` entry naming the attempt and its
idempotency key (`<fault digest>-<attempt>`); after it, the outcome,
`replace-accepted` or `replace-failed`. A controller that finds an intent without
an outcome (its predecessor died between the two) calls again with the same key.
Delivery is at least once; the receiver, deduplicating by the key (in the body and
the `Idempotency-Key` header), makes the effect once. A failed call is retried
after `retryBaseSeconds`, doubling, up to `maxAttempts` calls, each a new attempt
with its own key; past them a person is asked (contact support).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from gpuheal import values
from gpuheal.clock import iso, parse_time
from gpuheal.config import ReplaceConfig
from gpuheal.model import ActionEntry, FaultRecord, Phase
from gpuheal.policy.repairwire import fault_digest
from gpuheal.vocabulary import Entry, Reason

IDEMPOTENCY_HEADER = "Idempotency-Key"
_ATTEMPT = re.compile(r"replace attempt ([0-9]{1,3}):")


def idempotency_key(fault_id: str, attempt: int) -> str:
    """One attempt's name at the receiver: the same for every call of the attempt."""
    return f"{fault_digest(fault_id)}-{attempt}"


@dataclass(frozen=True)
class CallReplace:
    """Call the provider's hook for one attempt (the intent, if new, is written first)."""

    node: str
    record: str
    fault_id: str
    reason: str
    provider_id: str
    attempt: int
    intent: ActionEntry | None  # None: the intent is on the record already (a call again)
    phase: Phase = Phase.DRAINED  # the record's phase, kept by the outcome's entry

    @property
    def key(self) -> str:
        return idempotency_key(self.fault_id, self.attempt)

    def body(self) -> dict[str, Any]:
        """The hook's JSON."""
        return {
            "node": self.node,
            "faultId": self.fault_id,
            "attempt": self.attempt,
            "reason": self.reason,
            "providerID": self.provider_id,
            "idempotencyKey": self.key,
        }

    def outcome(self, accepted: bool, detail: str, now: dt.datetime) -> ActionEntry:
        """The record's entry after the call."""
        action, result = (
            (Entry.REPLACE_ACCEPTED, "ok") if accepted else (Entry.REPLACE_FAILED, "failed")
        )
        text = f"replace attempt {self.attempt}: key {self.key}: {detail}"
        return ActionEntry(iso(now), action, result, values.text(text, values.DETAIL_MAX))

    def told(self, accepted: bool, entry: ActionEntry) -> tuple[str, str, bool]:
        """The Event after the call, as ReplaceDecision.said: (reason, note, warning)."""
        reason = Reason.REPLACE_ACCEPTED if accepted else Reason.REPLACE_FAILED
        return reason, f"fault {self.fault_id}: {entry.detail}", not accepted


@dataclass(frozen=True)
class ReplaceDecision:
    call: CallReplace | None = None
    said: tuple[tuple[str, str, bool], ...] = ()  # (Event reason, note, warning)
    requeue_after: float | None = None
    suppressed: str | None = None
    exhausted: str = ""  # why a person is asked instead; empty: not yet


def attempt_of(entry: ActionEntry) -> int | None:
    found = _ATTEMPT.match(entry.detail)
    return int(found.group(1)) if found else None


def replace_step(
    node: str, record: FaultRecord, provider_id: str, cfg: ReplaceConfig, now: dt.datetime
) -> ReplaceDecision:
    """The next step of the node's replacement, from the record's entries alone."""
    intents: set[int] = set()
    outcomes: dict[int, ActionEntry] = {}
    for entry in record.actions:
        attempt = attempt_of(entry)
        if attempt is None:
            continue
        if entry.action == Entry.REPLACE_REQUESTED:
            intents.add(attempt)
        elif entry.action in (Entry.REPLACE_ACCEPTED, Entry.REPLACE_FAILED):
            outcomes[attempt] = entry
    if any(e.action == Entry.REPLACE_ACCEPTED for e in outcomes.values()):
        # The provider has it: the node stays quarantined until it is deleted.
        return ReplaceDecision(suppressed="replacing")
    last = max(intents, default=0)

    def call(attempt: int, intent: ActionEntry | None) -> CallReplace:
        return CallReplace(
            node, record.name, record.fault_id, record.reason, provider_id, attempt, intent
        )

    def backoff(attempt: int) -> float:
        return float(cfg.retry_base_seconds * 2 ** (attempt - 1))

    # After a call, the next look comes when a failure's backoff ends: the outcome's
    # own record update is this pass's write, not a reason to look again.
    if last and last not in outcomes:
        # An intent without its outcome: the call may or may not have reached the
        # receiver. Again, under the same key.
        return ReplaceDecision(
            call=call(last, None), requeue_after=backoff(last), suppressed="replacing"
        )
    if last:
        if last >= cfg.max_attempts:
            return ReplaceDecision(
                exhausted=f"{last} replace call(s) failed (repair.replace.maxAttempts "
                f"{cfg.max_attempts})"
            )
        failed_at = parse_time(outcomes[last].time) or now
        left = backoff(last) - (now - failed_at).total_seconds()
        if left > 0:
            return ReplaceDecision(requeue_after=left, suppressed="replace-backoff")
    attempt = last + 1
    key = idempotency_key(record.fault_id, attempt)
    intent = ActionEntry(
        iso(now), Entry.REPLACE_REQUESTED, "waiting", f"replace attempt {attempt}: key {key}"
    )
    note = (
        f"fault {record.fault_id} ({record.reason}): replace attempt {attempt} of {node} "
        f"requested from the provider (key {key})"
    )
    return ReplaceDecision(
        call=call(attempt, intent),
        said=((Reason.REPLACE_REQUESTED, note, False),),
        requeue_after=backoff(attempt),
    )
