"""Run a plan's actions through their effects (gpuheal/controller/effects/), in order.

Each action is idempotent: creating a record that exists, adding a taint that
is there, evicting a pod that is gone — all end in the same state. Every
write's response is fed back into the caches (write-through), so the next
plan sees our own writes even before the watch delivers them.

A pass writes each record's status once: its UpdateRecord actions (a new
record's `detect` entry among them) are gathered and written together when the pass ends
(`flush`), after the actions they record; its Events are sent then too, one
per Emit, and one for all the pods the pass evicted. So nothing stands between
a fault and its taint, which a new quarantine writes first (Plan.steps).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable

from gpuheal.config import Config
from gpuheal.controller.effects import events, handler_for, records
from gpuheal.controller.effects.context import EffectContext, PassOutcome, WriteThrough
from gpuheal.kube.api import KubeApi
from gpuheal.kube.events import EventRecorder
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.policy.actions import Action, Emit, Evict, NodeState, Plan, RequestCheckpoint
from gpuheal.policy.devices import DeviceAction, DevicePlan

log = logging.getLogger(__name__)

# A pass's evictions in flight at once (a node's GPU pods: 8 on most GPU nodes).
EVICTIONS_IN_FLIGHT = 8


class Crashpoint:
    """Test hook: SIGKILL this process right after the N-th action of a kind
    (`AddTaint`, or `AddTaint:2`). Only the harness's controller has one
    (gpuheal/sim/crashing.py); `gpuheal controller` never does."""

    def __init__(self, spec: str | None) -> None:
        kind, _, count = (spec or "").partition(":")
        self.kind = kind
        self.remaining = int(count or "1")

    def after(self, action: Action | DeviceAction) -> None:
        if self.kind and type(action).__name__ == self.kind:
            self.remaining -= 1
            if self.remaining <= 0:
                log.warning("crashpoint reached", extra={"action": self.kind})
                os.kill(os.getpid(), signal.SIGKILL)


class Executor:
    def __init__(
        self,
        api: KubeApi,
        *,
        caches: WriteThrough,
        recorder: EventRecorder,
        metrics: ControllerMetrics,
        config: Callable[[], Config],
        crashpoint: Crashpoint | None = None,
    ) -> None:
        self.effects = EffectContext(api, caches, recorder, metrics, config)
        self.metrics = metrics
        self.crashpoint = crashpoint or Crashpoint(None)

    async def run(
        self,
        plan: Plan | DevicePlan,
        state: NodeState,
        actions: tuple[Action | DeviceAction, ...] | None = None,
        outcome: PassOutcome | None = None,
        *,
        flush: bool = True,
    ) -> PassOutcome:
        """Run `actions` (default: all of the plan's), adding to `outcome` if given;
        then write what they decided about records and send their Events, unless
        `flush` is False (the caller runs more of the same pass, and flushes)."""
        outcome = outcome or PassOutcome()
        try:
            for step in _steps(plan.actions if actions is None else actions):
                if len(step) == 1:
                    await self._run_one(plan, step[0], state, outcome)
                else:
                    await self._run_together(plan, step, state, outcome)
        except Exception:
            if flush:
                await self.flush_after_failure(outcome, state)
            raise
        if flush:
            await self.flush(outcome, state)
        return outcome

    async def _run_together(
        self,
        plan: Plan | DevicePlan,
        evictions: tuple[Action | DeviceAction, ...],
        state: NodeState,
        outcome: PassOutcome,
    ) -> None:
        """A pass's evictions at once, up to EVICTIONS_IN_FLIGHT: each is its own
        pod's request, and one after the other a storm's drains took four times
        as long as its taints. All of them finish (and are recorded) before the
        first error, if any, ends the pass."""
        gate = asyncio.Semaphore(EVICTIONS_IN_FLIGHT)

        async def one(action: Action | DeviceAction) -> None:
            async with gate:
                await self._run_one(plan, action, state, outcome)

        results = await asyncio.gather(*(one(a) for a in evictions), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _run_one(
        self,
        plan: Plan | DevicePlan,
        action: Action | DeviceAction,
        state: NodeState,
        outcome: PassOutcome,
    ) -> None:
        started = time.monotonic()
        result = await handler_for(type(action))(self.effects, action, state, outcome)
        log.info(
            "action",
            extra={
                "node": state.node.name,
                "fault_id": plan.fault_id,
                "action": type(action).__name__,
                "result": result,
                "duration_ms": round((time.monotonic() - started) * 1000, 1),
            },
        )
        if not isinstance(action, Emit):
            self.metrics.remediations.labels(type(action).__name__, result).inc()
        self.crashpoint.after(action)

    async def flush_after_failure(self, outcome: PassOutcome, state: NodeState) -> None:
        """A pass cut short by an error: what its finished actions did is still
        written (best effort: the error that cut it short is the one reported)."""
        try:
            await self.flush(outcome, state)
        except Exception as err:  # the pass's own error follows
            log.warning(
                "record not written after a failed step",
                extra={"node": state.node.name, "error": str(err)},
            )

    async def flush(self, outcome: PassOutcome, state: NodeState) -> None:
        """Write each record's news in one status PATCH, then send the pass's Events
        (they follow the record they point to)."""
        while outcome.news:
            name, news = next(iter(outcome.news.items()))
            await records.write_news(self.effects, name, news, outcome)
            del outcome.news[name]
        emits, outcome.emits = outcome.emits, []
        for action in emits:
            events.send(self.effects, action, state)
        events.tell_evictions(self.effects, outcome)


def _steps(
    actions: tuple[Action | DeviceAction, ...],
) -> list[tuple[Action | DeviceAction, ...]]:
    """The actions in order, with each run of consecutive evictions (or checkpoint
    requests) as one step: they are independent of each other, everything else
    keeps its order."""
    steps: list[tuple[Action | DeviceAction, ...]] = []
    for action in actions:
        # Checkpoint requests too: each is its own pod's write.
        if (
            isinstance(action, Evict | RequestCheckpoint)
            and steps
            and type(steps[-1][-1]) is type(action)
        ):
            steps[-1] = (*steps[-1], action)
        else:
            steps.append((action,))
    return steps
