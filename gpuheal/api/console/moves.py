"""Where the pods a fault moved went: for each pod the record says was evicted,
its controller and the nodes its controller's pods created since the eviction
run on, from the pod cache alone (the evicted pod itself is gone from it).

The evicted pod's controller is read from the pod when the cache still has it
(terminating, or recreated under its own name by a StatefulSet); else from its
name, as Kubernetes' controllers name their pods: a StatefulSet's are
`<set>-<ordinal>`, a ReplicaSet's or a Job's `<owner>-<5 random characters>`
(the API server's generateName suffix; an indexed Job's `<job>-<index>-<5>`),
matched against the controllers of the pods in its namespace now."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuheal.clock import parse_time
from gpuheal.model import PodView

# The API server's generateName suffix: 5 of these (k8s.io/apimachinery util/rand).
_GENERATED = re.compile(r"(?:\d+-)?[bcdfghjklmnpqrstvwxz2456789]{5}")
_ORDINAL = re.compile(r"\d+")


@dataclass(frozen=True)
class Move:
    pod: str  # namespace/name, as the record keeps it
    owner: str  # its controller, "Kind/name"; "" when none is known
    nodes: tuple[str, ...]  # where its controller's pods created since the eviction run
    pending: int  # of those, how many no node has taken yet

    @property
    def where(self) -> str:
        if not self.owner:
            return "no controller (not recreated)"
        if not self.nodes and not self.pending:
            return "not replaced yet"
        waiting = [f"{self.pending} pending"] if self.pending else []
        return ", ".join([*self.nodes, *waiting])


def moves(evicted: Iterable[str], since: str, pods: Mapping[str, PodView]) -> list[Move]:
    """`evicted`: the record's evicted pods; `since`: when the eviction began (the
    record's first `evict` entry); `pods`: the pod cache, by namespace/name."""
    keys = list(evicted)
    namespaces = {k.partition("/")[0] for k in keys}
    started = parse_time(since)
    # creationTimestamp has whole seconds: a pod created in the eviction's second counts.
    after = started.replace(microsecond=0) if started else None
    by_owner: dict[str, list[PodView]] = {}
    owners_in: dict[str, set[str]] = {}
    for key, pod in pods.items():
        if not pod.owner or key.partition("/")[0] not in namespaces:
            continue
        owners_in.setdefault(pod.namespace, set()).add(pod.owner)
        if _replacement(pod, after):
            by_owner.setdefault(pod.owner, []).append(pod)
    found = []
    for key in keys:
        namespace, _, name = key.partition("/")
        cached = pods.get(key)
        owner = cached.owner if cached else _owner_by_name(name, owners_in.get(namespace, ()))
        replacements = by_owner.get(owner, []) if owner else []
        found.append(
            Move(
                pod=key,
                owner=owner,
                nodes=tuple(sorted({p.node for p in replacements if p.node})),
                pending=sum(not p.node for p in replacements),
            )
        )
    return found


def _replacement(pod: PodView, after: dt.datetime | None) -> bool:
    created = parse_time(pod.created_at)
    return (
        after is not None
        and created is not None
        and created >= after
        and not pod.deleting
        and not pod.terminal
    )


def _owner_by_name(name: str, owners: Iterable[str]) -> str:
    """The controller whose pods are named like `name`; the longest name wins
    (`web-api` over `web` for `web-api-7c4x9`)."""
    best, longest = "", -1
    for owner in owners:
        kind, _, owner_name = owner.partition("/")
        prefix = f"{owner_name}-"
        suffix = _ORDINAL if kind == "StatefulSet" else _GENERATED
        if (
            name.startswith(prefix)
            and suffix.fullmatch(name[len(prefix) :])
            and len(owner_name) > longest
        ):
            best, longest = owner, len(owner_name)
    return best
