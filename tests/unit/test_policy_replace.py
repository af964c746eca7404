"""repair.replace in the pure policy: after the ladder (or for a reason mapped to
`replace`) the controller calls the provider's hook, its intent recorded before
each call; an intent without an outcome is called again under the same key; a
failure is retried with backoff, a bounded number of times, then a person."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from gpuheal.clock import iso
from gpuheal.config import ReplaceConfig, parse_config
from gpuheal.model import ActionEntry
from gpuheal.policy.actions import Plan, ReplaceIntent, UpdateRecord
from gpuheal.policy.plan import plan
from gpuheal.policy.repair import repair_metric
from gpuheal.policy.replace import CallReplace, idempotency_key
from gpuheal.vocabulary import Entry, Reason
from gpuheal.xid import Action
from tests.helpers import plan_entries
from tests.unit.test_policy_repair import (
    CONFIG,
    F1,
    N1,
    NOW,
    _after_failures,
    drained,
    events,
    node,
    requests,
    state,
)

HOOK = ReplaceConfig(webhook="https://replace.example.com/hook/s3cr3t", retry_base_seconds=60)
REPLACING = replace(CONFIG, repair=replace(CONFIG.repair, replace=HOOK))
KEY_1 = idempotency_key(F1, 1)
PROVIDER_ID = "aws:///us-west-2a/i-0f1e2d3c4b5a69788"


def calls(p: Plan) -> list[CallReplace]:
    return [a for a in p.actions if isinstance(a, CallReplace)]


def test_after_the_ladder_the_hook_is_called_after_its_intent() -> None:
    on_node, recorded = _after_failures(Action.RESET_GPU, Action.RESET_GPU, Action.REBOOT)
    on_node = replace(on_node, provider_id=PROVIDER_ID)
    p = plan(state(on_node, recorded), REPLACING, NOW)
    assert not plan_entries(p, Entry.REPAIR_EXHAUSTED) and not requests(p)
    (call,) = calls(p)
    assert (call.attempt, call.key, call.node) == (1, KEY_1, N1)
    assert call.body() == {
        "node": N1,
        "faultId": F1,
        "attempt": 1,
        "reason": "EccUncontained95",
        "providerID": PROVIDER_ID,
        "idempotencyKey": KEY_1,
    }
    kinds = [type(a).__name__ for a in p.repair]
    # The intent is written (at once) before the call; the call's outcome after it.
    assert kinds.index("ReplaceIntent") < kinds.index("CallReplace")
    (intent,) = [a for a in p.repair if isinstance(a, ReplaceIntent)]
    assert intent.entry.action == Entry.REPLACE_REQUESTED
    assert intent.entry.detail == f"replace attempt 1: key {KEY_1}"
    assert len(events(p, Reason.REPLACE_REQUESTED)) == 1


def test_an_intent_without_an_outcome_is_called_again_under_the_same_key() -> None:
    on_node, recorded = _after_failures(Action.RESET_GPU, Action.RESET_GPU, Action.REBOOT)
    intent = ActionEntry(
        iso(NOW), Entry.REPLACE_REQUESTED, "waiting", f"replace attempt 1: key {KEY_1}"
    )
    died = replace(recorded, actions=(*recorded.actions, intent))
    p = plan(state(on_node, died), REPLACING, NOW + dt.timedelta(seconds=30))
    (call,) = calls(p)
    assert call.key == KEY_1 and call.intent is None
    assert not [a for a in p.repair if isinstance(a, ReplaceIntent)]
    assert not events(p, Reason.REPLACE_REQUESTED)


def test_a_failed_call_is_retried_with_backoff_then_a_person_is_asked() -> None:
    on_node, recorded = _after_failures(Action.RESET_GPU, Action.RESET_GPU, Action.REBOOT)
    said = list(recorded.actions)
    at = NOW
    for attempt in range(1, HOOK.max_attempts + 1):
        key = idempotency_key(F1, attempt)
        said += [
            ActionEntry(
                iso(at), Entry.REPLACE_REQUESTED, "waiting", f"replace attempt {attempt}: key {key}"
            ),
            ActionEntry(
                iso(at),
                Entry.REPLACE_FAILED,
                "failed",
                f"replace attempt {attempt}: key {key}: HTTP 500",
            ),
        ]
        record = replace(recorded, actions=tuple(said))
        backoff = HOOK.retry_base_seconds * 2 ** (attempt - 1)
        soon = plan(state(on_node, record), REPLACING, at + dt.timedelta(seconds=backoff - 1))
        if attempt == HOOK.max_attempts:
            break
        assert not calls(soon) and soon.suppressed == "replace-backoff"
        assert soon.requeue_after is not None and 0 < soon.requeue_after <= 1
        at += dt.timedelta(seconds=backoff)
        (call,) = calls(plan(state(on_node, record), REPLACING, at))
        assert call.attempt == attempt + 1 and call.key == idempotency_key(F1, attempt + 1)
    p = plan(
        state(on_node, replace(recorded, actions=tuple(said))), REPLACING, at + dt.timedelta(days=1)
    )
    assert not calls(p)
    (held,) = plan_entries(p, Entry.REPAIR_EXHAUSTED)
    assert f"{HOOK.max_attempts} replace call(s) failed" in held.detail
    assert all(a.contact_support for a in p.repair if isinstance(a, UpdateRecord))


def test_accepted_the_node_waits_for_the_provider() -> None:
    on_node, recorded = _after_failures(Action.RESET_GPU, Action.RESET_GPU, Action.REBOOT)
    done = (
        ActionEntry(
            iso(NOW), Entry.REPLACE_REQUESTED, "waiting", f"replace attempt 1: key {KEY_1}"
        ),
        ActionEntry(
            iso(NOW), Entry.REPLACE_ACCEPTED, "ok", f"replace attempt 1: key {KEY_1}: HTTP 202"
        ),
    )
    p = plan(state(on_node, replace(recorded, actions=(*recorded.actions, *done))), REPLACING, NOW)
    assert not p.actions and p.suppressed == "replacing"


def test_a_reason_mapped_to_replace_goes_to_the_hook_at_once() -> None:
    mapped = replace(
        REPLACING,
        repair=replace(REPLACING.repair, action_by_reason={"EccUncontained95": "replace"}),
    )
    p = plan(state(node(), drained()), mapped, NOW)
    assert not requests(p)
    assert [c.attempt for c in calls(p)] == [1]
    # Without a hook configured, nothing is done for it (nothing is repaired blind).
    unhooked = replace(mapped, repair=replace(mapped.repair, replace=ReplaceConfig()))
    assert not plan(state(node(), drained()), unhooked, NOW).actions


def test_the_config_keys_and_the_metric() -> None:
    parsed = parse_config(
        {"repair": {"replace": {"command": ["/usr/local/bin/replace-node"], "maxAttempts": 5}}}
    ).repair.replace
    assert parsed.configured and parsed.max_attempts == 5
    assert not ReplaceConfig().configured
    intent = ActionEntry(
        iso(NOW), Entry.REPLACE_REQUESTED, "waiting", f"replace attempt 1: key {KEY_1}"
    )
    assert repair_metric(intent) == ("replace", "requested")
