"""Roll-outs driven by the leader: each GPURollout (`gpuheal rollout start` creates
it) is carried from its spec to Completed here, not in the CLI that created it.

The GPURollout's status is the whole memory (each node's step, the phase). A pass
reads the object and the pool's nodes, advances every node in flight one step,
takes the next ones out within the budget (gpuheal.policy.rollout), and writes the
status under the object's resourceVersion. A step is written before it is acted
on and every action is safe to repeat (a node already in maintenance resumes; a
drained node has nothing to evict; the gate only reads), so a new leader after a
failover carries on from the status, draining no node twice. The CLI's pause,
resume and abort write the phase under the same guard; a pass that read the old
phase starts no node (_record's merge).

Only the leader drives (started and cancelled with the workers), and only the
roll-outs that have something to do: its informer's cache says which, so an idle
fleet costs no request. A driven roll-out costs a LIST of the pool's nodes and a
GET of the object a pass, one pass every `rollouts.pollSeconds` while nothing
moves.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import aiohttp

from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.controller.keyed import KeyedTasks
from gpuheal.controller.said import SaidLines
from gpuheal.kube.api import ApiError, KubeApi
from gpuheal.kube.events import REPORTING_CONTROLLER
from gpuheal.kube.projections import NodeJson
from gpuheal.kube.rollouts import (
    RolloutJson,
    RolloutState,
    RolloutWriteError,
    progress_json,
    progress_of,
    read_rollout,
    state_of,
    summary,
    update_status,
)
from gpuheal.model import MAINTENANCE_SINCE, TAINT_KEY
from gpuheal.ops.context import Context
from gpuheal.ops.events import emit_node_event
from gpuheal.ops.fleet import gpu_nodes, in_pool, node_ready, why_unmanaged
from gpuheal.ops.gate import judge_node
from gpuheal.ops.maintenance import TakeOut, WriteError, finish_patch, guarded_write, leftovers
from gpuheal.ops.maintenance import take_out as maintenance_take_out
from gpuheal.policy.backoff import backoff_delay
from gpuheal.policy.breaker import quarantine_capacity
from gpuheal.policy.nodes import in_maintenance
from gpuheal.policy.operator import driver_upgrade
from gpuheal.policy.rollout import (
    FINAL,
    IN_FLIGHT,
    Budget,
    NodeProgress,
    Phase,
    RolloutStep,
    allowed_unavailable,
    next_to_start,
    plan_order,
    unmanaged_step,
)
from gpuheal.supervisor import Supervisor
from gpuheal.values import text
from gpuheal.vocabulary import Reason

log = logging.getLogger(__name__)

# The steps a pass acts on; FAILED_HELD waits for a person (resume or abort).
MOVING = frozenset({RolloutStep.DRAINING, RolloutStep.WAITING, RolloutStep.GATING})
MAX_BACKOFF_S = 60.0


def wants_driving(state: RolloutState) -> bool:
    """Whether a roll-out has anything for the leader to do: not started yet (no
    order written), running, or stopped with nodes still in flight (paused, aborted
    and failed roll-outs carry those through; no other node starts)."""
    if not state.progress:
        return state.phase not in FINAL
    if state.phase is Phase.RUNNING:
        return True
    return any(p.step in MOVING for p in state.progress)


# -- the pass's reading ------------------------------------------------------------------


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


# -- the loop ------------------------------------------------------------------------------


class RolloutLoop:
    """The leader's roll-out driver: one task per roll-out that wants driving."""

    def __init__(
        self,
        config: Callable[[], Config],
        api: KubeApi,
        *,
        rollouts: Callable[[], Iterable[RolloutState]],
        identity: str,
        schema_ok: Callable[[], bool] = lambda: True,
        supervisor: Supervisor,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.config = config
        self.api = api
        self.rollouts = rollouts
        self.identity = identity
        # The GPURollout schema served is this version's: an older one would prune
        # what a pass writes (the controller's /readyz says so, with the command).
        self.schema_ok = schema_ok
        self.now = now
        self._driving = KeyedTasks("rollout", supervisor)

    def context(self, rollout: str) -> Context:
        """ops/'s world for one roll-out's actions: this replica's client, the
        config now, its Events reported as the controller's."""
        return Context(
            api=self.api,
            config=self.config(),
            err=SaidLines({"rollout": rollout}).console(),
            now=self.now,
            actor=self.identity,
            reporting_controller=REPORTING_CONTROLLER,
        )

    async def run(self) -> None:
        """Look at the informer's roll-outs every poll and drive each that wants it."""
        try:
            while True:
                for state in self.rollouts() if self.schema_ok() else ():
                    if wants_driving(state):
                        self._driving.ensure(state.name, partial(self.drive, state.name))
                await asyncio.sleep(self.config().rollouts.poll_seconds)
        finally:
            await self._driving.cancel_all()

    async def drive(self, name: str) -> None:
        """Passes until the roll-out has nothing left to do (or is gone); a failed
        pass is logged and tried again after a growing pause."""
        failures = 0
        log.info("driving roll-out", extra={"rollout": name})
        while True:
            poll_s = self.config().rollouts.poll_seconds
            try:
                rollout = await read_rollout(self.api, name)
                if rollout is None or not wants_driving(state_of(rollout)):
                    log.info("roll-out needs no driving", extra={"rollout": name})
                    return
                moved = await self.drive_once(rollout)
                failures = 0
            except (ApiError, RolloutWriteError, aiohttp.ClientError, TimeoutError) as err:
                failures += 1
                wait_s = backoff_delay(failures, poll_s, MAX_BACKOFF_S, jitter=0.2)
                log.warning(
                    "roll-out pass failed; trying again",
                    extra={"rollout": name, "error": str(err), "retry_s": wait_s},
                )
                await asyncio.sleep(wait_s)
                continue
            if not moved:
                await asyncio.sleep(poll_s)

    async def drive_once(self, rollout: RolloutJson) -> bool:
        """One pass: write the order when there is none yet; else advance the nodes
        in flight, take the next ones out, decide the phase. True when something
        changed (the next pass comes at once)."""
        ctx = self.context(rollout.metadata.name)
        fleet = await gpu_nodes(ctx)
        nodes = in_pool(fleet, rollout.spec.pool, ctx.config)
        # Only nodes gpuheal manages: one opted out is not ordered, started or acted
        # on again (policy/rollout.py::unmanaged_step).
        unmanaged = {
            n: why for n, node in nodes.items() if (why := why_unmanaged(node, ctx.config))
        }
        if not rollout.status.nodes:
            ordered = {n: node for n, node in nodes.items() if n not in unmanaged}
            return await self._initialize(ctx, rollout, ordered)
        state = state_of(rollout)
        progress = list(state.progress)
        advanced = await asyncio.gather(
            *(
                _same(unmanaged_step(p, unmanaged[p.name], iso(ctx.now(), "seconds")))
                if p.name in unmanaged
                else self._advance(ctx, rollout, p, node=nodes.get(p.name))
                if p.step in MOVING
                else _same(p)
                for p in progress
            )
        )
        changed = {p.name: p for p, was in zip(advanced, progress, strict=True) if p != was}
        progress = list(advanced)
        if state.phase is Phase.RUNNING:
            budget = budget_of(rollout, fleet, progress, ctx.config)
            upgrading = {n for n, node in nodes.items() if driver_upgrade(node.metadata.labels)}
            started = next_to_start(progress, budget, upgrading | unmanaged.keys())
            stamp = iso(ctx.now(), "seconds")
            for i, p in enumerate(progress):
                if p.name in started:
                    progress[i] = changed[p.name] = replace(
                        p,
                        step=RolloutStep.DRAINING,
                        since=stamp,
                        detail=f"taken out ({budget.describe()})",
                    )
        if not changed:
            return False
        for p in changed.values():
            log.info(
                "roll-out step",
                extra={
                    "rollout": rollout.metadata.name,
                    "node": p.name,
                    "step": p.step.value,
                    "detail": p.detail,
                },
            )
        await self._record(ctx, rollout.metadata.name, changed)
        refused = [p for p in changed.values() if p.name in unmanaged]
        await _tell_refused(ctx, rollout.metadata.name, refused, nodes)
        return True

    async def _initialize(
        self, ctx: Context, rollout: RolloutJson, nodes: Mapping[str, NodeJson]
    ) -> bool:
        """The order, written once: the pool's nodes now, those already on the
        target done at once."""
        name = rollout.metadata.name
        if not nodes:
            log.warning(
                "roll-out's pool has no GPU nodes this controller manages",
                extra={"rollout": name, "pool": rollout.spec.pool},
            )
            return False
        spec = rollout.spec
        target = state_of(rollout).target
        order = [
            replace(p, step=RolloutStep.DONE, detail="already reported the change at the start")
            if not target.missing(nodes[p.name].metadata.labels, nodes[p.name].metadata.annotations)
            else p
            for p in plan_order(nodes, spec.canary, spec.batchSize)
        ]
        stamp = iso(ctx.now(), "seconds")

        def initial(current: RolloutJson) -> dict[str, Any] | None:
            if current.status.nodes:
                return None  # written already (a pass before a failover)
            status: dict[str, Any] = {
                "phase": current.status.phase or Phase.RUNNING.value,
                "startedAt": stamp,
                "message": f"started: {target.describe()}",
                "driver": self.identity,
                "nodes": progress_json(order),
                **summary(order),
            }
            if all(p.step is RolloutStep.DONE for p in order):
                status |= _completed(order, stamp)
            return status

        await update_status(ctx.api, name, initial)
        log.info("roll-out order written", extra={"rollout": name, "nodes": len(order)})
        return True

    async def _record(self, ctx: Context, name: str, changed: Mapping[str, NodeProgress]) -> None:
        """Write the nodes' new steps, and the phase they imply: Failed at the first
        held node, Completed when all are done. A phase a person set meanwhile
        (pause, abort) stays, but a failure or the end is said regardless."""
        stamp = iso(ctx.now(), "seconds")

        def write(current: RolloutJson) -> dict[str, Any] | None:
            phase = state_of(current).phase

            def merged(p: NodeProgress) -> NodeProgress:
                new = changed.get(p.name, p)
                # Paused or aborted since this pass read the phase: no node starts (the
                # step is written before the node is touched, so nothing was done yet).
                starts = p.step is RolloutStep.PENDING and new.step is not RolloutStep.PENDING
                return p if starts and phase is not Phase.RUNNING else new

            progress = [merged(p) for p in progress_of(current)]
            status: dict[str, Any] = {
                "nodes": progress_json(progress),
                "driver": self.identity,
                **summary(progress),
            }
            held = [p for p in progress if p.step is RolloutStep.FAILED_HELD]
            if held and phase in (Phase.RUNNING, Phase.PAUSED):
                status["phase"] = Phase.FAILED.value
                status["message"] = text(
                    f"stopped: node {held[0].name} is held: {held[0].detail}", 1024
                )
            elif all(p.step is RolloutStep.DONE for p in progress) and phase is not Phase.ABORTED:
                status |= _completed(progress, stamp)
            return status

        await update_status(ctx.api, name, write)

    async def _advance(
        self, ctx: Context, rollout: RolloutJson, p: NodeProgress, *, node: NodeJson | None
    ) -> NodeProgress:
        """One step of one node in flight, as far as it can go now."""
        now = ctx.now()
        stamp = iso(now, "seconds")
        if node is None:
            return replace(
                p,
                step=RolloutStep.FAILED_HELD,
                since=stamp,
                detail="the node is gone from the pool",
            )
        if p.step is RolloutStep.DRAINING:
            return await _drain(ctx, rollout, p, node=node, stamp=stamp)
        elapsed = _elapsed(p, now)
        if p.step is RolloutStep.WAITING:
            return _waiting(rollout, p, node=node, elapsed=elapsed, stamp=stamp)
        return await _gate(ctx, rollout, p, node=node, elapsed=elapsed, stamp=stamp)


def _completed(progress: Sequence[NodeProgress], stamp: str) -> dict[str, Any]:
    return {
        "phase": Phase.COMPLETED.value,
        "message": f"completed: {len(progress)} node(s) on the target",
        "finishedAt": stamp,
    }


async def _same(p: NodeProgress) -> NodeProgress:
    return p


async def _tell_refused(
    ctx: Context, rollout: str, refused: Sequence[NodeProgress], nodes: Mapping[str, NodeJson]
) -> None:
    """A Warning Event on each node the roll-out leaves alone because gpuheal does not
    manage it, once (its step's detail changes once)."""
    for p in refused:
        await emit_node_event(
            ctx,
            nodes[p.name],
            reason=Reason.MAINTENANCE_REFUSED,
            note=f"roll-out {rollout}: {p.detail}",
            action="Rollout",
            warning=True,
        )


async def _drain(
    ctx: Context, rollout: RolloutJson, p: NodeProgress, *, node: NodeJson, stamp: str
) -> NodeProgress:
    """Through the maintenance path: mark, checkpoint, drain (safe to repeat)."""
    spec = rollout.spec
    target = state_of(rollout).target
    how = TakeOut(
        reason=f"rollout {spec.pool}: {target.describe()}"
        + (f" ({spec.reason})" if spec.reason else ""),
        delete_emptydir_data=spec.deleteEmptyDirData,
        force=spec.force,
        rollout=rollout.metadata.name,
    )
    report = await maintenance_take_out(ctx, node, how)
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
    if leftovers(node, ctx.config):  # else a person's `maintenance finish` returned it already
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
