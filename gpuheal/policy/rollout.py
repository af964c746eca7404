"""A roll-out across a GPU pool (a new driver, or any change the operator's tooling
applies): which nodes go next, within which budget, and what the health gate's
driver rule expects meanwhile. Pure: the GPURollout's status in, decisions out.

The order is fixed when the roll-out starts: the pool's nodes by name, the first
`canary` of them batch 0, then batches of `batchSize`. A batch starts only when
every node of the batches before it is done, so the canary proves the change
before anything else moves; within a batch, nodes start only while the pool's
unavailable nodes (faults, maintenance, not Ready, cordoned: whatever the cause)
stay within maxUnavailable and the fleet's within the breaker's capacity.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from gpuheal.policy.pools import driver_version
from gpuheal.values import digest, object_name, text


class Phase(StrEnum):
    RUNNING = "Running"
    PAUSED = "Paused"
    COMPLETED = "Completed"
    FAILED = "Failed"
    ABORTED = "Aborted"


class RolloutStep(StrEnum):
    """A node's progress, in order; FAILED_HELD: the gate refused it (or the change
    never came), and it stays in maintenance for a person."""

    PENDING = "pending"
    DRAINING = "draining"
    WAITING = "waiting-for-change"
    GATING = "gating"
    DONE = "done"
    FAILED_HELD = "failed-held"


# Taken out of service by the roll-out and not given back yet.
IN_FLIGHT = frozenset(
    {RolloutStep.DRAINING, RolloutStep.WAITING, RolloutStep.GATING, RolloutStep.FAILED_HELD}
)
# Phases nothing drives any more.
FINAL = frozenset({Phase.COMPLETED, Phase.ABORTED})


def rollout_name(pool: str) -> str:
    """The pool's one GPURollout: readable, a valid object name for any pool value,
    distinct pools distinct (the digest), the same pool always the same name, so a
    second roll-out of a pool is refused by the API server (409)."""
    return object_name(f"rollout-{pool}", digest(pool))


@dataclass(frozen=True)
class Target:
    """What a node reports once the change is applied; empty fields ask nothing."""

    driver_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def missing(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> list[str]:
        """What the node does not report yet ([] when it has the change)."""
        out = []
        have = driver_version(labels, annotations)
        if self.driver_version and have != self.driver_version:
            out.append(f"driver {have or '(none)'}, not {self.driver_version}")
        out += [f"label {k}={v}" for k, v in sorted(self.labels.items()) if labels.get(k) != v]
        out += [
            f"annotation {k}={v}"
            for k, v in sorted(self.annotations.items())
            if annotations.get(k) != v
        ]
        return out

    def describe(self) -> str:
        parts = [f"driver {self.driver_version}"] if self.driver_version else []
        parts += [f"{k}={v}" for k, v in sorted({**self.labels, **self.annotations}.items())]
        return ", ".join(parts)


# A node's detail, at most (the GPURollout CRD's maxLength).
DETAIL_MAX = 1024


@dataclass(frozen=True)
class NodeProgress:
    name: str
    batch: int
    step: RolloutStep
    since: str = ""
    detail: str = ""


def plan_order(nodes: Iterable[str], canary: int, batch_size: int) -> list[NodeProgress]:
    """The roll-out's order: by name (stable across restarts), the canary batch 0."""
    ordered = sorted(set(nodes))
    return [
        NodeProgress(name, batch_of(i, canary, batch_size), RolloutStep.PENDING)
        for i, name in enumerate(ordered)
    ]


def batch_of(index: int, canary: int, batch_size: int) -> int:
    if index < canary:
        return 0
    first = 1 if canary > 0 else 0
    return first + (index - canary) // max(batch_size, 1)


def allowed_unavailable(pool_size: int, max_count: int, max_percent: float | None) -> int:
    """The pool's budget: the count, and the percentage of the pool when given (at
    least one node, or nothing could ever move)."""
    if max_count <= 0:
        return 0
    if max_percent is None:
        return max_count
    return max(1, min(max_count, math.floor(pool_size * max_percent / 100)))


