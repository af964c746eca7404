"""The protocol every fault source follows, and what a source may look at.

A source turns what it sees about one node into FaultSignals. The policy asks
every source registered in `gpuheal.sources.SOURCES` for a node's signals in
one loop (gpuheal.policy.plan.reported): the node's own report wins (the first
signal of an OWN source, in the list's order); else the most severe signal of
the other sources.

Two kinds of source:

- read sources look at the node and its records as the caches hold them
  (annotations, conditions, escalation);
- pushed sources are told about faults from outside the node (alertmanager,
  dcgm, manual). Each keeps its intake in its module: the pure decoding of what
  arrives into signals. Its I/O shell, a route in gpuheal/api or a poller in
  gpuheal/controller, calls it and hands the signals to the controller's store
  (gpuheal.controller.signals.ExternalSignals), which the plan sees as
  `Seen.external`; the source claims its own there by name (`claimed`).

Adding a source is one module in this package (SOURCE, OWN, signals()) and one
line in SOURCES, plus a row of the severity table in docs/api.md; a pushed
source also needs its intake route or poller in the I/O shell. The controller's
intake (ControllerIntake.submit) takes no signal from a source that is not
registered: held, it would never be acted on.

Pure: no I/O, no clock reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from gpuheal.config import Config
from gpuheal.model import FaultRecord, FaultSignal, NodeView


@dataclass(frozen=True)
class Seen:
    """What a source may look at for one node."""

    node: NodeView
    config: Config
    # Signals pushed about this node from outside it and held until resolved or
    # expired (the controller's ExternalSignals): every pushed source's.
    external: tuple[FaultSignal, ...] = ()
    # The node's GPUFault records, node-level and device-level.
    records: tuple[FaultRecord, ...] = ()
    # One of its DRA devices can be fenced alone (the DeviceTaintRule API is served):
    # the agent's one-GPU finding is then that device's (policy/agentdevice.py).
    device_fence: bool = False


class Source(Protocol):
    """A fault source: a module of this package (or any object) with these members."""

    # What GPUFault records say in `source`: this name, or `<name>/<detail>`.
    SOURCE: str
    # The node's own report: it wins over every other source's signal.
    OWN: bool

    def signals(self, seen: Seen) -> Iterable[FaultSignal]:
        """The faults this source sees on the node now (none: empty)."""
        ...


def source_name(source: str) -> str:
    """The registered name a signal's `source` comes from (`dcgm/xid` -> `dcgm`)."""
    return source.partition("/")[0]


def claimed(name: str, seen: Seen) -> tuple[FaultSignal, ...]:
    """A pushed source's signals among those held for the node."""
    return tuple(s for s in seen.external if source_name(s.source) == name)
