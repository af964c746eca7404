"""`gpuheal rollout start | status | pause | resume | abort POOL`: a driver (or any
node change) across a GPU pool, the canary first, then batch by batch.

The roll-out lives in the cluster, as a GPURollout named after the pool
(policy/rollout.py's rollout_name): creating it is the one-per-pool lock, and its
status is the whole memory (each node's step, the phase, the CLI driving it).
The CLI drives it level-triggered: each pass reads the object and the pool's
nodes, advances every node in flight one step, takes the next nodes out within
the budget, and writes the status under its resourceVersion. A step is written
before it is acted on and every action is safe to repeat (maintenance start on a
node already in maintenance resumes it; a drained node has nothing to evict), so a
CLI killed anywhere and run again (`resume`) carries on, draining no node twice.
The lease in status.driver keeps two CLIs from driving at once.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import aiohttp
from rich.text import Text

from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.kube.api import ApiError, gpurollout_path, node_path
from gpuheal.kube.projections import NodeJson
from gpuheal.kube.rollouts import (
    DEFAULT_LEASE_S,
    RolloutJson,
    decode,
    progress_of,
    read_rollout,
    state_of,
)
from gpuheal.kube.snapshot import list_all
from gpuheal.model import (
    DRIVER_UPGRADE_ENABLED,
    DRIVER_UPGRADE_STATE,
    GPUFAULT_API_VERSION,
    GPUROLLOUT_KIND,
    MAINTENANCE_SINCE,
    TAINT_KEY,
)
from gpuheal.ops import exitcodes
from gpuheal.ops.events import emit_node_event
from gpuheal.ops.fleet import gpu_node, node_ready, node_selector_query
from gpuheal.ops.gate import judge_node
from gpuheal.ops.maintenance import (
    TakeOut,
    WriteError,
    finish_patch,
    guarded_write,
    leftovers,
    take_out,
)
from gpuheal.ops.output import Notes, Table, render
from gpuheal.policy.breaker import quarantine_capacity
from gpuheal.policy.nodes import in_maintenance
from gpuheal.policy.operator import AUTO_UPGRADE_SETTING, driver_upgrade, upgrades_managed
from gpuheal.policy.pools import pool_of
from gpuheal.policy.rollout import (
    FINAL,
    IN_FLIGHT,
    Budget,
    NodeProgress,
    Phase,
    RolloutStep,
    Target,
    allowed_unavailable,
    counts,
    next_to_start,
    plan_order,
    rollout_name,
)
from gpuheal.values import text
from gpuheal.vocabulary import Reason

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

CONFLICT_RETRIES = 10
DEFAULT_POLL_S = 2.0


def _fail(ctx: Context, verb: str, why: str) -> None:
    ctx.err.print(Text(f"gpuheal rollout {verb}: {why}", style="bold red"))


# -- reading ---------------------------------------------------------------------------


async def gpu_nodes(ctx: Context) -> list[NodeJson]:
    """Every GPU node now (the controller's nodeSelector, as `status` reads it)."""
    config = ctx.config
    nodes = await list_all(
        ctx.api, node_path(), NodeJson, "Node", label_selector=node_selector_query(config)
    )
    return [n for n in nodes if gpu_node(n, config)]


def in_pool(nodes: Sequence[NodeJson], pool: str, config: Config) -> dict[str, NodeJson]:
    return {n.metadata.name: n for n in nodes if pool_of(n.metadata.labels, config) == pool}


def out_of_service(node: NodeJson) -> bool:
    """Unavailable to workloads, whatever the cause: a fault's taint, maintenance,
    a cordon, not Ready."""
    return (
        any(t.key == TAINT_KEY for t in node.spec.taints)
        or in_maintenance(node.metadata.labels)
        or node.spec.unschedulable
        or node_ready(node) is not True
    )


def budget_of(
    rollout: RolloutJson,
    fleet: Sequence[NodeJson],
    progress: Sequence[NodeProgress],
    config: Config,
) -> Budget:
    """The pool's and the fleet's room, counting every node out for any reason and
    the roll-out's own nodes in flight (recorded before their cordon lands)."""
    spec = rollout.spec
    in_flight = {p.name for p in progress if p.step in IN_FLIGHT}
    pool = in_pool(fleet, spec.pool, config)
    pool_out = {name for name, n in pool.items() if out_of_service(n)} | in_flight
    # The breaker's count: faults and maintenance, fleet-wide (cordons and NotReady
    # it does not count).
    fleet_out = {
        n.metadata.name
        for n in fleet
        if any(t.key == TAINT_KEY for t in n.spec.taints) or in_maintenance(n.metadata.labels)
    } | in_flight
    return Budget(
        pool_unavailable=frozenset(pool_out),
        pool_allowed=allowed_unavailable(
            len(progress), spec.maxUnavailable, spec.maxUnavailablePercent
        ),
        fleet_unavailable=len(fleet_out),
        fleet_allowed=quarantine_capacity(len(fleet), config),
    )


# -- writing the status ------------------------------------------------------------------


def _progress_json(progress: Sequence[NodeProgress]) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "batch": p.batch,
            "step": p.step.value,
            **({"since": p.since} if p.since else {}),
            **({"detail": text(p.detail, 1024)} if p.detail else {}),
        }
        for p in progress
    ]


