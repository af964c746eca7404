"""The supervisor of a program's background work (gpuheal/supervisor.py): a crash
is said with the piece's name, counted, and restarted after a backoff, or ends
the program; what is down is named; a steady run forgets old crashes."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuheal.agent.app import Agent
from gpuheal.agent.config import AgentConfig
from gpuheal.controller.keyed import KeyedTasks
from gpuheal.supervisor import STEADY_S, OnCrash, Supervisor

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_crashed_task_is_said_counted_named_as_down_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counted: list[str] = []
    runs: list[int] = []

    async def scenario() -> None:
        supervisor = Supervisor("controller", counted=counted.append, base_s=0.05, max_s=0.05)
        restarted = asyncio.Event()

        async def loop() -> None:
            runs.append(1)
            if len(runs) == 1:
                raise KeyError("boom")
            restarted.set()
            await asyncio.Event().wait()

        supervisor.spawn("hygiene", loop)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        (down,) = supervisor.down()
        assert down.startswith("task hygiene crashed (KeyError: 'boom'; 1 in a row): restarting")
        await asyncio.wait_for(restarted.wait(), 2)
        assert supervisor.down() == [] and supervisor.running("hygiene")
        await supervisor.stop()  # no name: stops nothing
        assert supervisor.running("hygiene")
        await supervisor.stop_all()
        assert not supervisor.running("hygiene")

    with caplog.at_level(logging.ERROR, logger="gpuheal.supervisor"):
        asyncio.run(scenario())
    assert counted == ["hygiene"] and len(runs) == 2
    (said,) = caplog.records
    assert said.getMessage() == "task crashed; restarting"
    assert said.__dict__["task"] == "hygiene" and said.exc_info is not None


def test_a_crash_loop_backs_off_doubling_and_a_steady_run_starts_the_count_afresh() -> None:
    clock = Clock()
    supervisor = Supervisor("agent", clock=clock, base_s=0.5, max_s=30.0)
    delays: list[float] = []

    async def scenario() -> None:
        async def crashing() -> None:
            if len(delays) == 4:
                clock.now += STEADY_S  # the fifth run lasts a minute before it crashes
            raise RuntimeError("again")

        async def sleep(delay: float) -> None:
            delays.append(delay)
            if len(delays) == 6:
                raise asyncio.CancelledError

        real_sleep, asyncio.sleep = asyncio.sleep, sleep  # type: ignore[assignment]
        try:
            task = supervisor.spawn("resync", crashing)
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            asyncio.sleep = real_sleep

    asyncio.run(scenario())
    # Up to 10 % jitter off: 0.5, 1, 2, 4, then (after the steady run) 0.5 again.
    wanted = [0.5, 1.0, 2.0, 4.0, 0.5]
    assert all(w * 0.9 <= d <= w for w, d in zip(wanted, delays, strict=False)), delays


def test_a_task_whose_restart_is_unsafe_ends_the_program() -> None:
    ended: list[str] = []

    async def scenario() -> Supervisor:
        supervisor = Supervisor("controller", fatal=ended.append)

        async def worker() -> None:
            raise ValueError("queue bookkeeping")

        await supervisor.spawn("worker-0", worker, on_crash=OnCrash.END, kind="worker")
        return supervisor

    supervisor = asyncio.run(scenario())
    assert ended == ["worker-0"] and supervisor.failed == "worker-0"
    (down,) = supervisor.down()
    assert down == ("task worker-0 crashed (ValueError: queue bookkeeping); the controller ends")


def test_many_tasks_of_one_kind_are_counted_under_the_kind_and_forgotten_when_done() -> None:
    counted: list[str] = []

    async def scenario() -> Supervisor:
        supervisor = Supervisor("controller", counted=counted.append, base_s=0.01, max_s=0.01)
        tries: dict[str, int] = {}

        def carry_out(node: str):  # type: ignore[no-untyped-def]
            async def run() -> None:
                tries[node] = tries.get(node, 0) + 1
                if tries[node] == 1:
                    raise OSError("first try")

            return run

        tasks = [
            supervisor.spawn(f"maintenance-{n}", carry_out(n), kind="maintenance")
            for n in ("gpu-1", "gpu-2")
        ]
        await asyncio.gather(*tasks)
        return supervisor

    supervisor = asyncio.run(scenario())
    assert counted == ["maintenance", "maintenance"]
    assert supervisor.down() == [] and not supervisor.running("maintenance-gpu-1")


def test_a_crashed_thread_is_restarted_until_stopped() -> None:
    counted: list[str] = []
    stopped = threading.Event()
    supervisor = Supervisor("agent", counted=counted.append, base_s=0.01, max_s=0.01)
    runs: list[int] = []

    def follow() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad byte")
        stopped.wait()

    thread = supervisor.thread("kmsg", follow, stopped)
    thread.start()
    deadline = threading.Event()
    while len(runs) < 3 and not deadline.wait(0.01):
        pass
    assert counted == ["kmsg", "kmsg"] and thread.is_alive()
    stopped.set()
    thread.join(2)
    assert not thread.is_alive()


def test_the_main_loop_run_here_is_said_counted_and_raised() -> None:
    counted: list[str] = []
    supervisor = Supervisor("agent", counted=counted.append)

    def rounds() -> None:
        raise AttributeError("round")

    with pytest.raises(AttributeError):
        supervisor.call("rounds", rounds)
    assert counted == ["rounds"] and supervisor.failed == "rounds"


def test_a_round_of_the_agent_that_raises_ends_it_said_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's rounds are its main loop: a round that raises ends the agent
    (the kubelet restarts it, and it adopts the fault it reported), counted first."""
    (tmp_path / "boot_id").write_text("boot-1\n")
    config = AgentConfig(
        nvml_enabled=False,
        kmsg_enabled=False,
        env_enabled=False,
        state_path=tmp_path / "agent-state.json",
        boot_id_path=tmp_path / "boot_id",
    )
    agent = Agent(config, "ip-10-0-12-34.us-west-2.compute.internal", cast("Any", None), None)

    def broken_round() -> None:
        raise KeyError("a bug in a round")

    monkeypatch.setattr(agent, "run_round", broken_round)
    with pytest.raises(KeyError):
        agent.run(threading.Event())
    text = generate_latest(agent.metrics.registry).decode()
    crashed = {
        s.labels["task"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "gpuheal_agent_task_crashes_total"
    }
    assert crashed == {"rounds": 1.0} and agent.supervisor.failed == "rounds"


def test_keyed_tasks_stop_only_their_own() -> None:
    """Leadership ends: a loop's keyed tasks are cancelled, and nothing else of the
    supervisor's (with none of its own, a loop once stopped every task, the leader
    election awaiting it included: the controller hung and never led again)."""

    async def forever() -> None:
        await asyncio.Event().wait()

    async def scenario() -> None:
        supervisor = Supervisor("controller")
        supervisor.spawn("informer-nodes", forever)
        idle = KeyedTasks("rollout", supervisor)
        await idle.cancel_all()
        assert supervisor.running("informer-nodes")
        busy = KeyedTasks("maintenance", supervisor)
        busy.ensure("gpu-1", forever)
        assert busy.running("gpu-1")
        await busy.cancel_all()
        assert not busy.running("gpu-1") and supervisor.running("informer-nodes")
        await supervisor.stop_all()

    asyncio.run(scenario())
