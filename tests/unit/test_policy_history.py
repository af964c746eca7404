"""A GPUFault's action history: repeats folded, first actions kept, bounded."""

from __future__ import annotations

from gpuheal.model import ActionEntry
from gpuheal.policy import history
from gpuheal.values import DETAIL_MAX
from gpuheal.vocabulary import Entry

BLOCKED = "1 to evict, 0 terminating; blocked: ml/trainer-0 by PodDisruptionBudget ml/trainer"


def at(second: int) -> str:
    return f"2026-11-29T12:{second // 60:02d}:{second % 60:02d}.000Z"


def first_actions() -> list[ActionEntry]:
    return [
        ActionEntry(at(0), "detect", "ok", "agent"),
        ActionEntry(at(1), "taint", "ok"),
    ]


def test_a_repeated_refusal_is_one_entry_with_a_count_and_its_first_time() -> None:
    actions = first_actions()
    for second in (2, 4, 8, 16):
        actions = history.append(actions, ActionEntry(at(second), "evict", "blocked", BLOCKED))
    assert [a.action for a in actions] == ["detect", "taint", "evict"]
    last = actions[-1]
    assert last.time == at(16)  # the latest attempt
    assert last.detail == f"{BLOCKED} (4 times since {at(2)})"
    assert history.repeats(last) == 4


def test_news_is_a_new_entry() -> None:
    actions = history.append(first_actions(), ActionEntry(at(2), "evict", "blocked", BLOCKED))
    actions = history.append(actions, ActionEntry(at(4), "evict", "ok", "1 to evict; evicted 1"))
    actions = history.append(actions, ActionEntry(at(5), "evict", "blocked", BLOCKED))
    assert [(a.result, history.repeats(a)) for a in actions[2:]] == [
        ("blocked", 1),
        ("ok", 1),
        ("blocked", 1),
    ]


def test_the_first_actions_survive_any_number_of_entries_and_the_drops_are_counted() -> None:
    actions = first_actions()
    for i in range(500):  # all different: nothing folds
        actions = history.append(actions, ActionEntry(at(2 + i), "gate-failed", "failed", str(i)))
    assert len(actions) == history.MAX_KEPT
    assert [a.action for a in actions[:2]] == ["detect", "taint"]
    marker = actions[history.FIRST_KEPT]
    assert marker.action == Entry.ELIDED
    kept = history.MAX_KEPT - history.FIRST_KEPT - 1
    dropped = 502 - history.FIRST_KEPT - kept
    assert marker.detail.startswith(f"{dropped} entries dropped")
    assert actions[-1].detail == "499"  # the newest


def test_a_long_detail_still_folds_within_the_crd_limit() -> None:
    long = "x" * 5000
    actions = first_actions()
    for second in range(2, 200):
        actions = history.append(actions, ActionEntry(at(second), "evict", "blocked", long))
    assert len(actions) == 3
    assert history.repeats(actions[-1]) == 198
    assert len(actions[-1].detail) <= DETAIL_MAX