Mutation = Callable[[RolloutJson], dict[str, Any] | None]


async def update_status(ctx: Context, name: str, mutate: Mutation) -> RolloutJson | None:
    """A resourceVersion-guarded merge patch of the status, `mutate` building it from
    the object as read (None: nothing to write); on 409 read again and rebuild.
    Returns the object as written (or as read when nothing was), None when gone."""
    for _ in range(CONFLICT_RETRIES):
        current = await read_rollout(ctx.api, name)
        if current is None:
            return None
        status = mutate(current)
        if status is None:
            return current
        body = {"metadata": {"resourceVersion": current.metadata.resourceVersion}, "status": status}
        try:
            return decode(await ctx.api.patch(gpurollout_path(name, status=True), body))
        except ApiError as err:
            if err.code != 409:
                raise
    raise WriteError(f"GPURollout {name} kept changing: {CONFLICT_RETRIES} writes conflicted")


def _summary(progress: Sequence[NodeProgress]) -> dict[str, Any]:
    return {"total": len(progress), "done": counts(progress)[RolloutStep.DONE]}


# -- start -------------------------------------------------------------------------------


def _pairs(values: Sequence[str] | None, what: str) -> dict[str, str]:
    out = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} {item!r} is not KEY=VALUE")
        out[key] = value
    return out


def _bad_numbers(args: argparse.Namespace) -> str:
    """What is wrong with the numbers given ("" when nothing), before the API
    server says it less plainly."""
    checks = (
        (args.canary >= 0, "--canary must be 0 or more"),
        (args.batch_size >= 1, "--batch-size must be 1 or more"),
        (args.max_unavailable >= 1, "--max-unavailable must be 1 or more"),
        (
            args.max_unavailable_percent is None or 0 <= args.max_unavailable_percent <= 100,
            "--max-unavailable-percent must be between 0 and 100",
        ),
        (args.change_timeout >= 0 and args.gate_timeout >= 0, "timeouts must be 0 or more"),
        (1 <= args.lease <= 3600, "--lease must be between 1 and 3600 seconds"),
    )
    return "; ".join(why for ok, why in checks if not ok)


