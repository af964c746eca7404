"""The recently-handled rule: a fault this controller marked handled a moment ago,
and whose taint is still ours, is skipped before any plan is made.

This is the second dedupe layer, after the persisted records (all of them:
docs/architecture.md#exactly-once): it spares a node
that keeps repeating its fault (each annotation rewrite, each repeated alert)
the work of a full plan. The memory is this process's only (a restart forgets
it, and the records and the handled mark stop the repeat instead); time is
passed in, never read.
"""

from __future__ import annotations

from gpuheal import values
from gpuheal.config import Config
from gpuheal.model import FaultSignal, Mode, NodeView
from gpuheal.policy.dedupe import TtlSet


def handled_lately(
    node: NodeView, signal: FaultSignal, handled: frozenset[str], config: Config
) -> bool:
    """The fault was handled lately (`handled`: the node's remembered fault ids) and
    nothing about it changed since: there is nothing to plan.

    Only while our taint for this fault is still on the node (or the fault is
    observe-only, which writes nothing to the node): a person's untaint must still
    reach the policy to be noted."""
    if signal.fault_id not in handled:
        return False
    if config.mode_for(signal.reason) is Mode.OBSERVE:
        return True
    taint = node.taint()
    return taint is not None and taint.value == values.taint_value(signal.fault_id)


class HandledFaults:
    """The fault ids marked handled per node, each for the TTL in force when it
    was marked (`dedupeTtlSeconds`)."""

    def __init__(self) -> None:
        # Expiry and prunes per node/fault key; the node's ids to look them up by.
        self._keys = TtlSet(0.0)
        self._ids: dict[str, set[str]] = {}

    def add(self, node: str, fault_id: str, now: float, ttl: float) -> None:
        self._keys.ttl = ttl
        self._keys.add(f"{node}/{fault_id}", now)
        self._ids.setdefault(node, set()).add(fault_id)

    def of(self, node: str, now: float) -> frozenset[str]:
        """The node's fault ids still remembered at `now` (the expired are dropped)."""
        ids = self._ids.get(node)
        if not ids:
            return frozenset()
        live = frozenset(f for f in ids if self._keys.contains(f"{node}/{f}", now))
        if live:
            self._ids[node] = set(live)
        else:
            del self._ids[node]
        return live

    def forget(self, node: str) -> None:
        """The node is gone: nothing of it is looked up again."""
        self._ids.pop(node, None)

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._ids.values())