@dataclass(frozen=True)
class Budget:
    """Room to take nodes out, as counted now."""

    pool_unavailable: frozenset[str]  # the pool's nodes out of service, whatever the cause
    pool_allowed: int
    fleet_unavailable: int  # GPU nodes quarantined or in maintenance, fleet-wide
    fleet_allowed: int  # the breaker's capacity

    @property
    def room(self) -> int:
        return max(
            0,
            min(
                self.pool_allowed - len(self.pool_unavailable),
                self.fleet_allowed - self.fleet_unavailable,
            ),
        )

    def describe(self) -> str:
        return (
            f"{len(self.pool_unavailable)}/{self.pool_allowed} of the pool unavailable, "
            f"{self.fleet_unavailable}/{self.fleet_allowed} of the breaker's budget used"
        )


def current_batch(progress: Sequence[NodeProgress]) -> int | None:
    """The lowest batch with a node not done; None when all are."""
    open_batches = [p.batch for p in progress if p.step is not RolloutStep.DONE]
    return min(open_batches) if open_batches else None


def next_to_start(
    progress: Sequence[NodeProgress], budget: Budget, upgrading: Collection[str] = ()
) -> list[str]:
    """The pending nodes to take out now: none while a node is held (the first
    failure stops the roll-out), only the current batch's, as many as the room; not
    one gpu-operator is upgrading (`upgrading`, policy/operator.py): it waits."""
    if any(p.step is RolloutStep.FAILED_HELD for p in progress):
        return []
    batch = current_batch(progress)
    if batch is None:
        return []
    pending = [
        p.name
        for p in progress
        if p.batch == batch and p.step is RolloutStep.PENDING and p.name not in upgrading
    ]
    return pending[: budget.room]


def unmanaged_step(p: NodeProgress, why: str, stamp: str) -> NodeProgress:
    """A node of the order that gpuheal no longer manages (opted out since the order
    was written; `why`: policy/nodes.py::why_unmanaged): it is never taken out (a
    pending one waits, saying why) and nothing more is done to one in flight (held
    for a person, which stops the roll-out). Done and held nodes stay as they are."""
    detail = f"not managed by gpuheal: {why}"
    if p.step is RolloutStep.PENDING:
        # Cut as the status write cuts it, so the next pass sees no change.
        return replace(p, detail=text(f"waits: {detail}", DETAIL_MAX))
    if p.step in (RolloutStep.DONE, RolloutStep.FAILED_HELD):
        return p
    return replace(p, step=RolloutStep.FAILED_HELD, since=stamp, detail=text(detail, DETAIL_MAX))


def counts(progress: Sequence[NodeProgress]) -> Counter[RolloutStep]:
    return Counter(p.step for p in progress)


# -- the health gate's driver rule during a roll-out ----------------------------------


@dataclass(frozen=True)
class RolloutDriver:
    """What the gate's driver rule needs of a roll-out of the node's pool: its target
    version, and whether this node is rolled (or being gated) by it."""

    target: str
    rolled: bool


def driver_rollout_view(
    target: str, progress: Sequence[NodeProgress], node: str
) -> RolloutDriver | None:
    """The gate's view of a roll-out for `node` (None when it changes no driver)."""
    if not target:
        return None
    step = next((p.step for p in progress if p.name == node), None)
    rolled = step is not None and step not in (RolloutStep.PENDING, RolloutStep.DRAINING)
    return RolloutDriver(target=target, rolled=rolled)


def expected_during_rollout(rollout: RolloutDriver, peers: Mapping[str, int]) -> str:
    """A rolled node must run the target; one not rolled yet, what the rest of the
    pool ran before (its peers' prevailing version other than the target; the
    target when every peer runs it already)."""
    if rollout.rolled:
        return rollout.target
    before = Counter({v: n for v, n in peers.items() if v and v != rollout.target})
    if not before:
        return rollout.target if peers else ""
    return max(before.items(), key=lambda item: (item[1], item[0]))[0]