async def start(ctx: Context, args: argparse.Namespace) -> int:
    pool: str = args.pool
    try:
        target = Target(
            driver_version=args.driver_version or "",
            labels=_pairs(args.label, "--label"),
            annotations=_pairs(args.annotation, "--annotation"),
        )
    except ValueError as err:
        _fail(ctx, "start", str(err))
        return exitcodes.USAGE
    if not target.describe():
        _fail(
            ctx,
            "start",
            "say what the nodes must report: --driver-version, --label or --annotation",
        )
        return exitcodes.USAGE
    wrong = _bad_numbers(args)
    if wrong:
        _fail(ctx, "start", wrong)
        return exitcodes.USAGE
    nodes = in_pool(await gpu_nodes(ctx), pool, ctx.config)
    refused = _pool_refused(pool, nodes, ctx.config)
    if refused is not None:
        _fail(ctx, "start", refused[0])
        return refused[1]
    name = rollout_name(pool)
    spec: dict[str, Any] = {
        "pool": pool,
        "reason": text(args.reason, 256),
        "target": {
            **({"driverVersion": target.driver_version} if target.driver_version else {}),
            **({"labels": dict(target.labels)} if target.labels else {}),
            **({"annotations": dict(target.annotations)} if target.annotations else {}),
        },
        "canary": args.canary,
        "batchSize": args.batch_size,
        "maxUnavailable": args.max_unavailable,
        "changeTimeoutSeconds": args.change_timeout,
        "gateTimeoutSeconds": args.gate_timeout,
        "leaseSeconds": args.lease,
        "validate": args.validate,
    }
    if args.max_unavailable_percent is not None:
        spec["maxUnavailablePercent"] = args.max_unavailable_percent
    body = {
        "apiVersion": GPUFAULT_API_VERSION,
        "kind": GPUROLLOUT_KIND,
        "metadata": {"name": name},
        "spec": spec,
    }
    try:
        await ctx.api.create(gpurollout_path(), body)
    except ApiError as err:
        if err.code != 409:
            raise
        existing = await read_rollout(ctx.api, name)
        phase = existing.status.phase if existing is not None else "?"
        _fail(
            ctx,
            "start",
            f"pool {pool} already has a roll-out ({name}, phase {phase or 'starting'}): "
            f"see `gpuheal rollout status {pool}`; `resume` drives it, and a finished or "
            f"aborted one must be deleted (kubectl delete gpurollout {name}) before another",
        )
        return exitcodes.USAGE
    return await drive(ctx, name, _drive_options(args))


def _pool_refused(
    pool: str, nodes: Mapping[str, NodeJson], config: Config
) -> tuple[str, int] | None:
    """Why the pool is not rolled out by gpuheal, with the exit code: it has no GPU
    node, or gpu-operator upgrades its drivers itself (policy/operator.py): two
    drivers of one node's drain and return would race."""
    if not nodes:
        return f"pool {pool} has no GPU nodes (label {config.pools.label})", exitcodes.NOT_FOUND
    managed = sorted(
        n
        for n, node in nodes.items()
        if upgrades_managed(node.metadata.labels, node.metadata.annotations)
    )
    if not managed:
        return None
    why = (
        f"pool {pool}: gpu-operator upgrades the driver of {len(managed)} of its "
        f"{len(nodes)} nodes itself ({DRIVER_UPGRADE_ENABLED}=true or {DRIVER_UPGRADE_STATE} "
        f"on {managed[0]}): roll out through gpu-operator, or turn {AUTO_UPGRADE_SETTING} "
        "off to roll out with gpuheal"
    )
    return why, exitcodes.USAGE


async def _initialize(ctx: Context, rollout: RolloutJson, nodes: Mapping[str, NodeJson]) -> None:
    """The order, written once: by `start` right after it creates the object, or
    by `resume` when a start was killed in between."""
    spec = rollout.spec
    target = state_of(rollout).target
    order = [
        replace(p, step=RolloutStep.DONE, detail="already reported the change at the start")
        if not target.missing(nodes[p.name].metadata.labels, nodes[p.name].metadata.annotations)
        else p  # nodes that report the change already need no turn
        for p in plan_order(nodes, spec.canary, spec.batchSize)
    ]
    now = iso(ctx.now(), "seconds")

    def initial(current: RolloutJson) -> dict[str, Any] | None:
        if current.status.nodes:
            return None  # another driver wrote it first
        return {
            "phase": Phase.RUNNING.value,
            "startedAt": now,
            "message": f"started: {target.describe()}",
            "nodes": _progress_json(order),
            **_summary(order),
        }

    await update_status(ctx, rollout.metadata.name, initial)


