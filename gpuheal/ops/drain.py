"""Drain a node the way `kubectl drain` does, and say what blocks it.

Every pod but DaemonSet pods, mirror pods and finished pods goes through the
Eviction API (never a DELETE), so PodDisruptionBudgets hold. Pods that would
lose data (emptyDir) or never come back (no controller) stay unless the
operator says otherwise. Until the deadline, refused evictions are retried and
what stands in the way is named: the PodDisruptionBudget and its numbers, the
finalizer, the flag to pass.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from lightkube import ApiError
from lightkube.models.meta_v1 import DeleteOptions, ObjectMeta, Preconditions
from lightkube.resources.core_v1 import Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from gpuheal.ops.context import Context
from gpuheal.ops.legacy import (
    is_mirror_pod,
    labels_of,
    owner_kind,
    pod_key,
    pod_live,
    pods_on,
    selector_matches,
)


def skip_reason(pod: Pod) -> str:
    """Why the drain leaves this pod alone ("" when it must go)."""
    if owner_kind(pod) == "DaemonSet":
        return "DaemonSet pod"
    if is_mirror_pod(pod):
        return "static (mirror) pod"
    if not pod_live(pod):
        return "finished"
    return ""


def held_back(pod: Pod, *, delete_emptydir_data: bool, force: bool) -> str:
    """Why the drain will not evict this pod without a flag ("" when it may)."""
    volumes = (pod.spec.volumes if pod.spec else None) or ()
    local = [v.name for v in volumes if v.emptyDir is not None]
    if local and not delete_emptydir_data:
        return f"local storage: emptyDir volume {', '.join(local)} (pass --delete-emptydir-data)"
    if not owner_kind(pod) and not force:
        return "not managed by a controller (pass --force)"
    return ""


def finalizer_blocker(pod: Pod) -> str:
    """A pod being deleted that stays: its finalizers ("" if it has none)."""
    meta = pod.metadata or ObjectMeta()
    if meta.deletionTimestamp is None or not meta.finalizers:
        return ""
    return f"being deleted, held by finalizer {', '.join(meta.finalizers)}"


# Past its deletion deadline by this much, a terminating pod is worth a word.
OVERDUE_S = 30.0


def overdue(pod: Pod, now: dt.datetime) -> str:
    """A terminating pod well past its grace period: its kubelet is likely not there
    to finish it ("" while it is on its way out)."""
    deadline = pod.metadata.deletionTimestamp if pod.metadata else None
    if deadline is None or (now - deadline).total_seconds() < OVERDUE_S:
        return ""
    return "terminating past its grace period: is the node's kubelet running?"


def describe_pdb(pdb: PodDisruptionBudget) -> str:
    meta = pdb.metadata or ObjectMeta()
    status = pdb.status
    if status is None:
        return f"PodDisruptionBudget {meta.namespace}/{meta.name} (no status yet)"
    return (
        f"PodDisruptionBudget {meta.namespace}/{meta.name} allows "
        f"{status.disruptionsAllowed} disruptions: {status.currentHealthy} healthy, "
        f"{status.desiredHealthy} required"
    )


def pdb_blocker(pdbs: Sequence[PodDisruptionBudget], pod: Pod, refusal: str) -> str:
    """The budgets that refused the pod's eviction, by name and numbers."""
    labels = labels_of(pod)
    matching = [
        describe_pdb(p)
        for p in pdbs
        if p.spec is not None and selector_matches(p.spec.selector, labels)
    ]
    return "; ".join(matching) or f"eviction refused: {refusal}"


@dataclass
class DrainResult:
    evicted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # pod -> why it stays
    blockers: dict[str, str] = field(default_factory=dict)  # at the end (deadline)
    seen: dict[str, str] = field(default_factory=dict)  # every blocker met, last word per pod
    done: bool = False


@dataclass(frozen=True)
class DrainOptions:
    delete_emptydir_data: bool = False
    force: bool = False
    timeout_s: float = 1800.0
    retry_s: float = 5.0


