"""What every effect reaches the world through, and what a pass gathers as it goes.

An effect (one module per resource beside this one) carries out one kind of
action against the API server. It reads and writes through an EffectContext:
the client, the informers' caches (every write's response goes back into them,
so the next plan sees our own writes before the watch delivers them), the Event
recorder, the metrics and the controller's current config. What a pass decided
but has not written yet (each record's news, its Events, the pods it evicted)
is gathered in its PassOutcome and written when the pass ends (effects/flush.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from gpuheal.config import Config
from gpuheal.kube.api import KubeApi
from gpuheal.kube.events import EventRecorder, ObjectRef, node_ref
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import (
    ActionEntry,
    CanaryView,
    FaultRecord,
    FenceView,
    NodeView,
    Phase,
    PodView,
    RepairApproval,
)
from gpuheal.policy.actions import Emit, NodeState, Planned, UpdateRecord

# A write refused for a stale resourceVersion is read again and retried this often.
CONFLICT_RETRIES = 5

V = TypeVar("V")


class Replan(Exception):  # noqa: N818 -- a signal to the reconciler, not a failure
    """The world moved under the plan (someone else's record, a conflict): plan again."""


class Cache(Protocol[V]):
    """An informer's store as the effects write through it."""

    def get(self, key: str) -> V | None: ...

    def upsert(self, value: V, version: str) -> Any: ...


@dataclass
class WriteThrough:
    """Write-through hooks into the informers' stores."""

    node: Callable[[str], NodeView | None]
    record: Callable[[str], FaultRecord | None]
    put_node: Callable[[NodeView], None]
    put_record: Callable[[FaultRecord], None]
    put_pod: Callable[[PodView], None]
    put_canary: Callable[[CanaryView], None] = lambda _: None
    put_fence: Callable[[FenceView, str], None] = lambda _view, _version: None

    @classmethod
    def over(
        cls,
        nodes: Cache[NodeView],
        records: Cache[FaultRecord],
        pods: Cache[PodView],
        canaries: Cache[CanaryView] | None = None,
        fences: Cache[FenceView] | None = None,
    ) -> WriteThrough:
        """Hooks into informers: each written object replaces the cached one at the
        version the API server answered with."""
        return cls(
            node=nodes.get,
            record=records.get,
            put_node=lambda v: nodes.upsert(v, v.resource_version),
            put_record=lambda v: records.upsert(v, v.resource_version),
            put_pod=lambda v: pods.upsert(v, v.resource_version),
            # No version yet: any watch event for the canary replaces this placeholder.
            put_canary=(lambda v: canaries.upsert(v, "0")) if canaries else (lambda _: None),
            put_fence=fences.upsert if fences else (lambda _view, _version: None),
        )


@dataclass
class RecordNews:
    """A record's status as one pass leaves it: the pass's entries in order, the
    last phase and field values it set."""

    phase: Phase
    entries: list[tuple[ActionEntry, bool]] = field(default_factory=list)  # (entry, + evictions)
    recovering_since: str | None = None
    expiry: str | None = None
    plan: Planned | None = None
    evictions: bool = False
    contact_support: bool = False
    repair_approval: RepairApproval | None = None

    def add(self, action: UpdateRecord) -> None:
        self.phase = action.phase
        self.entries.append((action.entry, action.record_evictions))
        self.evictions = self.evictions or action.record_evictions
        if action.recovering_since is not None:
            self.recovering_since = action.recovering_since
        if action.expiry is not None:
            self.expiry = action.expiry
        if action.plan is not None:
            self.plan = action.plan
        self.contact_support = self.contact_support or action.contact_support
        if action.repair_approval is not None:
            self.repair_approval = action.repair_approval


@dataclass
class PassOutcome:
    """What one pass's actions came to, and what it has still to write."""

    evicted: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    blocked_by: dict[str, str] = field(default_factory=dict)  # pod key -> what refused it
    gone: list[str] = field(default_factory=list)
    left: dict[str, str] = field(default_factory=dict)  # pod key -> UID evicted or deleted
    untainted: bool = False
    handled: bool = False
    # Not yet written: what the pass decided about each record, its Events, the
    # pods it evicted and has not told of (node, fault id, "ns/pod[ off bad device d]").
    news: dict[str, RecordNews] = field(default_factory=dict)
    emits: list[Emit] = field(default_factory=list)
    untold: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass
class EffectContext:
    api: KubeApi
    caches: WriteThrough
    recorder: EventRecorder
    metrics: ControllerMetrics
    config: Callable[[], Config]  # the controller's current config, read where needed
    # Pods whose refused eviction was told (one Event per blocked pod, not per retry).
    blocked_told: set[str] = field(default_factory=set)

    def node_ref(self, name: str, state: NodeState | None = None) -> ObjectRef:
        """The Node as Events name it: with its UID (kubectl describe selects by it)."""
        node = self.caches.node(name)
        if node is None and state is not None and state.node.name == name:
            node = state.node
        return node_ref(name, node.uid, node.resource_version) if node else node_ref(name)


# One effect: carries out its action (of the type it is registered for) and says
# what came of it, in a word for the log and the remediations metric.
Handler = Callable[[EffectContext, Any, NodeState, PassOutcome], Awaitable[str]]