# -- pause, resume, abort ------------------------------------------------------------------


async def _set_phase(
    ctx: Context, pool: str, verb: str, allowed: Mapping[Phase, Phase], message: str
) -> RolloutJson | int:
    name = rollout_name(pool)
    refused = ""

    def change(current: RolloutJson) -> dict[str, Any] | None:
        nonlocal refused
        phase = state_of(current).phase
        if phase not in allowed:
            refused = f"the roll-out of pool {pool} is {phase.value}: nothing to {verb}"
            return None
        refused = ""
        status: dict[str, Any] = {"phase": allowed[phase].value, "message": message}
        if verb == "resume" and phase is Phase.FAILED:
            # The held nodes are gated again: fixed meanwhile, they pass now.
            now = iso(ctx.now(), "seconds")
            progress = [
                replace(p, step=RolloutStep.GATING, since=now, detail="resumed: gated again")
                if p.step is RolloutStep.FAILED_HELD
                else p
                for p in progress_of(current)
            ]
            status["nodes"] = _progress_json(progress)
        if allowed[phase] in FINAL:
            status["finishedAt"] = iso(ctx.now(), "seconds")
        return status

    written = await update_status(ctx, name, change)
    if written is None:
        _fail(ctx, verb, f"pool {pool} has no roll-out ({name})")
        return exitcodes.NOT_FOUND
    if refused:
        _fail(ctx, verb, refused)
        return exitcodes.USAGE
    return written


async def _stop(
    ctx: Context, pool: str, verb: str, allowed: Mapping[Phase, Phase], message: str
) -> int:
    """Pause or abort: the phase set (_set_phase), then the roll-out as it now stands;
    unlike resume, this drives nothing."""
    done = await _set_phase(ctx, pool, verb, allowed, message)
    if isinstance(done, int):
        return done
    render(RolloutReport(done), ctx.output, ctx.out)
    return exitcodes.OK


async def pause(ctx: Context, args: argparse.Namespace) -> int:
    return await _stop(
        ctx,
        args.pool,
        "pause",
        {Phase.RUNNING: Phase.PAUSED, Phase.PAUSED: Phase.PAUSED},
        f"paused by {ctx.actor}: no node is taken out; nodes in flight finish",
    )


async def abort(ctx: Context, args: argparse.Namespace) -> int:
    return await _stop(
        ctx,
        args.pool,
        "abort",
        {Phase.RUNNING: Phase.ABORTED, Phase.PAUSED: Phase.ABORTED, Phase.FAILED: Phase.ABORTED},
        f"aborted by {ctx.actor}: no further node is taken out; a running driver carries "
        "the nodes in flight through; held ones stay in maintenance "
        "(gpuheal maintenance finish returns each)",
    )


async def resume(ctx: Context, args: argparse.Namespace) -> int:
    done = await _set_phase(
        ctx,
        args.pool,
        "resume",
        {Phase.RUNNING: Phase.RUNNING, Phase.PAUSED: Phase.RUNNING, Phase.FAILED: Phase.RUNNING},
        f"resumed by {ctx.actor}",
    )
    if isinstance(done, int):
        return done
    return await drive(ctx, done.metadata.name, _drive_options(args))


async def status(ctx: Context, args: argparse.Namespace) -> int:
    name = rollout_name(args.pool)
    rollout = await read_rollout(ctx.api, name)
    if rollout is None:
        _fail(ctx, "status", f"pool {args.pool} has no roll-out ({name})")
        return exitcodes.NOT_FOUND
    render(RolloutReport(rollout), ctx.output, ctx.out)
    return exitcodes.FINDINGS if state_of(rollout).phase is Phase.FAILED else exitcodes.OK


