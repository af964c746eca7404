"""Which closed GPUFault records to delete: by age, and by a count per node.

A record is the fault's audit trail; once the fault is closed (Resolved or
Failed) it is history, and a fleet of thousands of nodes would keep it forever.
An open record is the fault's lock and its state: it is never chosen. Nor is one
whose fault its node still reports (`keep`): without its record the fault would
be seen as new (docs/architecture.md#retention).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from gpuheal.config import RetentionConfig
from gpuheal.model import FaultRecord
from gpuheal.policy.history import closed_at

AGE = "age"
COUNT = "count"


@dataclass(frozen=True)
class Collectable:
    name: str
    node: str
    resource_version: str  # deleted only as read: a record changed since is left alone
    why: str  # AGE or COUNT


def collectable(
    records: Iterable[FaultRecord],
    config: RetentionConfig,
    now: dt.datetime,
    *,
    keep: Collection[str] = (),
) -> list[Collectable]:
    """The closed records to delete, oldest first: those closed longer than
    `resolved_max_age_seconds` ago, and per node those beyond its newest
    `per_node_max` closed ones. Records without any time are kept (their age
    is unknown)."""
    by_node: dict[str, list[tuple[dt.datetime, FaultRecord]]] = defaultdict(list)
    for record in records:
        if record.open or record.name in keep:
            continue
        at = closed_at(record)
        if at is not None:
            by_node[record.node].append((at, record))
    max_age = dt.timedelta(seconds=config.resolved_max_age_seconds)
    chosen: list[tuple[dt.datetime, Collectable]] = []
    for node, closed in by_node.items():
        closed.sort(key=lambda pair: (pair[0], pair[1].name), reverse=True)  # newest first
        for rank, (when, record) in enumerate(closed):
            why = AGE if now - when > max_age else COUNT if rank >= config.per_node_max else ""
            if why:
                item = Collectable(record.name, node, record.resource_version, why)
                chosen.append((when, item))
    chosen.sort(key=lambda pair: (pair[0], pair[1].name))
    return [c for _, c in chosen]
