"""Drain a node the way `kubectl drain` does, and say what blocks it.

Every pod but DaemonSet pods, mirror pods and finished pods goes through the
Eviction API (never a DELETE), so PodDisruptionBudgets hold. Pods that would
lose data (emptyDir) or never come back (no controller) stay unless the
operator says otherwise. Until the deadline, refused evictions are retried and
what stands in the way is named: the PodDisruptionBudget and its numbers, the
finalizer, the flag to pass.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from gpuheal.kube.api import ApiError, KubeApi, pod_path
from gpuheal.kube.details import Pod, PodDisruptionBudget
from gpuheal.kube.paging import each_page
from gpuheal.kube.snapshot import ALL_PODS, LIST_PAGE, list_all
from gpuheal.ops.cluster import is_mirror_pod, labels_of, owner_kind
from gpuheal.ops.findings import pod_key
from gpuheal.ops.fleet import pod_live
from gpuheal.ops.scheduling import selector_matches

if TYPE_CHECKING:
    from gpuheal.ops.context import Context


class _More(msgspec.Struct):
    token: str = msgspec.field(default="", name="continue")


class _Pods(msgspec.Struct):
    metadata: _More = msgspec.field(default_factory=_More)
    items: list[Pod] | None = None  # null in an empty list


_PODS = msgspec.json.Decoder(_Pods)


async def pods_on(api: KubeApi, node: str) -> list[Pod]:
    """Every pod bound to the node, in every namespace, in pages. A pod that cannot be
    read fails the command (msgspec.DecodeError), unlike the read commands' lists
    that skip it: the drain would not see it, and call the node drained with it there."""
    params = {"limit": str(LIST_PAGE), "fieldSelector": f"spec.nodeName={node}"}
    pods: list[Pod] = []

    def take(raw: bytes) -> str:
        page = _PODS.decode(raw)
        pods.extend(page.items or ())
        return page.metadata.token

    await each_page(api, ALL_PODS, params, take)
    return pods


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
    local = [v.name for v in pod.spec.volumes if v.emptyDir is not None]
    if local and not delete_emptydir_data:
        return f"local storage: emptyDir volume {', '.join(local)} (pass --delete-emptydir-data)"
    if not owner_kind(pod) and not force:
        return "not managed by a controller (pass --force)"
    return ""


def finalizer_blocker(pod: Pod) -> str:
    """A pod being deleted that stays: its finalizers ("" if it has none)."""
    meta = pod.metadata
    if meta.deletionTimestamp is None or not meta.finalizers:
        return ""
    return f"being deleted, held by finalizer {', '.join(meta.finalizers)}"


# Past its deletion deadline by this much, a terminating pod is worth a word.
OVERDUE_S = 30.0


def overdue(pod: Pod, now: dt.datetime) -> str:
    """A terminating pod well past its grace period: its kubelet is likely not there
    to finish it ("" while it is on its way out)."""
    deadline = pod.metadata.deletionTimestamp
    if deadline is None or (now - deadline).total_seconds() < OVERDUE_S:
        return ""
    return "terminating past its grace period: is the node's kubelet running?"


def describe_pdb(pdb: PodDisruptionBudget) -> str:
    meta, status = pdb.metadata, pdb.status
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
    matching = [describe_pdb(p) for p in pdbs if selector_matches(p.spec.selector, labels)]
    return "; ".join(matching) or f"eviction refused: {refusal}"


def refusal(err: ApiError) -> str:
    """What the API server said when it refused an eviction: its causes (a budget's
    "The disruption budget train needs 2 healthy pods and has 2 currently"), else
    its message."""
    return "; ".join(c.message for c in err.causes if c.message) or err.message


def eviction(pod: Pod) -> dict[str, object]:
    """A policy/v1 Eviction, fenced by the pod's UID: a new pod of the same name
    (its controller's replacement) is not evicted by a retry meant for the old one."""
    meta = pod.metadata
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": meta.name, "namespace": meta.namespace},
        "deleteOptions": {"preconditions": {"uid": meta.uid}},
    }


def pdb_path(namespace: str) -> str:
    return f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"


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


# Pods that leave are noticed this often while the drain is moving.
POLL_S = 0.5