# -- driving -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DriveOptions:
    poll_s: float = DEFAULT_POLL_S
    delete_emptydir_data: bool = False
    force: bool = False
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")


def _drive_options(args: argparse.Namespace) -> DriveOptions:
    return DriveOptions(
        poll_s=args.poll,
        delete_emptydir_data=args.delete_emptydir_data,
        force=args.force,
    )


def _lease_free(rollout: RolloutJson, me: str, now: dt.datetime) -> bool:
    holder = rollout.status.driver.holder
    if not holder or holder == me:
        return True
    renewed = parse_time(rollout.status.driver.renewedAt)
    return renewed is None or (now - renewed).total_seconds() > rollout.spec.leaseSeconds


async def _claim(ctx: Context, name: str, me: str) -> RolloutJson | str | None:
    """Take or renew the lease: the object, None when gone, or the holder's name
    when another CLI holds it."""
    held_by = ""

    def claim(current: RolloutJson) -> dict[str, Any] | None:
        nonlocal held_by
        now = ctx.now()
        if not _lease_free(current, me, now):
            held_by = current.status.driver.holder
            return None
        held_by = ""
        renewed = parse_time(current.status.driver.renewedAt)
        fresh = (
            renewed is not None and (now - renewed).total_seconds() < current.spec.leaseSeconds / 3
        )
        if current.status.driver.holder == me and fresh:
            return None  # renewed lately: no write
        return {"driver": {"holder": me, "renewedAt": iso(now, "seconds")}}

    written = await update_status(ctx, name, claim)
    return held_by or written


async def _heartbeat(ctx: Context, name: str, me: str) -> None:
    """Renew the lease while this CLI holds it (every quarter of leaseSeconds;
    _claim writes only when a third has passed); a failed renewal is said and
    tried again at the next beat."""
    every_s = 1.0
    while True:
        await asyncio.sleep(every_s)
        try:
            current = await read_rollout(ctx.api, name)
            if current is None:
                return
            every_s = current.spec.leaseSeconds / 4
            if current.status.driver.holder == me:
                await _claim(ctx, name, me)
        except (ApiError, WriteError, aiohttp.ClientError, TimeoutError) as err:
            ctx.err.print(Text(f"warning: lease not renewed: {err}", style="yellow"))


async def _release(ctx: Context, name: str, me: str) -> None:
    def release(current: RolloutJson) -> dict[str, Any] | None:
        if current.status.driver.holder != me:
            return None
        return {"driver": {"holder": "", "renewedAt": iso(ctx.now(), "seconds")}}

    await update_status(ctx, name, release)


