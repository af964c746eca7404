"""One supervisor for a program's background work (the controller's tasks, the
agent's threads): each piece runs under a name; a crash is logged with that name
and its traceback, counted, and either restarted after a backoff or, where a
restart is unsafe, ends the program so that the next replica (or the kubelet's
restart) starts it clean. `down()` names what is not running, for /readyz.

Why one place: a loop started by hand with `asyncio.create_task` and no handler
of its own ends silently on the first unexpected exception (the task's exception
is only said when the task is garbage-collected), while the process looks
healthy. Here nothing ends unsaid.

The restart delay is the project's backoff (0.5 s doubling to 30 s, up to 10 %
jitter); a piece that ran `steady_s` before crashing starts its count afresh, so
a rare crash is retried quickly and a crash loop slows down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum

from gpuheal.policy.backoff import backoff_delay

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0
STEADY_S = 60.0  # a run this long before a crash restarts the crash count
ERROR_CHARS = 300


class OnCrash(Enum):
    """What a crash of the piece leads to."""

    RESTART = "restart"  # after a backoff: the piece resumes from observed state
    END = "end"  # the program ends (exit 1): a restart could not be trusted


@dataclass
class _Child:
    name: str
    on_crash: OnCrash
    kind: str  # the metric's label: the name, or the kind of many (one per node)
    started_at: float = 0.0
    crashes: int = 0  # in a row (reset after a steady run)
    error: str = ""
    restart_at: float | None = None  # while waiting to restart
    ended: str = ""  # why it no longer runs after a crash ("" while it does)


class Supervisor:
    """Runs named pieces of a program's background work and keeps them running.

    `counted(name)` is called once per crash (a metric); `fatal(name)` once when a
    piece whose restart is unsafe crashed (the program sets its stop event and
    exits non-zero)."""

    def __init__(
        self,
        program: str,
        *,
        counted: Callable[[str], None] = lambda _name: None,
        fatal: Callable[[str], None] = lambda _name: None,
        clock: Callable[[], float] = time.monotonic,
        base_s: float = BACKOFF_BASE_S,
        max_s: float = BACKOFF_MAX_S,
    ) -> None:
        self.program = program
        self._counted = counted
        self._fatal = fatal
        self._clock = clock
        self.backoff_base_s, self.backoff_max_s = base_s, max_s
        self._children: dict[str, _Child] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.failed = ""  # the piece whose crash ended the program, if one did

    # -- asyncio ------------------------------------------------------------------

    def spawn(
        self,
        name: str,
        run: Callable[[], Awaitable[None]],
        *,
        on_crash: OnCrash = OnCrash.RESTART,
        kind: str = "",
    ) -> asyncio.Task[None]:
        """Run `run()` as the task `name`; `run` is called again for each restart.
        `kind` labels its crashes in the metric when many tasks share one (a task
        per node)."""
        child = self._children[name] = _Child(name, on_crash, kind or name)
        task = asyncio.create_task(self._supervised(child, run), name=name)
        self._tasks[name] = task
        return task

    async def _supervised(self, child: _Child, run: Callable[[], Awaitable[None]]) -> None:
        while True:
            child.started_at, child.restart_at = self._clock(), None
            try:
                await run()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the point: any crash is said, counted, handled
                delay = self._crashed(child, err)
                if delay is None:
                    return
                await asyncio.sleep(delay)
            else:
                self._finished(child)
                return

    async def stop(self, *names: str) -> None:
        """Cancel the named tasks and wait for them (no name: none). A task may stop
        others (the leader's loops stop their keyed tasks), never itself."""
        tasks = [t for n in names if (t := self._tasks.pop(n, None)) is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for name in names:
            self._children.pop(name, None)

    async def stop_all(self) -> None:
        """Cancel every task and wait for them: the program's way out."""
        await self.stop(*self._tasks)

    # -- threads ------------------------------------------------------------------

    def thread(
        self,
        name: str,
        run: Callable[[], None],
        stopped: threading.Event,
        *,
        on_crash: OnCrash = OnCrash.RESTART,
    ) -> threading.Thread:
        """A daemon thread (not started) running `run()` until it returns or
        `stopped` is set; `run` is called again for each restart."""
        child = self._children[name] = _Child(name, on_crash, name)

        def supervised() -> None:
            while not stopped.is_set():
                child.started_at, child.restart_at = self._clock(), None
                try:
                    run()
                except Exception as err:  # the point: any crash is said, counted, handled
                    delay = self._crashed(child, err)
                    if delay is None or stopped.wait(delay):
                        return
                else:
                    self._finished(child)
                    return

        return threading.Thread(target=supervised, name=name, daemon=True)

    def call(self, name: str, run: Callable[[], None]) -> None:
        """Run `run()` here, in the calling thread (a program's main loop): a crash
        is said and counted as any other, and ends the program (raised again)."""
        child = self._children[name] = _Child(name, OnCrash.END, name, self._clock())
        try:
            run()
        except Exception as err:
            self._crashed(child, err)
            raise
        self._finished(child)

    # -- what happened ------------------------------------------------------------

    def _crashed(self, child: _Child, err: Exception) -> float | None:
        """Say and count the crash; the delay before the restart, or None when the
        program ends instead."""
        now = self._clock()
        if now - child.started_at >= STEADY_S:
            child.crashes = 0
        child.crashes += 1
        child.error = f"{type(err).__name__}: {str(err)[:ERROR_CHARS]}"
        self._counted(child.kind)
        if child.on_crash is OnCrash.END:
            child.ended = f"crashed ({child.error}); the {self.program} ends"
            log.critical(
                "task crashed; ending the program",
                exc_info=err,
                extra={"task": child.name, "program": self.program, "error": child.error},
            )
            self.failed = self.failed or child.name
            self._fatal(child.name)
            return None
        delay = backoff_delay(child.crashes, self.backoff_base_s, self.backoff_max_s, jitter=0.1)
        child.restart_at = now + delay
        log.error(
            "task crashed; restarting",
            exc_info=err,
            extra={
                "task": child.name,
                "program": self.program,
                "error": child.error,
                "crashes": child.crashes,
                "restart_in_s": round(delay, 2),
            },
        )
        return delay

    def _finished(self, child: _Child) -> None:
        """A piece that returned is done: forgotten (a task per node comes and goes)."""
        if self._children.get(child.name) is child:
            del self._children[child.name]
            self._tasks.pop(child.name, None)
        log.debug("task finished", extra={"task": child.name, "program": self.program})

    def down(self) -> list[str]:
        """A sentence per piece that is not running as it should: waiting to
        restart after a crash, or ended by one."""
        said = []
        for child in self._children.values():
            if child.restart_at is not None:
                wait = max(child.restart_at - self._clock(), 0.0)
                said.append(
                    f"task {child.name} crashed ({child.error}; {child.crashes} in a row): "
                    f"restarting in {wait:.1f}s"
                )
            elif child.ended.startswith("crashed"):
                said.append(f"task {child.name} {child.ended}")
        return said

    def running(self, name: str) -> bool:
        task = self._tasks.get(name)
        return task is not None and not task.done()
