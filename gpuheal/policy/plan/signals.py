"""Which signal a node's plan acts on, of all its sources report."""

from __future__ import annotations

from collections.abc import Sequence

from gpuheal.model import FaultSignal
from gpuheal.policy import agentdevice
from gpuheal.sources import SOURCES, Seen, Source


def reported(seen: Seen, sources: Sequence[Source] = SOURCES) -> tuple[FaultSignal, ...]:
    """What the sources report about the node, the current signal first: the node's
    own report (the first signal of an OWN source, in the sources' order; the own
    sources after it are not asked), then every other source's signal, the most
    severe first (ties: the oldest fault id, for stability). The agent's report of
    one DRA card's fault is that card's (the device plan's), not the node's."""
    own: FaultSignal | None = None
    for source in sources:
        if source.OWN:
            own = next(iter(source.signals(seen)), None)
            if own is not None:
                break
    if own is not None and agentdevice.diverted(seen, own):
        own = None
    others = sorted(
        (signal for source in sources if not source.OWN for signal in source.signals(seen)),
        key=lambda s: (s.severity.rank, s.fault_id),
    )
    return (own, *others) if own is not None else tuple(others)


def current_signal(seen: Seen, sources: Sequence[Source] = SOURCES) -> FaultSignal | None:
    """The signal the node's plan acts on (reported's first), or None."""
    return next(iter(reported(seen, sources)), None)
