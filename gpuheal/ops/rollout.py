"""`gpuheal rollout start | status | pause | resume | abort POOL`: a driver (or any
node change) across a GPU pool, the canary first, then batch by batch.

The roll-out lives in the cluster, as a GPURollout named after the pool
(policy/rollout.py's rollout_name): creating it is the one-per-pool lock, and its
status is the whole memory (each node's step, the phase). The leading controller
drives it (gpuheal/controller/rollouts.py); these commands only write the request
(start creates the object; pause, resume and abort set its phase under its
resourceVersion, so two operators' commands and the controller's passes never
overwrite each other) and read it back: start and resume wait by default and show
each node's steps as the controller writes them, and a closed terminal stops
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rich.text import Text

from gpuheal.clock import iso
from gpuheal.config import Config
from gpuheal.kube.api import ApiError, gpurollout_path
from gpuheal.kube.projections import NodeJson
from gpuheal.kube.rollouts import (
    RolloutJson,
    progress_json,
    progress_of,
    read_rollout,
    state_of,
    update_status,
)
from gpuheal.model import (
    DRIVER_UPGRADE_ENABLED,
    DRIVER_UPGRADE_STATE,
    GPUFAULT_API_VERSION,
    GPUROLLOUT_KIND,
)
from gpuheal.ops import exitcodes
from gpuheal.ops.fleet import gpu_nodes, in_pool
from gpuheal.ops.output import Notes, Table, render
from gpuheal.policy.operator import AUTO_UPGRADE_SETTING, upgrades_managed
from gpuheal.policy.rollout import (
    FINAL,
    Phase,
    RolloutStep,
    Target,
    rollout_name,
)
from gpuheal.values import text

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

# Said once when no controller has written the order by then: is one running?
NO_DRIVER_HINT_S = 30.0
# The steps the controller still acts on in a stopped (paused, failed, aborted) roll-out.
MOVING = frozenset({RolloutStep.DRAINING, RolloutStep.WAITING, RolloutStep.GATING})


def _fail(ctx: Context, verb: str, why: str) -> None:
    ctx.err.print(Text(f"gpuheal rollout {verb}: {why}", style="bold red"))


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
        "validate": args.validate,
        "deleteEmptyDirData": args.delete_emptydir_data,
        "force": args.force,
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
            f"see `gpuheal rollout status {pool}`; a paused or failed one is resumed, and a "
            f"finished or aborted one must be deleted (kubectl delete gpurollout {name}) "
            "before another",
        )
        return exitcodes.USAGE
    ctx.err.print(Text(f"created GPURollout {name}: the leading controller drives it"))
    return await _after_request(ctx, name, args)


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
            status["nodes"] = progress_json(progress)
        if allowed[phase] in FINAL:
            status["finishedAt"] = iso(ctx.now(), "seconds")
        return status

    written = await update_status(ctx.api, name, change)
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
    """Pause or abort: the phase set (_set_phase), then the roll-out as it now stands
    (the nodes in flight the controller carries through, in the background)."""
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
        f"aborted by {ctx.actor}: no further node is taken out; the controller carries "
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
    return await _after_request(ctx, done.metadata.name, args)


async def status(ctx: Context, args: argparse.Namespace) -> int:
    name = rollout_name(args.pool)
    rollout = await read_rollout(ctx.api, name)
    if rollout is None:
        _fail(ctx, "status", f"pool {args.pool} has no roll-out ({name})")
        return exitcodes.NOT_FOUND
    render(RolloutReport(rollout), ctx.output, ctx.out)
    return exitcodes.FINDINGS if state_of(rollout).phase is Phase.FAILED else exitcodes.OK


# -- waiting ------------------------------------------------------------------------------


def _exit_code(rollout: RolloutJson) -> int:
    return exitcodes.FINDINGS if state_of(rollout).phase is Phase.FAILED else exitcodes.OK


def settled(rollout: RolloutJson) -> bool:
    """Nothing more will happen without a person: completed, or stopped (paused,
    aborted, failed) with no node in flight."""
    state = state_of(rollout)
    if state.phase in FINAL and not state.progress:
        return True  # aborted before its order was written
    if state.phase is Phase.RUNNING or not state.progress:
        return False
    return not any(p.step in MOVING for p in state.progress)


async def _after_request(ctx: Context, name: str, args: argparse.Namespace) -> int:
    """Start's and resume's end: the roll-out as it stands (--no-wait), or followed
    until it settles."""
    if not args.wait:
        rollout = await read_rollout(ctx.api, name)
        if rollout is None:
            _fail(ctx, "status", f"the GPURollout {name} is gone")
            return exitcodes.NOT_FOUND
        render(RolloutReport(rollout), ctx.output, ctx.out)
        return _exit_code(rollout)
    return await follow(ctx, name, poll_s=args.poll)


async def follow(ctx: Context, name: str, *, poll_s: float) -> int:
    """Read the roll-out every `poll_s` until it settles, saying each node's new
    step on stderr as the controller writes it; then the report. Read-only:
    interrupting it changes nothing."""
    seen: dict[str, tuple[str, str]] = {}
    started = time.monotonic()
    hinted = False
    while True:
        rollout = await read_rollout(ctx.api, name)
        if rollout is None:
            _fail(ctx, "status", f"the GPURollout {name} is gone")
            return exitcodes.NOT_FOUND
        for p in progress_of(rollout):
            now = (p.step.value, p.detail)
            if seen.get(p.name) != now:
                seen[p.name] = now
                detail = f" ({p.detail})" if p.detail else ""
                ctx.err.print(Text(f"{p.name}: {p.step.value}{detail}"))
        if settled(rollout):
            render(RolloutReport(rollout), ctx.output, ctx.out)
            return _exit_code(rollout)
        waited_s = time.monotonic() - started
        if not rollout.status.nodes and not hinted and waited_s > NO_DRIVER_HINT_S:
            hinted = True
            ctx.err.print(
                Text(
                    f"no controller has taken up {name} yet: is `gpuheal controller` running "
                    "and leading, and does its nodeSelector cover the pool? (still waiting; "
                    "Ctrl-C stops the wait, not the roll-out)",
                    style="yellow",
                )
            )
        await asyncio.sleep(poll_s)


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
            "driver": status.driven_by or None,
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
        if r.status.driven_by:
            lines.append(("", f"driven by the controller {r.status.driven_by}"))
        rows = [(n.name, n.batch, n.step, n.since, n.detail) for n in r.status.nodes]
        return (
            Notes(f"Roll-out of pool {spec.pool} ({r.metadata.name})", lines),
            Table("Nodes", ("NODE", "BATCH", "STEP", "SINCE", "DETAIL"), rows),
        )
