"""Repeat offenders: a node whose faults keep coming back, however each was
handled, is a "lemon" (Meta's study of its clusters, arXiv 2410.21680, found
that taking such nodes out cut large jobs' failures several-fold; GPUd escalates
an Xid that recurs after reboots to an inspection by a person).

One rule, for node and device faults alike: a new fault that is at least the
`repeatOffenders.faults`-th of its node within `repeatOffenders.windowSeconds`
(node and device records, open or closed, while retention keeps them) makes the
node a repeat offender. Its record says so (`repeat-offender`, with the count)
and asks for support (`status.contactSupport`, a `GPUContactSupport` Event).
A node fault's record also holds the node out after its fault clears
(`repeatOffenders.hold`), until a person releases the record (`gpuheal
release`): a repair that works each time on a node that keeps failing is not a
fix. The same Xid recurring after the repair ladder's reboots is this rule too:
each recurrence is a new fault of the node.

Pure: the time is passed in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from gpuheal.config import Config
from gpuheal.model import FaultRecord
from gpuheal.policy.history import opened_at
from gpuheal.vocabulary import Entry


def offence(
    records: Iterable[FaultRecord], new: str, config: Config, now: dt.datetime
) -> str | None:
    """Why the node's new fault (record `new`, not made yet) makes it a repeat
    offender, or None."""
    cfg = config.repeat_offenders
    recent = {
        r.name
        for r in records
        if r.name != new
        and (t := opened_at(r)) is not None
        and (now - t).total_seconds() <= cfg.window_seconds
    }
    count = len(recent) + 1
    if count < cfg.faults:
        return None
    return (
        f"{count} faults on this node within {cfg.window_seconds / 86400:g} days "
        f"(repeatOffenders.faults {cfg.faults}): a repeat offender, contact support"
    )


def repeat_offender(record: FaultRecord) -> bool:
    """The record made its node a repeat offender."""
    return any(a.action == Entry.REPEAT_OFFENDER for a in record.actions)


def held_for_a_person(record: FaultRecord, config: Config) -> bool:
    """The node stays out after this fault clears until a person releases the record."""
    return config.repeat_offenders.hold and repeat_offender(record) and not record.released_by


def waits_for_a_person(record: FaultRecord) -> bool:
    """Its fault cleared and its node is held out for a person now (the console
    lists it with the breaker's held faults, to be released)."""
    said = any(a.action == Entry.HELD_FOR_A_PERSON for a in record.actions)
    return record.open and said and not record.released_by