# Pods that left are noticed this often, whatever the eviction retry interval.
POLL_S = 0.5


class _Drain:
    def __init__(self, ctx: Context, node: str, options: DrainOptions) -> None:
        self.ctx = ctx
        self.node = node
        self.options = options
        self.result = DrainResult()
        self.next_try: dict[str, float] = {}  # pod -> when to try its eviction again
        self.asked: set[str] = set()  # pods whose eviction was accepted (uid-fenced)

    def step(self, now: float) -> list[Pod]:
        """One look at the node: evict what is due; returns the pods still to go."""
        left: list[Pod] = []
        blockers: dict[str, str] = {}
        for pod in pods_on(self.ctx.client, self.node):
            key = pod_key(pod)
            why = skip_reason(pod)
            if why:
                self.result.skipped[key] = why
                continue
            left.append(pod)
            blocker = self._blocker(pod, key, now)
            if blocker:
                blockers[key] = blocker
        self.result.blockers = blockers
        self.result.seen.update(blockers)
        return left

    def _blocker(self, pod: Pod, key: str, now: float) -> str:
        meta = pod.metadata or ObjectMeta()
        if meta.deletionTimestamp is not None:
            return finalizer_blocker(pod) or overdue(pod, self.ctx.now())
        why = held_back(
            pod,
            delete_emptydir_data=self.options.delete_emptydir_data,
            force=self.options.force,
        )
        if why:
            return why
        if now < self.next_try.get(key, 0.0):
            return self.result.blockers.get(key, "")
        return self._evict(pod, key, now)

    def _evict(self, pod: Pod, key: str, now: float) -> str:
        meta = pod.metadata or ObjectMeta()
        eviction = Pod.Eviction(
            metadata=ObjectMeta(name=meta.name, namespace=meta.namespace),
            deleteOptions=DeleteOptions(preconditions=Preconditions(uid=meta.uid)),
        )
        try:
            self.ctx.client.create(eviction, name=meta.name or "", namespace=meta.namespace or "")
        except ApiError as err:
            code = err.status.code
            if code == 404 or (code == 409 and "UID" in str(err)):
                return ""  # gone already, or replaced by a new pod of the same name
            if code == 429 or (code == 500 and "disruption budget" in str(err).lower()):
                self.next_try[key] = now + self.options.retry_s
                pdbs = list(self.ctx.client.list(PodDisruptionBudget, namespace=meta.namespace))
                return pdb_blocker(pdbs, pod, str(err))
            raise
        if key not in self.asked:
            self.asked.add(key)
            self.result.evicted.append(key)
        return ""


def drain(
    ctx: Context,
    node: str,
    options: DrainOptions,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DrainResult:
    """Evict until the node is empty (done) or the deadline passes (blockers kept)."""
    work = _Drain(ctx, node, options)
    deadline = clock() + options.timeout_s
    shown: dict[str, str] = {}
    with Progress(
        TextColumn("draining {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("pods gone"),
        TimeElapsedColumn(),
        console=ctx.err,
        transient=True,
        disable=not ctx.err.is_terminal,
    ) as progress:
        task = progress.add_task(node, total=None)
        total = 0
        while True:
            left = work.step(clock())
            total = max(total, len(left))
            progress.update(task, total=total or 1, completed=total - len(left) if total else 1)
            if work.result.blockers != shown:
                shown = dict(work.result.blockers)
                _print_blockers(ctx, shown)
            if not left:
                work.result.done = True
                return work.result
            remaining = deadline - clock()
            if remaining <= 0:
                return work.result
            sleep(min(POLL_S, remaining))


def _print_blockers(ctx: Context, blockers: Mapping[str, str]) -> None:
    if not blockers:
        return
    ctx.err.print(Text(f"waiting on {len(blockers)} pod(s):", style="yellow"))
    for pod, why in sorted(blockers.items()):
        ctx.err.print(Text(f"  {pod}: {why}", style="yellow"))
