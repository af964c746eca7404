"""Every fault source, one module each, behind one protocol (base.py says how to
add one). SOURCES is the registration list the policy asks, in this order: the
node's own report first (annotations win over conditions), then the others.

No `from __future__ import annotations` here: it would shadow the annotations
module (importers elsewhere name it with `as`).
"""

from gpuheal.sources import (
    alertmanager,
    annotations,
    conditions,
    dcgm,
    escalation,
    hygiene,
    manual,
    sweep,
)
from gpuheal.sources.base import Seen, Source, source_name

SOURCES: tuple[Source, ...] = (
    annotations,
    conditions,
    alertmanager,
    dcgm,
    hygiene,
    sweep,
    manual,
    escalation,
)


def registered(source: str, sources: tuple[Source, ...] = SOURCES) -> bool:
    """Whether a signal's `source` names a registered source."""
    return any(source_name(source) == s.SOURCE for s in sources)


__all__ = [
    "SOURCES",
    "Seen",
    "Source",
    "alertmanager",
    "annotations",
    "conditions",
    "dcgm",
    "escalation",
    "hygiene",
    "manual",
    "registered",
    "sweep",
]
