"""Repeat offenders (policy/offenders.py): the node's third fault within three days
is flagged for support when its record is made, and its node is held out after
the fault clears until a person releases the record. And what must NOT happen:
two faults, or faults outside the window, flag nothing; a flagged node is never
returned unreleased; `hold: false` only tells."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from gpuheal.clock import iso
from gpuheal.config import ConfigError, RepeatOffendersConfig, parse_config
from gpuheal.model import ActionEntry, FaultRecord, Phase
from gpuheal.policy.actions import CreateRecord, Emit, NodeState, RemoveTaint, UpdateRecord
from gpuheal.policy.plan import plan
from gpuheal.policy.release import refusal
from gpuheal.vocabulary import Entry, Reason
from tests.unit.test_policy_plan import CONFIG, NOW, faulty, healthy, record, tainted


def earlier(days_ago: float, n: int) -> FaultRecord:
    """A closed fault of the node's, opened `days_ago`."""
    at = iso(NOW - dt.timedelta(days=days_ago))
    return record(
        Phase.RESOLVED,
        fault_id=f"xid-79-{n}",
        actions=(ActionEntry(at, Entry.DETECT, "ok", "node-annotation"),),
    )


def test_the_third_fault_within_three_days_flags_the_node_when_its_record_is_made() -> None:
    history = (earlier(2.9, 1), earlier(0.5, 2))
    made = plan(NodeState(faulty(), records=history), CONFIG, NOW)
    assert isinstance(made.actions[0], CreateRecord)
    (flag,) = [
        a
        for a in made.actions
        if isinstance(a, UpdateRecord) and a.entry.action == Entry.REPEAT_OFFENDER
    ]
    assert flag.contact_support
    assert flag.entry.detail.startswith("3 faults on this node within 3 days")
    (told,) = [
        a for a in made.actions if isinstance(a, Emit) and a.reason == Reason.CONTACT_SUPPORT
    ]
    assert told.warning and "repeat offender" in told.note
    # The fault is quarantined as any other: the flag holds nothing back now.
    assert made.fence is not None


@pytest.mark.parametrize(
    "history",
    [(), (earlier(1, 1),), (earlier(3.1, 1), earlier(4, 2)), (earlier(3.01, 1), earlier(1, 2))],
    ids=["first", "second", "both-outside", "one-outside"],
)
def test_fewer_faults_within_the_window_flag_nothing(history: tuple[FaultRecord, ...]) -> None:
    made = plan(NodeState(faulty(), records=history), CONFIG, NOW)
    assert not [
        a for a in made.actions if isinstance(a, Emit) and a.reason == Reason.CONTACT_SUPPORT
    ]
    assert not any(isinstance(a, UpdateRecord) and a.contact_support for a in made.actions)


def offender() -> FaultRecord:
    """A repeat offender's record whose fault cleared a while ago."""
    entries = (
        ActionEntry(iso(NOW - dt.timedelta(hours=1)), Entry.DETECT, "ok", "node-annotation"),
        ActionEntry(
            iso(NOW - dt.timedelta(hours=1)), Entry.REPEAT_OFFENDER, "contact-support", "3 faults"
        ),
    )
    since = iso(NOW - dt.timedelta(minutes=10))
    return record(Phase.RECOVERING, recovering_since=since, actions=entries, contact_support=True)


def test_a_repeat_offenders_node_stays_out_after_its_fault_clears_until_released() -> None:
    node = tainted(healthy())
    held = plan(NodeState(node, records=(offender(),)), CONFIG, NOW)
    assert not any(isinstance(a, RemoveTaint) for a in held.actions)
    (entry,) = [a.entry for a in held.actions if isinstance(a, UpdateRecord)]
    assert entry.action == Entry.HELD_FOR_A_PERSON
    assert f"gpuheal release {offender().name}" in entry.detail
    (told,) = [a for a in held.actions if isinstance(a, Emit)]
    assert told.reason == Reason.HELD and told.warning
    assert held.requeue_after == CONFIG.hold_retry_seconds
    # Said once: the next look only waits.
    said = replace(offender(), actions=(*offender().actions, entry))
    again = plan(NodeState(node, records=(said,)), CONFIG, NOW)
    assert again.actions == () and again.requeue_after == CONFIG.hold_retry_seconds
    # Released by a person: the gate judges it, and it returns.
    released = replace(said, released_by="alice@example.com", released_at=iso(NOW))
    back = plan(NodeState(node, records=(released,)), CONFIG, NOW)
    assert any(isinstance(a, RemoveTaint) for a in back.actions)
    (note,) = [
        a for a in back.actions if isinstance(a, UpdateRecord) and a.entry.action == Entry.RELEASED
    ]
    assert note.entry.detail.startswith("by alice@example.com at ")
    assert any(isinstance(a, Emit) and a.reason == Reason.RELEASED for a in back.actions)
    # hold: false flags and tells only.
    telling = replace(CONFIG, repeat_offenders=RepeatOffendersConfig(hold=False))
    assert isinstance(
        plan(NodeState(node, records=(offender(),)), telling, NOW).actions[0], RemoveTaint
    )


def test_a_release_is_taken_for_a_repeat_offender_and_refused_for_other_recovering_faults() -> None:
    assert refusal(offender()) is None
    plain = record(Phase.RECOVERING, recovering_since=iso(NOW))
    assert "not held by the breaker nor a repeat offender's" in (refusal(plain) or "")
    assert "already released" in (refusal(replace(offender(), released_by="alice")) or "")


def test_the_old_device_keys_are_refused_naming_where_they_went() -> None:
    with pytest.raises(
        ConfigError, match=r"contactSupportAfter: unknown key \(moved to repeatOffenders.faults\)"
    ):
        parse_config({"deviceHealth": {"contactSupportAfter": 3}})
    assert parse_config({"repeatOffenders": {"faults": 5}}).repeat_offenders.faults == 5