async def drive(ctx: Context, name: str, options: DriveOptions) -> int:
    """Drive the roll-out until it completes, fails, is paused (with nothing in
    flight) or aborted; each pass level-triggered from the recorded status."""
    me = options.identity
    waited_s = 0.0
    # A pass can sit in a drain for up to its deadline: the lease is renewed meanwhile.
    heartbeat = asyncio.create_task(_heartbeat(ctx, name, me))
    try:
        while True:
            claimed = await _claim(ctx, name, me)
            if claimed is None:
                _fail(ctx, "drive", f"the GPURollout {name} is gone")
                return exitcodes.NOT_FOUND
            if isinstance(claimed, str):
                current = await read_rollout(ctx.api, name)
                lease = current.spec.leaseSeconds if current else DEFAULT_LEASE_S
                if waited_s > 2 * lease:
                    _fail(ctx, "drive", f"{claimed} drives this roll-out; nothing done")
                    return exitcodes.USAGE
                if waited_s == 0:
                    ctx.err.print(
                        Text(f"{claimed} holds the roll-out's lease; waiting for it to lapse")
                    )
                await asyncio.sleep(options.poll_s)
                waited_s += options.poll_s
                continue
            waited_s = 0.0
            rollout = claimed
            if not rollout.status.nodes:
                nodes = in_pool(await gpu_nodes(ctx), rollout.spec.pool, ctx.config)
                if not nodes:
                    _fail(ctx, "drive", f"pool {rollout.spec.pool} has no GPU nodes")
                    return exitcodes.NOT_FOUND
                await _initialize(ctx, rollout, nodes)
                continue
            phase = state_of(rollout).phase
            progress = progress_of(rollout)
            in_flight = any(p.step in IN_FLIGHT - {RolloutStep.FAILED_HELD} for p in progress)
            # Paused, aborted or failed: the nodes in flight (drained already) are
            # carried through, no other starts; then the CLI stops.
            stopped = phase in (Phase.PAUSED, Phase.ABORTED, Phase.FAILED) and not in_flight
            if phase is Phase.COMPLETED or stopped:
                render(RolloutReport(rollout), ctx.output, ctx.out)
                return exitcodes.FINDINGS if phase is Phase.FAILED else exitcodes.OK
            moved = await drive_once(ctx, rollout, options)
            if not moved:
                await asyncio.sleep(options.poll_s)
    finally:
        heartbeat.cancel()
        try:
            await _release(ctx, name, me)
        except (ApiError, WriteError) as err:  # the lease lapses on its own
            ctx.err.print(Text(f"warning: lease not released: {err}", style="yellow"))


async def drive_once(ctx: Context, rollout: RolloutJson, options: DriveOptions) -> bool:
    """One pass: advance the nodes in flight, take the next ones out, decide the
    phase. True when something changed (the next pass comes at once)."""
    name = rollout.metadata.name
    spec = rollout.spec
    state = state_of(rollout)
    progress = list(state.progress)
    fleet = await gpu_nodes(ctx)
    nodes = in_pool(fleet, spec.pool, ctx.config)
    advanced = await asyncio.gather(
        *(
            _advance(ctx, rollout, p, node=nodes.get(p.name), options=options)
            if p.step in (RolloutStep.DRAINING, RolloutStep.WAITING, RolloutStep.GATING)
            else _same(p)
            for p in progress
        )
    )
    changed = {p.name: p for p, was in zip(advanced, progress, strict=True) if p != was}
    progress = list(advanced)
    started: list[str] = []
    if state.phase is Phase.RUNNING:
        budget = budget_of(rollout, fleet, progress, ctx.config)
        upgrading = {n for n, node in nodes.items() if driver_upgrade(node.metadata.labels)}
        started = next_to_start(progress, budget, upgrading)
        now = iso(ctx.now(), "seconds")
        for i, p in enumerate(progress):
            if p.name in started:
                progress[i] = changed[p.name] = replace(
                    p,
                    step=RolloutStep.DRAINING,
                    since=now,
                    detail=f"taken out ({budget.describe()})",
                )
    if not changed:
        return False
    for p in changed.values():  # progress, for the person watching (stderr)
        ctx.err.print(Text(f"{p.name}: {p.step.value}" + (f" ({p.detail})" if p.detail else "")))
    await _record(ctx, name, changed)
    return True


async def _same(p: NodeProgress) -> NodeProgress:
    return p


