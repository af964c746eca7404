"""`gpuheal doctor`'s fault history: the node's GPUFault records that remain
(retention deletes closed ones by age and by a count per node), newest first,
each in one row: when, which fault, what was done, how it ended."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from gpuheal.clock import iso
from gpuheal.model import FaultRecord
from gpuheal.ops.findings import when
from gpuheal.ops.output import Table
from gpuheal.policy.history import closed_at, opened_at
from gpuheal.vocabulary import Entry, said

# Entries the history leaves out: the trimming's count, a canary's start (its
# result follows), a device quarantine's extension.
_QUIET = frozenset({Entry.ELIDED, Entry.CANARY_START, Entry.EXTEND})


def history(records: Sequence[FaultRecord]) -> tuple[FaultRecord, ...]:
    """Newest first: by when each fault was detected (its first action entry, else
    the record's creation); the name breaks ties."""
    oldest = dt.datetime.min.replace(tzinfo=dt.UTC)
    return tuple(sorted(records, key=lambda r: (opened_at(r) or oldest, r.name), reverse=True))


def done(record: FaultRecord) -> str:
    """What was done about the fault, in order, each step once."""
    steps: list[str] = []
    for entry in record.actions:
        if entry.action in _QUIET:
            continue
        if entry.action == Entry.EVICT:
            steps.append(f"evicted {len(record.evicted_pods)} pod(s)")
        else:
            steps.append(said(entry.action))
    return ", ".join(dict.fromkeys(steps))


def _closed(record: FaultRecord) -> str:
    if record.open:
        return ""
    moment = closed_at(record)
    return iso(moment) if moment else ""


def history_data(records: Sequence[FaultRecord]) -> list[dict[str, Any]]:
    return [
        {
            "name": r.name,
            "faultId": r.fault_id,
            "reason": r.reason,
            "severity": r.severity.value,
            "source": r.source,
            "scope": r.scope,
            "device": r.device,
            "phase": r.phase.value,
            "open": r.open,
            "createdAt": r.created_at,
            "detectedAt": r.detected_at,  # as the source reported it
            "closedAt": _closed(r),
            "evictedPods": list(r.evicted_pods),
            "done": done(r),
        }
        for r in records
    ]


def history_table(records: Sequence[FaultRecord], now: dt.datetime) -> Table:
    rows = [
        (
            when(opened_at(r), now),
            r.fault_id,
            r.reason + (f" ({r.device})" if r.device_scope else ""),
            r.phase.value,
            done(r),
            when(closed_at(r), now) if not r.open else "open",
        )
        for r in records
    ]
    return Table(
        "Fault history (newest first)",
        ("DETECTED", "FAULT", "REASON", "PHASE", "DONE", "CLOSED"),
        rows,
        empty="no GPUFault records (closed ones are deleted after retention."
        "resolvedMaxAgeSeconds, beyond retention.perNodeMax per node)",
    )
