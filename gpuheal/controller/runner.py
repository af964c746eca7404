"""Carry out one node's plan, step by step (gpuheal/policy/actions.py::Plan.steps).

The policy decides the steps, their guards and what follows each; this module
only interprets them. A guarded step runs under the one breaker lock, where the
plan is made again from the caches (which hold every write so far: the executor
writes through), so two workers can never both take the breaker's last place or
the repair budget's: BREAKER runs the new plan's fence if it still starts a
quarantine and a rate-limit token is there, else the new plan whole;
REPAIR_BUDGET runs the new plan whole, under the lock.

A pass writes each record's status once, and sends its Events, when it ends
(the executor's flush): nothing stands between a fault and its taint, written
first (a new quarantine's fence pass is the taint alone when a drain follows).
Actions a pass already ran are not run again when a guarded step's plan is
made again: the plans share their `now`, so an action already run is equal to
its repeat.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass

from gpuheal.controller.effects.context import PassOutcome, Replan
from gpuheal.controller.executor import Executor
from gpuheal.controller.result import DONE, Result
from gpuheal.policy.actions import Action, Guard, NodeState, Plan, PlanStep, Then

log = logging.getLogger(__name__)

# Look again at once (at the end of the queue): the world moved under the pass's plan.
AT_ONCE = Result(requeue_after=0.0)
# The node's next turn (Then.NEXT_TURN): a new quarantine's drain, behind every node
# queued for a fresh look, so that a storm's nodes are all fenced before any worker
# evicts (the queue's lane behind, bounded in how long it waits).
NEXT_TURN = Result(requeue_after=0.0, behind=True)

# The plan made again, from the caches, for a node (None: it is gone or unmanaged).
Replanner = Callable[[str, dt.datetime], tuple[Plan, NodeState] | None]


@dataclass(frozen=True)
class Carried:
    """What a pass did: the plan it ended with (made again under a guard, maybe),
    every action it ran, and their outcome; the Result for the queue."""

    result: Result
    decided: Plan
    ran: tuple[Action, ...]
    outcome: PassOutcome


def _not_in(actions: tuple[Action, ...], done: tuple[Action, ...]) -> tuple[Action, ...]:
    return tuple(a for a in actions if a not in done)


class Runner:
    def __init__(
        self, executor: Executor, replan: Replanner, take_token: Callable[[], float]
    ) -> None:
        self.executor = executor
        self.replan = replan
        self.take_token = take_token  # 0.0, or the seconds until a token is there
        self.lock = asyncio.Lock()  # the breaker's and the repair budget's, one for both

    async def carry_out(
        self, decided: Plan, state: NodeState, now: dt.datetime
    ) -> Carried | Result:
        """Run the plan's steps: a Carried when the pass ran to a step's end, a bare
        Result when a guard sent it back (no token yet, node gone, plan changed)."""
        if not decided.actions:
            return Result(decided.requeue_after)
        outcome, index, then = PassOutcome(), 0, Then.LATER
        done: tuple[Action, ...] = ()
        step: PlanStep | None = None
        try:
            while index < len(decided.steps):
                # The steps are read again each time: a guard may have made the plan again.
                step = decided.steps[index]
                if step.guard is Guard.NONE:
                    done += await self._run(decided, state, step.actions, done, outcome)
                    then = step.then
                else:
                    async with self.lock:
                        guarded = await self._guarded(
                            step, index, state, now, done=done, outcome=outcome
                        )
                    if isinstance(guarded, Result):
                        await self.executor.flush(outcome, state)
                        return guarded
                    decided, state, ran, then = guarded
                    done += ran
                if then is not Then.CONTINUE:
                    break
                index += 1
        except Replan as why:
            log.info("replanning", extra={"node": state.node.name, "why": str(why)})
            await self.executor.flush_after_failure(outcome, state)
            return AT_ONCE
        except Exception as err:
            if step is not None and step.otherwise:
                # Best effort: the step's own error is the one the worker reports.
                try:
                    await self._run(decided, state, step.otherwise, done, outcome)
                except Exception as failed:
                    log.warning(
                        "otherwise failed too",
                        extra={"node": state.node.name, "error": str(failed), "after": str(err)},
                    )
            await self.executor.flush_after_failure(outcome, state)
            raise
        await self.executor.flush(outcome, state)
        result = NEXT_TURN if then is Then.NEXT_TURN else Result(decided.requeue_after)
        return Carried(result, decided, done, outcome)

    async def _guarded(
        self,
        step: PlanStep,
        index: int,
        state: NodeState,
        now: dt.datetime,
        *,
        done: tuple[Action, ...],
        outcome: PassOutcome,
    ) -> Result | tuple[Plan, NodeState, tuple[Action, ...], Then]:
        """Under the lock: the plan made again, and the step it now says run."""
        again = self.replan(state.node.name, now)
        if again is None:
            return DONE
        decided, state = again
        if step.guard is Guard.REPAIR_BUDGET:
            if decided.new_quarantine:
                return AT_ONCE  # the node needs its fence first: its own guard
            ran = await self._run(decided, state, decided.actions, done, outcome)
            # Its record entries too are written before another worker counts the
            # repairs in flight (the requests themselves are on the nodes already).
            await self.executor.flush(outcome, state)
            return decided, state, ran, Then.LATER
        if not decided.new_quarantine:
            # Not a new quarantine any more (the breaker filled: Held): run it whole.
            ran = await self._run(decided, state, decided.actions, done, outcome)
            return decided, state, ran, Then.LATER
        wait = self.take_token()
        if wait > 0:
            log.info("rate limited", extra={"node": state.node.name, "wait_s": round(wait, 3)})
            return Result(requeue_after=wait)
        fenced = decided.steps[index]
        ran = await self._run(decided, state, fenced.actions, done, outcome)
        return decided, state, ran, fenced.then

    async def _run(
        self,
        decided: Plan,
        state: NodeState,
        actions: tuple[Action, ...],
        done: tuple[Action, ...],
        outcome: PassOutcome,
    ) -> tuple[Action, ...]:
        todo = _not_in(actions, done)
        if todo:
            await self.executor.run(decided, state, todo, outcome, flush=False)
        return todo