async def _record(ctx: Context, name: str, changed: Mapping[str, NodeProgress]) -> None:
    """Write the nodes' new steps, and the phase they imply: Failed at the first
    held node, Completed when all are done. A phase a person set meanwhile (pause,
    abort) stays, but a failure or the end is said regardless."""

    def write(current: RolloutJson) -> dict[str, Any] | None:
        phase = state_of(current).phase

        def merged(p: NodeProgress) -> NodeProgress:
            new = changed.get(p.name, p)
            # Paused or aborted since this pass read the phase: no node starts (the
            # step is written before the node is touched, so nothing was done yet).
            starts = p.step is RolloutStep.PENDING and new.step is not RolloutStep.PENDING
            return p if starts and phase is not Phase.RUNNING else new

        progress = [merged(p) for p in progress_of(current)]
        status: dict[str, Any] = {"nodes": _progress_json(progress), **_summary(progress)}
        now = iso(ctx.now(), "seconds")
        held = [p for p in progress if p.step is RolloutStep.FAILED_HELD]
        if held and phase in (Phase.RUNNING, Phase.PAUSED):
            status["phase"] = Phase.FAILED.value
            status["message"] = text(
                f"stopped: node {held[0].name} is held: {held[0].detail}", 1024
            )
        elif all(p.step is RolloutStep.DONE for p in progress) and phase is not Phase.ABORTED:
            status["phase"] = Phase.COMPLETED.value
            status["message"] = f"completed: {len(progress)} node(s) on the target"
            status["finishedAt"] = now
        return status

    await update_status(ctx, name, write)


async def _advance(
    ctx: Context,
    rollout: RolloutJson,
    p: NodeProgress,
    *,
    node: NodeJson | None,
    options: DriveOptions,
) -> NodeProgress:
    """One step of one node in flight, as far as it can go now."""
    now = ctx.now()
    stamp = iso(now, "seconds")
    if node is None:
        return replace(
            p, step=RolloutStep.FAILED_HELD, since=stamp, detail="the node is gone from the pool"
        )
    if p.step is RolloutStep.DRAINING:
        return await _drain(ctx, rollout, p, node=node, options=options, stamp=stamp)
    elapsed = _elapsed(p, now)
    if p.step is RolloutStep.WAITING:
        return _waiting(rollout, p, node=node, elapsed=elapsed, stamp=stamp)
    return await _gate(ctx, rollout, p, node=node, elapsed=elapsed, stamp=stamp)


async def _drain(
    ctx: Context,
    rollout: RolloutJson,
    p: NodeProgress,
    *,
    node: NodeJson,
    options: DriveOptions,
    stamp: str,
) -> NodeProgress:
    """Through the maintenance path: mark, checkpoint, drain (safe to repeat)."""
    target = state_of(rollout).target
    how = TakeOut(
        reason=f"rollout {rollout.spec.pool}: {target.describe()}"
        + (f" ({rollout.spec.reason})" if rollout.spec.reason else ""),
        delete_emptydir_data=options.delete_emptydir_data,
        force=options.force,
        rollout=rollout.metadata.name,
    )
    report = await take_out(ctx, node, how)
    if report is None or report.drain is None or not report.drain.done:
        blockers = ", ".join(sorted(report.drain.blockers)) if report and report.drain else ""
        return replace(p, detail=f"drain not done yet{': ' + blockers if blockers else ''}")
    return replace(
        p, step=RolloutStep.WAITING, since=stamp, detail="drained; waiting for the change"
    )


def _waiting(
    rollout: RolloutJson, p: NodeProgress, *, node: NodeJson, elapsed: float, stamp: str
) -> NodeProgress:
    """The change is the operator's tooling's (or a person's): looked for, not made."""
    missing = state_of(rollout).target.missing(node.metadata.labels, node.metadata.annotations)
    if not missing:
        return replace(p, step=RolloutStep.GATING, since=stamp, detail="reports the change")
    if elapsed > rollout.spec.changeTimeoutSeconds:
        return replace(
            p,
            step=RolloutStep.FAILED_HELD,
            since=stamp,
            detail=f"no change within {rollout.spec.changeTimeoutSeconds:g}s: "
            + "; ".join(missing),
        )
    return p


def _elapsed(p: NodeProgress, now: dt.datetime) -> float:
    since = parse_time(p.since)
    return (now - since).total_seconds() if since is not None else 0.0


