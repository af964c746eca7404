"""What a plan is made of, and what it is made from: the actions (each carried out
by one effect, gpuheal/controller/effects/), the plan's stages, its steps with
their guards and what follows each (the runner's program,
gpuheal/controller/runner.py), and the node's state as the policy reads it.

gpuheal/policy/plan/ decides them; nothing here decides anything but the order
of the stages and the state label that goes with our taint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpuheal.model import (
    ActionEntry,
    FaultRecord,
    FaultSignal,
    Mode,
    NodeView,
    Phase,
    PodView,
    RepairApproval,
)
from gpuheal.policy import validation
from gpuheal.policy.backoff import Blocked
from gpuheal.policy.disruption import GuardDisruption
from gpuheal.policy.repair import RequestRepair
from gpuheal.policy.replace import CallReplace
from gpuheal.policy.rollout import RolloutDriver

# Values of the gpuheal.io/state label.
STATE_QUARANTINED = "quarantined"


def state_label_with_taint(adding: bool, label: str | None) -> str | None:
    """The gpuheal.io/state label to write with our taint's change (None: leave it,
    "": remove it). Ours says "quarantined" and goes with our taint; any other
    state (a person's "maintenance") is not ours to set or remove."""
    if adding:
        return STATE_QUARANTINED if label in (None, STATE_QUARANTINED) else None
    return "" if label == STATE_QUARANTINED else None


@dataclass(frozen=True)
class CreateRecord:
    name: str
    signal: FaultSignal
    phase: Phase
    mode: Mode
    # The fault ids this new fault supersedes on the node (spec.supersedes).
    supersedes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Planned:
    """What quarantining a node would do: its taint, and the GPU pods a drain
    would evict (none in `quarantine` mode). A record's status.plan."""

    node: str
    taint: str
    evict: tuple[str, ...] = ()

    def status(self) -> dict[str, object]:
        return {"node": self.node, "taint": self.taint, "evict": list(self.evict)}

    def text(self) -> str:
        pods = self.evict
        shown = ", ".join(pods[:10]) + (f" and {len(pods) - 10} more" if len(pods) > 10 else "")
        evict = f"; evict {len(pods)} GPU pods: {shown}" if pods else "; evict no pod"
        return f"taint {self.node} {self.taint}{evict}"


@dataclass(frozen=True)
class UpdateRecord:
    name: str
    phase: Phase
    entry: ActionEntry
    recovering_since: str | None = None  # None: unchanged, "": clear
    record_evictions: bool = False  # add the pods this plan's Evict actions evicted
    expiry: str | None = None  # a device quarantine's new end; None: unchanged
    plan: Planned | None = None  # status.plan; None: unchanged
    contact_support: bool = False  # set status.contactSupport (never unset)
    repair_approval: RepairApproval | None = None  # status.repairApproval; None: unchanged


@dataclass(frozen=True)
class ReplaceIntent(UpdateRecord):
    """The intent of a provider-hook call: written at once, before the call
    (policy/replace.py), not with the pass's other record news."""


@dataclass(frozen=True)
class AwaitApproval(UpdateRecord):
    """The record's plan waits for a person (its own name in metrics and notifications)."""


@dataclass(frozen=True)
class WouldQuarantine(UpdateRecord):
    """Observe mode: the record notes what quarantine/full mode would have done."""


@dataclass(frozen=True)
class AddTaint:
    node: str
    fault_id: str
    effect: str
    # The fault's handled mark goes in the same node PATCH: the policy sets it when
    # the plan marks the fault handled in the pass that fences it (no pod to move,
    # or `quarantine` mode), so one write, not two, stands for both. The plan's
    # MarkHandled stays: it finds the mark written.
    with_mark: bool = False


@dataclass(frozen=True)
class RemoveTaint:
    node: str


@dataclass(frozen=True)
class Evict:
    pod: PodView
    fault_id: str
    device: str = ""  # set when the pod moves off one bad device (a partial drain)


@dataclass(frozen=True)
class RequestCheckpoint:
    """Ask the pod to checkpoint by `deadline` (the annotation, written once)."""

    pod: PodView
    fault_id: str
    deadline: str


@dataclass(frozen=True)
class DeletePod:
    pod: PodView
    fault_id: str


@dataclass(frozen=True)
class MarkHandled:
    node: str
    fault_id: str


@dataclass(frozen=True)
class Emit:
    reason: str
    note: str
    node: str
    record: str
    warning: bool = False


Action = (
    CreateRecord
    | UpdateRecord
    | AddTaint
    | RemoveTaint
    | RequestCheckpoint
    | Evict
    | DeletePod
    | MarkHandled
    | RequestRepair
    | CallReplace
    | GuardDisruption
    | Emit
    | validation.CreateValidationJob
    | validation.DeleteValidationJob
)


@dataclass(frozen=True)
class Plan:
    """A node's actions in stages, each named for what it does and run in this order
    (the order of the safety rules): `record`, the fault's record (the lock) and
    what is decided about records before the node is touched; `fence`, our taint
    on the node with its record entry and Event; `drain`, the GPU pods evicted (or
    deleted) with the drain round's record entry; `mark`, the node marked handled
    and its record drained; `release`, the way back (recovery window, health gate,
    untaint) and our state label following our taint.

    The controller carries the stages out as `steps`, each under its guard: a new
    quarantine's taint first under the breaker, then its record, its drain on the
    node's next turn (docs/architecture.md#the-plan-and-its-stages)."""

    record: tuple[Action, ...] = ()
    fence: tuple[Action, ...] = ()
    drain: tuple[Action, ...] = ()
    mark: tuple[Action, ...] = ()
    # After the drain: the repair request, the record's repair entries and Events.
    repair: tuple[Action, ...] = ()
    release: tuple[Action, ...] = ()
    requeue_after: float | None = None
    # Why nothing (more) is done: a dedupe layer or a rule; logged and counted.
    suppressed: str | None = None
    # The plan starts a quarantine: take a rate-limit token before its fence.
    new_quarantine: bool = False
    # The plan asks for a repair: the repair budget's lock applies (as the breaker's).
    new_repair: bool = False
    fault_id: str = ""
    reason: str = ""  # the fault's, for the notices of a pass that names no record

    @property
    def actions(self) -> tuple[Action, ...]:
        """Every stage's actions, in order."""
        return self.record + self.fence + self.drain + self.mark + self.repair + self.release

    @property
    def moves_pods(self) -> bool:
        """The drain evicts or deletes a pod now (not only records pods already leaving)."""
        return any(isinstance(a, Evict | DeletePod) for a in self.drain)

    @property
    def steps(self) -> tuple[PlanStep, ...]:
        """The plan as the controller carries it out (controller/runner.py): its
        actions in steps, each with the guard it runs under and what follows it.

        A new quarantine: the taint first, alone, under the breaker (the plan is
        made again there, from caches that hold every taint so far): it is
        idempotent (its value is the fault id, written under the node's
        resourceVersion), so it needs no lock of its own and nothing stands before
        it. Then the record (the fault's lock, for everything after the taint that
        is not idempotent: Events, evictions, repairs) with the fence's entry and
        Event, and the rest at once. When the drain moves pods the fence's pass is
        the taint alone, and everything else is the node's next turn (behind every
        node queued for a fresh look: a storm's nodes are all fenced before any
        worker makes a record or evicts): its plan sees our taint on a node without
        the fault's record and makes the record (plan/admit.py::_first_sight), its entries
        and Events (plan/fault.py::taint_noted) and the drain, in one status write. Those
        are the rules that also mend a controller stopped between the taint and
        the record. A taint the API server refuses (admission, RBAC) leaves the
        fault on record all the same: the record stage runs instead
        (PlanStep.otherwise) and the taint is retried after the node's backoff. A
        new repair request: the whole plan under the repair budget. Anything else:
        the whole plan, unguarded."""
        if self.new_quarantine:
            taint = tuple(a for a in self.fence if isinstance(a, AddTaint))
            if self.moves_pods:
                return (PlanStep(taint, Guard.BREAKER, Then.NEXT_TURN, self.record),)
            return (
                PlanStep(taint, Guard.BREAKER, Then.CONTINUE, self.record),
                PlanStep(self.record + self.fence, Guard.NONE, Then.CONTINUE),
                PlanStep(
                    self.drain + self.mark + self.repair + self.release, Guard.NONE, Then.LATER
                ),
            )
        if self.new_repair:
            return (PlanStep(self.actions, Guard.REPAIR_BUDGET, Then.LATER),)
        return (PlanStep(self.actions, Guard.NONE, Then.LATER),)


class Guard(StrEnum):
    """What a step runs under. BREAKER: the breaker's lock, the plan made again
    under it (still a new quarantine?) and a rate-limit token; REPAIR_BUDGET: the
    same lock, the plan made again under it and run whole (the repair budget counts
    the requests written so far)."""

    NONE = "none"
    BREAKER = "breaker"
    REPAIR_BUDGET = "repair-budget"


class Then(StrEnum):
    """What follows a step: the next step at once (CONTINUE), the node's next turn
    in the queue (NEXT_TURN: behind the nodes queued for a fresh look), or the
    plan's requeue_after (LATER: the last step)."""

    CONTINUE = "continue"
    NEXT_TURN = "next-turn"
    LATER = "later"


@dataclass(frozen=True)
class PlanStep:
    actions: tuple[Action, ...]
    guard: Guard
    then: Then
    # Run instead of what follows when the step fails (the API server refused it,
    # an outage): a new quarantine's record, so that a fault whose taint is refused
    # is still on record (Detected) while its fence is retried.
    otherwise: tuple[Action, ...] = ()


@dataclass(frozen=True)
class NodeState:
    """Everything the policy needs about one node, gathered from the caches."""

    node: NodeView
    pods: tuple[PodView, ...] = ()
    records: tuple[FaultRecord, ...] = ()
    gpu_nodes: int = 0
    # GPU nodes carrying our taint right now (this node included if it does).
    quarantined: frozenset[str] = frozenset()
    # Pod key -> its refused eviction (429) and when to try again, in this process's memory.
    blocked: Mapping[str, Blocked] = field(default_factory=dict)
    # Signals pushed about this node from outside it (alerts, DCGM metrics, manual
    # requests), held by the controller until resolved or expired.
    external: tuple[FaultSignal, ...] = ()
    # Pushed sources that have not looked since this controller started: their
    # faults' silence is no news, so no recovery starts for them yet.
    unsettled: frozenset[str] = frozenset()
    # The node's device-level records (the device plan's; sources read them).
    device_records: tuple[FaultRecord, ...] = ()
    # Driver versions of the other GPU nodes of this node's pool (version -> nodes),
    # for the health gate's driver check.
    pool_drivers: Mapping[str, int] = field(default_factory=dict)
    # A driver roll-out of the node's pool, as the gate sees it for this node.
    rollout: RolloutDriver | None = None
    # Fault ids this controller marked handled on this node within dedupeTtlSeconds
    # (its memory: empty after a restart), for the recently-handled rule.
    handled_lately: frozenset[str] = frozenset()
    # The node's validation pods by Job name (healthGate.validation).
    validations: Mapping[str, validation.ValidationPod] = field(default_factory=dict)
    # GPU nodes with a repair in flight (a request its agent has not answered).
    repairing: frozenset[str] = frozenset()
    # A DRA device of the node can be fenced alone (sources/base.py, Seen).
    device_fence: bool = False