def next_look_s(waited_s: float, moved: bool, retry_due_s: float | None, cap_s: float) -> float:
    """How long the drain waits before it looks at the node again. POLL_S while it
    moves (a pod left, a blocker changed); while nothing does, twice the last wait
    up to `cap_s` (the eviction retry interval, at least POLL_S): the controller
    carries drains out, and one held for half an hour by a budget or a finalizer
    would otherwise list the node's pods twice a second throughout. Never past the
    moment a refused eviction is due again (`retry_due_s` from now)."""
    wait_s = POLL_S if moved else min(max(waited_s * 2, POLL_S), max(cap_s, POLL_S))
    if retry_due_s is not None:
        wait_s = min(wait_s, max(retry_due_s, 0.0))
    return max(wait_s, 0.01)


class _Drain:
    def __init__(self, ctx: Context, node: str, options: DrainOptions) -> None:
        self.ctx = ctx
        self.node = node
        self.options = options
        self.result = DrainResult()
        self.next_try: dict[str, float] = {}  # pod -> when to try its eviction again
        self.asked: set[str] = set()  # pods whose eviction was accepted (uid-fenced)
        # A step's budgets per namespace, read once for all the pods they refused.
        self.pdbs: dict[str, list[PodDisruptionBudget]] = {}

    async def step(self, now: float) -> list[Pod]:
        """One look at the node: evict what is due; returns the pods still to go."""
        left: list[Pod] = []
        blockers: dict[str, str] = {}
        self.pdbs = {}
        for pod in await pods_on(self.ctx.api, self.node):
            key = pod_key(pod)
            why = skip_reason(pod)
            if why:
                self.result.skipped[key] = why
                continue
            left.append(pod)
            blocker = await self._blocker(pod, key, now)
            if blocker:
                blockers[key] = blocker
        self.result.blockers = blockers
        self.result.seen.update(blockers)
        return left

    async def _blocker(self, pod: Pod, key: str, now: float) -> str:
        if pod.metadata.deletionTimestamp is not None:
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
        return await self._evict(pod, key, now)

    async def _evict(self, pod: Pod, key: str, now: float) -> str:
        meta = pod.metadata
        try:
            await self.ctx.api.create(
                f"{pod_path(meta.namespace, meta.name)}/eviction", eviction(pod)
            )
        except ApiError as err:
            if err.code == 404 or (err.code == 409 and "UID" in err.message):
                return ""  # gone already, or replaced by a new pod of the same name
            # 500: more than one budget selects the pod, which the Eviction API refuses.
            if err.code == 429 or (err.code == 500 and "disruption budget" in err.message.lower()):
                self.next_try[key] = now + self.options.retry_s
                return pdb_blocker(await self._budgets(meta.namespace), pod, refusal(err))
            raise
        if key not in self.asked:
            self.asked.add(key)
            self.result.evicted.append(key)
        return ""

    async def _budgets(self, namespace: str) -> list[PodDisruptionBudget]:
        if namespace not in self.pdbs:
            self.pdbs[namespace] = await list_all(
                self.ctx.api, pdb_path(namespace), PodDisruptionBudget, "PodDisruptionBudget"
            )
        return self.pdbs[namespace]


async def drain(
    ctx: Context,
    node: str,
    options: DrainOptions,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
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
        looked: tuple[frozenset[str], dict[str, str]] | None = None
        wait_s = POLL_S
        while True:
            left = await work.step(clock())
            keys = frozenset(pod_key(p) for p in left)
            moved = looked != (keys, work.result.blockers)
            looked = (keys, dict(work.result.blockers))
            total = max(total, len(left))
            progress.update(task, total=total or 1, completed=total - len(left) if total else 1)
            if work.result.blockers != shown:
                shown = dict(work.result.blockers)
                _print_blockers(ctx, shown)
            if not left:
                work.result.done = True
                return work.result
            now = clock()
            remaining = deadline - now
            if remaining <= 0:
                return work.result
            # A pod's retry time stays once its eviction is accepted: only those ahead count.
            due = [t - now for k in keys if (t := work.next_try.get(k, 0.0)) > now]
            wait_s = next_look_s(wait_s, moved, min(due, default=None), options.retry_s)
            await sleep(min(wait_s, remaining))


def _print_blockers(ctx: Context, blockers: Mapping[str, str]) -> None:
    if not blockers:
        return
    ctx.err.print(Text(f"waiting on {len(blockers)} pod(s):", style="yellow"))
    for pod, why in sorted(blockers.items()):
        ctx.err.print(Text(f"  {pod}: {why}", style="yellow"))