async def _gate(
    ctx: Context,
    rollout: RolloutJson,
    p: NodeProgress,
    *,
    node: NodeJson,
    elapsed: float,
    stamp: str,
) -> NodeProgress:
    """The health gate on the new version; passed: the node goes back (the
    maintenance finish write), failed past gateTimeoutSeconds: held."""
    since = parse_time(node.metadata.annotations.get(MAINTENANCE_SINCE, ""))
    # With validation the pass waits for the Job (the heartbeat keeps the lease).
    result = await judge_node(ctx, node, since, validate=rollout.spec.validate)
    if not result.passed:
        if elapsed <= rollout.spec.gateTimeoutSeconds:
            return replace(p, detail=f"gate not passed yet: {result.summary()}")
        await emit_node_event(
            ctx,
            node,
            reason=Reason.GATE_FAILED,
            note=f"roll-out {rollout.metadata.name} stopped, node held: {result.summary()}",
            action="Gate",
            warning=True,
        )
        return replace(
            p, step=RolloutStep.FAILED_HELD, since=stamp, detail=f"gate failed: {result.summary()}"
        )
    left = leftovers(node, ctx.config)
    if left:  # else `maintenance finish` returned it already
        try:
            written = await guarded_write(
                ctx, node.metadata.name, node, lambda n: finish_patch(n, ctx.config)[0]
            )
        except WriteError as err:
            return replace(p, detail=f"not returned yet: {err}")
        await emit_node_event(
            ctx,
            written,
            reason=Reason.MAINTENANCE_FINISHED,
            note=f"maintenance finished (roll-out {rollout.metadata.name}): the gate passed",
            action="Maintenance",
        )
    return replace(p, step=RolloutStep.DONE, since=stamp, detail="gate passed; returned")


# -- the report ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutReport:
    rollout: RolloutJson

    def data(self) -> dict[str, Any]:
        r = self.rollout
        spec, status = r.spec, r.status
        return {
            "name": r.metadata.name,
            "pool": spec.pool,
            "target": {
                "driverVersion": spec.target.driverVersion or None,
                "labels": spec.target.labels,
                "annotations": spec.target.annotations,
            },
            "canary": spec.canary,
            "batchSize": spec.batchSize,
            "maxUnavailable": spec.maxUnavailable,
            "maxUnavailablePercent": spec.maxUnavailablePercent,
            "phase": status.phase,
            "message": status.message,
            "total": status.total,
            "done": status.done,
            "startedAt": status.startedAt or None,
            "finishedAt": status.finishedAt or None,
            "driver": status.driver.holder or None,
            "nodes": [
                {
                    "name": n.name,
                    "batch": n.batch,
                    "step": n.step,
                    "since": n.since,
                    "detail": n.detail,
                }
                for n in status.nodes
            ],
        }

    def views(self) -> Sequence[Table | Notes]:
        r = self.rollout
        state = state_of(r)
        style = {
            Phase.COMPLETED: "ok",
            Phase.FAILED: "bad",
            Phase.ABORTED: "warn",
            Phase.PAUSED: "warn",
        }.get(state.phase, "")
        spec = r.spec
        percent = (
            f" / {spec.maxUnavailablePercent:g}%" if spec.maxUnavailablePercent is not None else ""
        )
        lines = [
            (style, f"{state.phase.value}: {r.status.message}"),
            ("", f"target: {state.target.describe()}"),
            (
                "",
                f"canary {spec.canary}, batches of {spec.batchSize}, "
                f"at most {spec.maxUnavailable}{percent} unavailable",
            ),
            ("", f"{r.status.done}/{r.status.total} node(s) done"),
        ]
        if r.status.driver.holder:
            lines.append(("", f"driven by {r.status.driver.holder} ({r.status.driver.renewedAt})"))
        rows = [(n.name, n.batch, n.step, n.since, n.detail) for n in r.status.nodes]
        return (
            Notes(f"Roll-out of pool {spec.pool} ({r.metadata.name})", lines),
            Table("Nodes", ("NODE", "BATCH", "STEP", "SINCE", "DETAIL"), rows),
        )
