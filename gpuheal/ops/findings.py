"""What `gpuheal doctor` works from (Facts) and what it says (Findings).

Facts are the API objects the doctor read, in one immutable bundle, so every
conclusion is a pure function of them and of the clock reading inside; tests
build Facts by hand. A Finding is one plain sentence with a severity and a
stable `kind` that scripts and tests match on instead of the wording.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuheal.clock import duration
from gpuheal.kube.details import Node, NodeCondition, Pod, PodDisruptionBudget, ResourceQuota
from gpuheal.kube.snapshot import NodeDra
from gpuheal.model import FaultRecord

# Severities: ok (checked, fine), info (context, not a problem), warn, bad.
# Only warn and bad make the node unhealthy (exit 3).
OK, INFO, WARN, BAD = "ok", "info", "warn", "bad"
PROBLEMS = frozenset({WARN, BAD})
# Names listed in one sentence before "and N more".
NAMES_SHOWN = 5


@dataclass(frozen=True)
class Finding:
    severity: str
    kind: str
    text: str

    @property
    def problem(self) -> bool:
        return self.severity in PROBLEMS


@dataclass(frozen=True)
class Facts:
    """Everything the doctor read about one node and its surroundings."""

    name: str
    node: Node | None  # None: not registered
    now: dt.datetime
    nodes: Sequence[Node] = ()  # every node (candidates, peers)
    pods_on_node: Sequence[Pod] = ()
    pending: Sequence[Pod] = ()  # every Pending pod of the cluster
    # Live pods bound to any node, for free GPUs; None: not read (nothing needed it).
    bound_pods: Sequence[Pod] | None = None
    # This node's GPUFault records; None: they could not be read (no CRD, forbidden).
    faults: Sequence[FaultRecord] | None = None
    pdbs: Sequence[PodDisruptionBudget] = ()
    quotas: Sequence[ResourceQuota] = ()
    # Pod UID -> the scheduler's latest FailedScheduling message.
    scheduler_says: Mapping[str, str] = field(default_factory=dict)
    # What could not be read ("PodDisruptionBudgets in ns-a: forbidden"), said as info.
    unread: Sequence[str] = ()
    # The node's GPUs offered through DRA, and the device fence the cluster serves.
    dra: NodeDra = field(default_factory=NodeDra)


def when(moment: dt.datetime | None, now: dt.datetime) -> str:
    """`2025-03-01 10:00:00Z (3h12m ago)`; "an unknown time" without a timestamp."""
    if moment is None:
        return "an unknown time"
    moment = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
    stamp = moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return f"{stamp} ({duration((now - moment).total_seconds())} ago)"


def listed(names: Iterable[str], shown: int = NAMES_SHOWN) -> str:
    """`a, b, c` or `a, b, c, d, e and 3 more`."""
    items = list(names)
    if len(items) <= shown:
        return ", ".join(items)
    return f"{', '.join(items[:shown])} and {len(items) - shown} more"


def plural(count: int, word: str, many: str = "") -> str:
    return f"{count} {word if count == 1 else (many or word + 's')}"


def pod_key(pod: Pod) -> str:
    meta = pod.metadata
    return f"{(meta.namespace if meta else '') or ''}/{(meta.name if meta else '') or ''}"


def conditions_of(node: Node) -> list[NodeCondition]:
    return list(node.status.conditions or ())


def condition_of(node: Node, type_: str) -> NodeCondition | None:
    return next((c for c in conditions_of(node) if c.type == type_), None)


def said(condition: NodeCondition) -> str:
    """The condition's reason and message, as one clause."""
    parts = [p for p in (condition.reason, condition.message) if p]
    return ": ".join(parts) if parts else "no reason given"
