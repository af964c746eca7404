"""`gpuheal maintenance start | finish NODE`: take a GPU node out and bring it back.

start: one resourceVersion-guarded write marks the node (state label, taint,
cordon, reason, start time, the agent's error counters as a baseline), GPU
workloads are asked to checkpoint and given time to leave, then the node is
drained (drain.py). finish: the health gate with since = the start; only if it
passes, one guarded write removes what start added (and uncordons only if start
cordoned). Both are safe to run again after an interruption.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from gpuheal.clock import iso
from gpuheal.config import Config, url_origin, without_url_secrets
from gpuheal.kube.api import ApiError, node_path, pod_path
from gpuheal.kube.details import Pod
from gpuheal.kube.projections import NodeJson
from gpuheal.model import (
    CHECKPOINT_DONE,
    CHECKPOINT_REQUESTED,
    COUNTERS_SINCE,
    ECC_ERRORS,
    MAINTENANCE_BASELINE,
    MAINTENANCE_CORDONED,
    MAINTENANCE_REASON,
    MAINTENANCE_ROLLOUT,
    MAINTENANCE_SINCE,
    STATE_LABEL,
    STATE_MAINTENANCE,
    XID_ERRORS,
)
from gpuheal.ops import exitcodes
from gpuheal.ops.drain import DrainOptions, DrainResult, drain, pods_on, skip_reason
from gpuheal.ops.events import emit_node_event
from gpuheal.ops.findings import pod_key
from gpuheal.ops.fleet import claim_holders, pod_gpus, pod_live
from gpuheal.ops.gate import (
    GateReport,
    gate_exit_code,
    get_node,
    judge_node,
    maintenance_since,
)
from gpuheal.ops.output import Notes, Table
from gpuheal.values import label_text
from gpuheal.vocabulary import Reason

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

CONFLICT_RETRIES = 5
WEBHOOK_TIMEOUT_S = 5.0
MAINTENANCE_ANNOTATIONS = (
    MAINTENANCE_REASON,
    MAINTENANCE_SINCE,
    MAINTENANCE_BASELINE,
    MAINTENANCE_CORDONED,
    MAINTENANCE_ROLLOUT,
)


def baseline(annotations: Mapping[str, str]) -> tuple[str | None, str]:
    """The agent's error counters now, as MAINTENANCE_BASELINE's JSON; (None, why)
    when the agent reports none or they are unreadable."""
    if XID_ERRORS not in annotations and ECC_ERRORS not in annotations:
        return None, "the agent reports no error counters"
    try:
        xid = int(annotations.get(XID_ERRORS, "0"))
        ecc = int(annotations.get(ECC_ERRORS, "0"))
    except ValueError:
        return None, f"unreadable {XID_ERRORS}/{ECC_ERRORS}"
    since = annotations.get(COUNTERS_SINCE, "")
    return json.dumps({"xid": xid, "ecc": ecc, "since": since}, separators=(",", ":")), ""


_NODE = msgspec.json.Decoder(NodeJson)


def _taints(node: NodeJson) -> list[dict[str, Any]]:
    """The node's taints as written back: everyone else's exactly as read."""
    out = []
    for t in node.spec.taints:
        taint: dict[str, Any] = {"key": t.key, "effect": t.effect}
        if t.value:
            taint["value"] = t.value
        if t.timeAdded:
            taint["timeAdded"] = t.timeAdded
        out.append(taint)
    return out


def resumable(node: NodeJson) -> bool:
    """Put in maintenance by `start` (its label and its start time are there): a
    second `start` resumes it, keeping its start, baseline and reason. Stricter than
    policy/nodes.py's in_maintenance (the label alone): a label put on by hand has
    no start time to keep."""
    meta = node.metadata
    return (
        meta.labels.get(STATE_LABEL) == STATE_MAINTENANCE and MAINTENANCE_SINCE in meta.annotations
    )


def start_patch(
    node: NodeJson, reason: str, config: Config, now: dt.datetime, rollout: str = ""
) -> tuple[dict[str, Any], list[str]]:
    """The one write that puts the node in maintenance (resourceVersion-guarded), and
    warnings. Already in maintenance: its start, baseline and reason stay.
    `rollout`: the GPURollout taking the node out (MAINTENANCE_ROLLOUT)."""
    annotations = node.metadata.annotations
    warnings: list[str] = []
    resumed = resumable(node)
    cordoned = node.spec.unschedulable
    notes: dict[str, str | None] = {}
    if not resumed:
        notes[MAINTENANCE_REASON] = reason
        notes[MAINTENANCE_SINCE] = iso(now, "seconds")
        counters, why = baseline(annotations)
        notes[MAINTENANCE_BASELINE] = counters
        if counters is None and why.startswith("unreadable"):
            warnings.append(f"no error-counter baseline recorded: {why}")
        # Cordoned by someone else before us: theirs to undo, not finish's.
        notes[MAINTENANCE_CORDONED] = None if cordoned else "true"
    elif not cordoned:
        notes[MAINTENANCE_CORDONED] = "true"  # uncordoned meanwhile: we cordon it again
    if rollout:
        notes[MAINTENANCE_ROLLOUT] = rollout
    key, effect = config.maintenance.taint_key, config.maintenance.taint_effect
    taints = [t for t in _taints(node) if t["key"] != key]
    # The maintenance taint's value says why, for people: readable, not an identity.
    value = label_text(annotations.get(MAINTENANCE_REASON, reason) if resumed else reason)
    taints.append({"key": key, "effect": effect, **({"value": value} if value else {})})
    patch = {
        "metadata": {
            "resourceVersion": node.metadata.resourceVersion,
            "labels": {STATE_LABEL: STATE_MAINTENANCE},
            "annotations": notes,
        },
        "spec": {"taints": taints, "unschedulable": True},
    }
    return patch, warnings


def leftovers(node: NodeJson, config: Config) -> list[str]:
    """What maintenance left on a node (its label, taint, annotations)."""
    found = []
    if node.metadata.labels.get(STATE_LABEL) == STATE_MAINTENANCE:
        found.append(f"label {STATE_LABEL}={STATE_MAINTENANCE}")
    if any(t.key == config.maintenance.taint_key for t in node.spec.taints):
        found.append(f"taint {config.maintenance.taint_key}")
    annotations = node.metadata.annotations
    found += [f"annotation {k}" for k in MAINTENANCE_ANNOTATIONS if k in annotations]
    return found


def finish_patch(node: NodeJson, config: Config) -> tuple[dict[str, Any], bool]:
    """The one write that returns the node; True if it uncordons."""
    uncordon = node.metadata.annotations.get(MAINTENANCE_CORDONED) == "true"
    metadata: dict[str, Any] = {
        "resourceVersion": node.metadata.resourceVersion,
        "annotations": dict.fromkeys(MAINTENANCE_ANNOTATIONS),
    }
    if node.metadata.labels.get(STATE_LABEL) == STATE_MAINTENANCE:
        metadata["labels"] = {STATE_LABEL: None}
    spec: dict[str, Any] = {
        "taints": [t for t in _taints(node) if t["key"] != config.maintenance.taint_key]
    }
    if uncordon:
        spec["unschedulable"] = False
    return {"metadata": metadata, "spec": spec}, uncordon


def not_managed(name: str, why: str) -> str:
    """The refusal of maintenance on a node gpuheal does not manage (ops/fleet.py::
    why_unmanaged says why): the CLI's and the controller's words."""
    return (
        f"node {name} is not managed by gpuheal: {why}; maintenance and roll-outs act "
        "only on the nodes the controller manages (its nodeSelector, not opted out)"
    )


class WriteError(Exception):
    """The node could not be written (deleted meanwhile, endless conflicts)."""


async def guarded_write(
    ctx: Context, name: str, node: NodeJson, build: Callable[[NodeJson], dict[str, Any]]
) -> NodeJson:
    """Merge-patch under optimistic concurrency (the resourceVersion in the patch):
    on 409 read the node again and rebuild."""
    for _ in range(CONFLICT_RETRIES):
        try:
            return _NODE.decode(await ctx.api.patch(node_path(name), build(node)))
        except ApiError as err:
            if err.code != 409:
                raise
        fresh = await get_node(ctx.api, name)
        if fresh is None:
            raise WriteError(f"node {name} was deleted")
        node = fresh
    raise WriteError(f"node {name} kept changing: {CONFLICT_RETRIES} writes in a row conflicted")


# -- checkpoint --------------------------------------------------------------------------


async def gpu_pods(ctx: Context, node: str) -> list[Pod]:
    """The node's GPU workloads (what is asked to checkpoint and waited for): those
    asking for a GPU resource, and those holding a DRA GPU through a claim."""
    pods = [p for p in await pods_on(ctx.api, node) if not skip_reason(p) and pod_live(p)]
    claiming = [p for p in pods if p.spec.resourceClaims]
    drivers = frozenset(ctx.config.gpu_drivers)
    held = await claim_holders(ctx.api, claiming, drivers) if claiming else set()
    return [p for p in pods if pod_gpus(p, ctx.config) > 0 or pod_key(p) in held]


@dataclass
class CheckpointResult:
    mode: str
    deadline: str = ""
    asked: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # still there, said done (CHECKPOINT_DONE)
    webhook: str = ""  # "ok" | what went wrong


async def request_checkpoint(
    ctx: Context, node: str, reason: str, mode: str, wait_s: float
) -> CheckpointResult:
    pods = await gpu_pods(ctx, node)
    result = CheckpointResult(mode=mode, asked=[pod_key(p) for p in pods])
    if mode == "none" or not pods:
        return result
    result.deadline = iso(ctx.now() + dt.timedelta(seconds=wait_s), "seconds")
    if mode == "annotate":
        # A pod asked already keeps its deadline (a resumed start, a roll-out's next
        # pass): the workload may be checkpointing to it, and the controller's pod
        # policy lets no request be changed.
        unasked = [p for p in pods if CHECKPOINT_REQUESTED not in p.metadata.annotations]
        await asyncio.gather(*(_ask(ctx, p, result.deadline) for p in unasked))
    else:
        result.webhook = await _call_webhook(ctx, node, reason, result.deadline, pods)
    return result


async def _ask(ctx: Context, pod: Pod, deadline: str) -> None:
    """The checkpoint request, on the pod itself (its own workload reads it)."""
    patch = {"metadata": {"annotations": {CHECKPOINT_REQUESTED: deadline}}}
    try:
        await ctx.api.patch(pod_path(pod.metadata.namespace, pod.metadata.name), patch)
    except ApiError as err:
        if err.code != 404:  # gone meanwhile: nothing to ask
            raise


async def _call_webhook(
    ctx: Context, node: str, reason: str, deadline: str, pods: Sequence[Pod]
) -> str:
    """One POST; "ok", or what went wrong (a warning: the wait goes on regardless).
    The shell's proxy variables are honoured; no redirect is followed (the pods'
    names go to the URL configured, nowhere else)."""
    url = ctx.config.maintenance.checkpoint_webhook_url
    body = {
        "node": node,
        "reason": reason,
        "deadline": deadline,
        "pods": [
            {"namespace": p.metadata.namespace, "name": p.metadata.name, "uid": p.metadata.uid}
            for p in pods
        ],
    }
    timeout = aiohttp.ClientTimeout(total=WEBHOOK_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, trust_env=True) as http,
            http.post(url, json=body, allow_redirects=False) as response,
        ):
            status, said = response.status, response.reason or ""
        why = "" if status < 300 else f"HTTP {status} {said}".rstrip()
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        why = str(err) or type(err).__name__
    if not why:
        return "ok"
    # The URL is a secret (its path or query often is): its host only.
    why = f"checkpoint webhook {url_origin(url)} failed: {without_url_secrets(why, url)}"
    ctx.err.print(Text(f"warning: {why}; waiting for the GPU pods anyway", style="yellow"))
    return why


async def wait_gpu_pods_gone(
    ctx: Context,
    node: str,
    result: CheckpointResult,
    wait_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Give the GPU pods up to `wait_s` to leave on their own or say their checkpoint
    is done (then the drain moves them at once), with a progress bar."""
    total = len(result.asked)
    if result.mode == "none" or total == 0 or wait_s <= 0:
        return
    deadline = clock() + wait_s
    with Progress(
        TextColumn("GPU pods gone or done"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=ctx.err,
        transient=True,
        disable=not ctx.err.is_terminal,
    ) as progress:
        task = progress.add_task("checkpoint", total=total)
        while True:
            pods = await gpu_pods(ctx, node)
            left = {pod_key(p) for p in pods}
            said = {pod_key(p) for p in pods if CHECKPOINT_DONE in p.metadata.annotations}
            result.gone = [k for k in result.asked if k not in left]
            result.done = [k for k in result.asked if k in said]
            progress.update(task, completed=len(result.gone) + len(result.done))
            remaining = deadline - clock()
            if not (left - said) & set(result.asked) or remaining <= 0:
                return
            await sleep(min(1.0, remaining))


# -- start -----------------------------------------------------------------------------


@dataclass
class StartReport:
    node: str
    reason: str
    since: str
    resumed: bool
    cordoned_by_us: bool
    checkpoint: CheckpointResult
    drain: DrainResult | None  # None: --no-drain
    warnings: list[str] = field(default_factory=list)

    @property
    def result(self) -> str:
        if self.drain is None:
            return "marked"
        return "drained" if self.drain.done else "timed-out"

    def data(self) -> dict[str, Any]:
        d = self.drain
        return {
            "node": self.node,
            "reason": self.reason,
            "since": self.since,
            "resumed": self.resumed,
            "cordonedByUs": self.cordoned_by_us,
            "result": self.result,
            "checkpoint": {
                "mode": self.checkpoint.mode,
                "deadline": self.checkpoint.deadline or None,
                "asked": self.checkpoint.asked,
                "gone": self.checkpoint.gone,
                "done": self.checkpoint.done,
                "webhook": self.checkpoint.webhook or None,
            },
            "drained": d.done if d else None,
            "evicted": d.evicted if d else [],
            "skipped": [{"pod": k, "why": v} for k, v in sorted(d.skipped.items())] if d else [],
            "blockers": [{"pod": k, "reason": v} for k, v in sorted(d.blockers.items())]
            if d
            else [],
            "blockersSeen": [{"pod": k, "reason": v} for k, v in sorted(d.seen.items())]
            if d
            else [],
            "warnings": self.warnings,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> StartReport:
        """The report again, from its data() (the controller's record of a request)."""
        cp = data.get("checkpoint") or {}
        drain = None
        if data.get("drained") is not None:
            drain = DrainResult(
                evicted=list(data.get("evicted", [])),
                skipped={s["pod"]: s["why"] for s in data.get("skipped", [])},
                blockers={b["pod"]: b["reason"] for b in data.get("blockers", [])},
                seen={b["pod"]: b["reason"] for b in data.get("blockersSeen", [])},
                done=bool(data["drained"]),
            )
        return cls(
            node=data.get("node", ""),
            reason=data.get("reason", ""),
            since=data.get("since", ""),
            resumed=bool(data.get("resumed")),
            cordoned_by_us=bool(data.get("cordonedByUs")),
            checkpoint=CheckpointResult(
                mode=cp.get("mode", "none"),
                deadline=cp.get("deadline") or "",
                asked=list(cp.get("asked", [])),
                gone=list(cp.get("gone", [])),
                done=list(cp.get("done", [])),
                webhook=cp.get("webhook") or "",
            ),
            drain=drain,
            warnings=list(data.get("warnings", [])),
        )

    def views(self) -> Sequence[Table | Notes]:
        lines: list[tuple[str, str]] = [
            ("", f"reason: {self.reason}"),
            ("", f"in maintenance since {self.since}" + (" (resumed)" if self.resumed else "")),
        ]
        lines += [("warn", w) for w in self.warnings]
        cp = self.checkpoint
        if cp.mode != "none" and cp.asked:
            lines.append(
                (
                    "",
                    f"checkpoint ({cp.mode}): {len(cp.gone)}/{len(cp.asked)} GPU pods left, "
                    f"{len(cp.done)} said done",
                )
            )
        d = self.drain
        if d is None:
            lines.append(("warn", "not drained (--no-drain)"))
            return (Notes(f"Maintenance: {self.node}", lines),)
        if d.done:
            lines.append(("ok", f"drained: {len(d.evicted)} pod(s) evicted"))
        else:
            lines.append(("bad", f"drain deadline passed: {len(d.blockers)} pod(s) still there"))
        views: list[Table | Notes] = [Notes(f"Maintenance: {self.node}", lines)]
        views.append(Table("Evicted", ("POD",), [(p,) for p in d.evicted]))
        views.append(
            Table("Left in place", ("POD", "WHY"), sorted(d.skipped.items()), empty="nothing")
        )
        shown = d.blockers if not d.done else d.seen
        title = "Blocking the drain" if not d.done else "Blocked the drain for a while"
        views.append(Table(title, ("POD", "WHAT BLOCKS"), sorted(shown.items())))
        return views


@dataclass(frozen=True)
class TakeOut:
    """How `maintenance start` (or a roll-out) takes a node out."""

    reason: str
    checkpoint: str | None = None  # None: config maintenance.checkpoint
    checkpoint_wait_s: float | None = None  # None: config
    drain: bool = True
    drain_timeout_s: float | None = None  # None: config
    delete_emptydir_data: bool = False
    force: bool = False
    rollout: str = ""  # the GPURollout doing it


async def take_out(ctx: Context, node: NodeJson, how: TakeOut) -> StartReport | None:
    """Mark, checkpoint, drain: safe to run again (a node already in maintenance
    resumes, a drained one has nothing left to evict). None once a failed write is
    said on stderr."""
    name = node.metadata.name
    config = ctx.config.maintenance
    resumed = resumable(node)
    warnings: list[str] = []

    def build(current: NodeJson) -> dict[str, Any]:
        patch, found = start_patch(current, how.reason, ctx.config, ctx.now(), how.rollout)
        warnings[:] = found
        return patch

    try:
        node = await guarded_write(ctx, name, node, build)
    except WriteError as err:
        ctx.err.print(Text(f"gpuheal maintenance start: {err}", style="bold red"))
        return None
    for warning in warnings:
        ctx.err.print(Text(f"warning: {warning}", style="yellow"))
    annotations = node.metadata.annotations
    reason = annotations.get(MAINTENANCE_REASON, how.reason)
    if not resumed:
        await emit_node_event(
            ctx,
            node,
            reason=Reason.MAINTENANCE_STARTED,
            note=f"maintenance started: {reason}",
            action="Maintenance",
        )
    mode = how.checkpoint or config.checkpoint
    if mode == "webhook" and not config.checkpoint_webhook_url:
        warnings.append("checkpoint webhook: maintenance.checkpointWebhookUrl is not set")
        mode = "none"
    wait_s = (
        config.checkpoint_wait_seconds if how.checkpoint_wait_s is None else how.checkpoint_wait_s
    )
    checkpoint = await request_checkpoint(ctx, name, reason, mode, wait_s)
    await wait_gpu_pods_gone(ctx, name, checkpoint, wait_s)
    drained = None
    if how.drain:
        options = DrainOptions(
            delete_emptydir_data=how.delete_emptydir_data,
            force=how.force,
            timeout_s=config.drain_timeout_seconds
            if how.drain_timeout_s is None
            else how.drain_timeout_s,
            retry_s=config.eviction_retry_seconds,
        )
        drained = await drain(ctx, name, options)
    return StartReport(
        node=name,
        reason=reason,
        since=annotations.get(MAINTENANCE_SINCE, ""),
        resumed=resumed,
        cordoned_by_us=annotations.get(MAINTENANCE_CORDONED) == "true",
        checkpoint=checkpoint,
        drain=drained,
        warnings=warnings,
    )


@dataclass(frozen=True)
class Carried:
    """A maintenance request carried out: the command's exit code, its report (what
    `-o json` prints: StartReport's or GateReport's data, or {"error": why}), and
    whether the last node write recorded it already (`also`)."""

    code: int
    report: Mapping[str, Any]
    recorded: bool = False


# The annotations the last node write of a finish adds (the controller's record of
# the request), from the node as written, the exit code and the report.
Also = Callable[[NodeJson, int, Mapping[str, Any]], Mapping[str, str | None]]


async def carry_out_start(ctx: Context, node: NodeJson, how: TakeOut) -> Carried:
    """`maintenance start`, as the controller carries out the request: take_out,
    then the exit code and the report."""
    report = await take_out(ctx, node, how)
    if report is None:
        return Carried(exitcodes.ERROR, {"error": f"node {node.metadata.name} was not written"})
    timed_out = report.drain is not None and not report.drain.done
    return Carried(exitcodes.TIMED_OUT if timed_out else exitcodes.OK, report.data())


async def carry_out_finish(
    ctx: Context, node: NodeJson, *, validate: bool = False, also: Also | None = None
) -> Carried:
    """`maintenance finish`: the health gate with since = the start; only if it
    passes, one guarded write removes what start added (and `also`'s annotations
    join that write, so the return and its record are one)."""
    name = node.metadata.name
    left = leftovers(node, ctx.config)
    if not left:
        return Carried(
            exitcodes.USAGE, {"error": f"node {name} is not in maintenance; nothing to finish"}
        )
    since = maintenance_since(node.metadata.annotations, ctx)
    result = await judge_node(ctx, node, since, validate=validate)
    if not result.passed:
        await emit_node_event(
            ctx,
            node,
            reason=Reason.GATE_FAILED,
            note=f"maintenance finish refused, node stays out: {result.summary()}",
            action="Gate",
            warning=True,
        )
        outcome = "nothing changed: the node stays in maintenance"
        report = GateReport(result, since, outcome, finished=False).data()
        return Carried(gate_exit_code(result), report)
    written_report: dict[str, Any] = {}

    def build(current: NodeJson) -> dict[str, Any]:
        patch, uncordon = finish_patch(current, ctx.config)
        outcome = f"returned to service: removed {', '.join(left)}"
        if uncordon:
            outcome += "; uncordoned"
        elif current.spec.unschedulable:
            outcome += "; left cordoned (it was cordoned before maintenance began)"
        written_report.clear()
        written_report.update(GateReport(result, since, outcome, finished=True).data())
        if also is not None:
            patch["metadata"]["annotations"].update(also(current, exitcodes.OK, written_report))
        return patch

    try:
        written = await guarded_write(ctx, name, node, build)
    except WriteError as err:
        return Carried(exitcodes.ERROR, {"error": f"node {name} was not returned: {err}"})
    await emit_node_event(
        ctx,
        written,
        reason=Reason.MAINTENANCE_FINISHED,
        note=f"maintenance finished: {written_report['outcome']}",
        action="Maintenance",
    )
    return Carried(exitcodes.OK, written_report, recorded=also is not None)
