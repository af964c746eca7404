"""A GPUFault's action history: bounded, its first actions kept, repeats folded.

The record is the fault's durable audit trail: when it was detected, when the
node was fenced, what was evicted. A step that keeps meeting the same answer
(an eviction a PodDisruptionBudget refuses, for hours) must neither grow the
record by one entry per attempt nor push those first entries out: a repeat of
the last entry replaces it, with a count and the time of the first; and when
the history is full its first entries stay, an `elided` entry counts what was
dropped after them, and the newest follow.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpuheal.clock import parse_time
from gpuheal.model import ActionEntry, FaultRecord
from gpuheal.values import DETAIL_MAX, text
from gpuheal.vocabulary import Entry

MAX_KEPT = 50  # entries in status.actions (the CRD allows 100)
FIRST_KEPT = 4  # never dropped: detect, taint, the first eviction round

# " (12 times since 2024-05-01T10:00:00.123Z)": how often the entry happened in a row.
_REPEAT = re.compile(r" \((\d+) times since (\S+)\)$")
_REPEAT_ROOM = 48  # the longest such suffix, with room to spare
_ELIDED_COUNT = re.compile(r"^(\d+) ")


def with_evictions(
    entry: ActionEntry, evicted: Sequence[str], blocked: Mapping[str, str]
) -> ActionEntry:
    """An eviction round's entry with what came of it: how many pods were evicted,
    and each pod still refused, by what (pod key -> what refused it)."""
    detail, result = entry.detail, entry.result
    if evicted:
        detail += f"; evicted {len(evicted)}"
    if blocked:
        refused = ", ".join(f"{k} by {blocked[k]}" for k in sorted(blocked))
        detail, result = f"{detail}; blocked: {refused}", "blocked"
    return replace(entry, detail=detail, result=result)


def opened_at(record: FaultRecord) -> dt.datetime | None:
    """When the fault was first seen: the record's first action entry (milliseconds),
    else the object's creationTimestamp (whole seconds: up to a second early)."""
    times = [t for a in record.actions if (t := parse_time(a.time)) is not None]
    return min(times) if times else parse_time(record.created_at)


def closed_at(record: FaultRecord) -> dt.datetime | None:
    """When the record was closed: its newest action entry (the resolution), else
    when it was made."""
    times = [t for a in record.actions if (t := parse_time(a.time)) is not None]
    return max(times) if times else parse_time(record.created_at)


def _unfolded(entry: ActionEntry) -> tuple[str, int, str]:
    """(detail without the repeat suffix, occurrences, time of the first)."""
    match = _REPEAT.search(entry.detail)
    if match is None:
        return entry.detail, 1, entry.time
    return entry.detail[: match.start()], int(match[1]), match[2]


def repeats(entry: ActionEntry) -> int:
    """How many times in a row this entry happened (1 unless folded)."""
    return _unfolded(entry)[1]


def _fold(last: ActionEntry, entry: ActionEntry) -> ActionEntry | None:
    """`entry` as one more occurrence of `last`, or None when it is news."""
    detail, count, first = _unfolded(last)
    if (last.action, last.result, detail) != (entry.action, entry.result, entry.detail):
        return None
    return replace(entry, detail=f"{entry.detail} ({count + 1} times since {first})")


def append(
    actions: Sequence[ActionEntry],
    entry: ActionEntry,
    *,
    keep: int = MAX_KEPT,
    first: int = FIRST_KEPT,
) -> list[ActionEntry]:
    """The history with `entry` added: folded into the last entry when it repeats
    it (same action, result and detail), then trimmed to `keep` entries."""
    entry = replace(entry, detail=text(entry.detail, DETAIL_MAX - _REPEAT_ROOM))
    folded = _fold(actions[-1], entry) if actions else None
    history = [*actions[:-1], folded] if folded is not None else [*actions, entry]
    return trim(history, keep=keep, first=first)


def trim(
    actions: Sequence[ActionEntry], *, keep: int = MAX_KEPT, first: int = FIRST_KEPT
) -> list[ActionEntry]:
    """At most `keep` (> `first`) entries: the `first` ones, one `elided` entry
    counting what was dropped (all drops so far), the newest."""
    if len(actions) <= keep:
        return list(actions)
    head, rest = list(actions[:first]), list(actions[first:])
    dropped = 0
    if rest and rest[0].action == Entry.ELIDED:
        marker, rest = rest[0], rest[1:]
        match = _ELIDED_COUNT.match(marker.detail)
        dropped = int(match[1]) if match else 0
    # More than `keep` entries leave at least one to drop: `gone` is never empty.
    cut = len(rest) - (keep - first - 1)
    gone, kept = rest[:cut], rest[cut:]
    dropped += len(gone)
    marker = ActionEntry(
        gone[-1].time, Entry.ELIDED, "ok", f"{dropped} entries dropped after these"
    )
    return [*head, marker, *kept]
