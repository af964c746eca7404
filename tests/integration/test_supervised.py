"""Every background loop of the controller runs under its supervisor
(gpuheal/supervisor.py), against the real API server: a failure injected into each
loop is said with the loop's name, counted in gpuheal_task_crashes_total, and the
loop runs again; one that stays down is named by /readyz; a worker's crash ends
the controller with exit 1 and the lease handed over.

The controller runs in this process (its event loop in a thread of the test), so
each loop can be made to fail where it starts: the supervisor's `spawn` is wrapped
to raise on a loop's first run. The set of loops is asserted too: a loop started
by hand, outside the supervisor, fails the test by its absence."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.coordination_v1 import Lease
from prometheus_client.parser import text_string_to_metric_families

from gpuheal.config import parse_config
from gpuheal.controller.app import Controller, RunOptions
from gpuheal.kube.api import KubeApi
from gpuheal.sim import ControlPlane
from gpuheal.sim.monitoring import Monitoring
from gpuheal.supervisor import Supervisor
from tests.helpers import unique, wait_for
from tests.integration.chart import alert_rules
from tests.integration.conftest import controller_config

pytestmark = pytest.mark.integration

# Every loop a replica runs, and the leader's (one worker: workers 1).
EVERY_REPLICA = {
    "api-tokens",
    "resync",
    "notifier",
    "config",
    "dcgm",
    "hygiene",
    "crds",
    "leader-election",
    *(
        f"informer-{name}"
        for name in (
            "nodes",
            "pods",
            "gpufaults",
            "canaries",
            "gpurollouts",
            "validations",
            "events",
            "resourceslices",
            "resourceclaims",
            "devicetaintrules-v1",
            "devicetaintrules-v1beta2",
        )
    ),
}
LEADER = {"worker-0", "rollouts", "maintenance-requests", "retention", "sweep"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Failing:
    """Wraps Supervisor.spawn: the named tasks raise on their first run (or on
    every run, `always`); records every task spawned."""

    def __init__(self, once: set[str], always: set[str]) -> None:
        self.once, self.always = set(once), set(always)
        self.spawned: set[str] = set()
        self.failed: list[str] = []
        self._spawn = Supervisor.spawn

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def spawn(
            supervisor: Supervisor, name: str, run: Callable[[], Awaitable[None]], **kw: Any
        ) -> asyncio.Task[None]:
            self.spawned.add(name)

            async def failing_first() -> None:
                if name in self.always or name in self.once:
                    self.once.discard(name)
                    self.failed.append(name)
                    raise RuntimeError(f"injected into {name}")
                await run()

            return self._spawn(supervisor, name, failing_first, **kw)

        monkeypatch.setattr(Supervisor, "spawn", spawn)


@contextmanager
def controller_in_thread(
    cp: ControlPlane,
    config: dict[str, Any],
    tmp_path: Path,
    backoff_max_s: float | None = None,
) -> Iterator[tuple[Controller, int, Callable[[], int | None]]]:
    """A Controller run in a thread's event loop; yields it, its port and a
    function giving run()'s exit code once it has returned (None before)."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    result: dict[str, int] = {}
    ready = threading.Event()
    holder: dict[str, Controller] = {}

    async def main() -> None:
        api = KubeApi.from_kubeconfig(cp.kubeconfig)
        controller = Controller(parse_config(config), api, unique("supervised"))
        if backoff_max_s is not None:  # a crash loop fast enough for an alert in seconds
            controller.supervisor.backoff_max_s = backoff_max_s
        holder["c"] = controller
        ready.set()
        options = RunOptions(config_path=path, listen_host="127.0.0.1", listen_port=port)
        try:
            result["rc"] = await controller.run(stop, options)
        finally:
            await api.close()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    ready.wait(30)
    try:
        yield holder["c"], port, lambda: result.get("rc")
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


def crashes(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return {
        s.labels["task"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "gpuheal_task_crashes"
        for s in family.samples
        if s.name == "gpuheal_task_crashes_total"
    }


def readyz(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz") as answer:
            return dict(json.loads(answer.read()))
    except urllib.error.HTTPError as err:
        return dict(json.loads(err.read()))


def test_a_failure_in_each_loop_is_said_counted_and_the_loop_runs_again(
    control_plane: ControlPlane,
    crds: None,
    pool: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prometheus is not there: the DCGM loop runs (and says it cannot ask).
    config = controller_config(pool, workers=1, dcgmPrometheusUrl="http://127.0.0.1:9")
    # Each loop whose restart is safe fails once; resync fails every time. (A crash
    # of a worker or of the election ends the controller: the next tests.)
    restarted = (EVERY_REPLICA | LEADER) - {"worker-0", "leader-election"}
    failing = Failing(once=restarted, always={"resync"})
    failing.install(monkeypatch)
    with (
        caplog.at_level(logging.ERROR, logger="gpuheal.supervisor"),
        controller_in_thread(control_plane, config, tmp_path, backoff_max_s=0.5) as (ctl, port, rc),
    ):
        wait_for(
            "every loop failed once",
            lambda: set(failing.failed) >= restarted,
            timeout_s=30,
        )
        wait_for("leading", lambda: readyz(port).get("leader"))
        assert failing.spawned == EVERY_REPLICA | LEADER
        counted = wait_for("every crash counted", lambda: _all_of(crashes(port), restarted))
        assert counted is not None
        assert all(counted[name] == 1 for name in restarted - {"resync"}), counted
        # The others run again; resync, failing at every start, is named as down.
        lines = wait_for("only resync down", lambda: _one(ctl.supervisor.down()))
        assert lines is not None
        (down,) = lines
        assert down.startswith("task resync crashed (RuntimeError: injected into resync")
        said = readyz(port)
        assert said["ready"] is True and down.split(":")[0] in " ".join(said["reasons"]), said
        _crashing_alert_fires(control_plane, port, tmp_path)
        assert rc() is None  # nothing ended the controller
    told = [r.__dict__["task"] for r in caplog.records if r.getMessage().startswith("task crashed")]
    assert set(told) >= restarted and told.count("hygiene") == 1


def _crashing_alert_fires(control_plane: ControlPlane, port: int, tmp_path: Path) -> None:
    """The chart's alert on a task that keeps crashing, in a real Prometheus that
    scrapes the controller: it fires for resync, and for no other task."""
    rules = alert_rules(control_plane, "gpuheal-self")
    (rule,) = [r for r in rules if r["alert"] == "GPUHealTaskCrashing"]
    token = tmp_path / "token"
    token.write_text("unused\n")
    monitoring = Monitoring(
        tmp_path / "monitoring",
        targets=[f"127.0.0.1:{port}"],
        rules=[rule],
        webhook_url="http://127.0.0.1:9/unused",
        token_file=token,
        job="gpuheal-controller",
    ).start()
    try:
        wait_for(
            "GPUHealTaskCrashing firing for resync",
            lambda: _firing_tasks(monitoring.prometheus_url) == {"resync"},
            timeout_s=90,
        )
    finally:
        monitoring.stop()


def _firing_tasks(prometheus_url: str) -> set[str]:
    with urllib.request.urlopen(f"{prometheus_url}/api/v1/alerts", timeout=5) as response:  # noqa: S310
        alerts = json.load(response)["data"]["alerts"]
    return {a["labels"]["task"] for a in alerts if a["state"] == "firing"}


def _all_of(counted: dict[str, float], names: set[str]) -> dict[str, float] | None:
    return counted if set(counted) >= names else None


def _one(lines: list[str]) -> list[str] | None:
    return lines if len(lines) == 1 else None


def test_a_worker_crash_ends_the_controller_and_hands_the_lease_over(
    control_plane: ControlPlane,
    kube: Client,
    crds: None,
    pool: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker that dies outside a reconcile leaves the queue's bookkeeping in
    doubt: the controller ends (exit 1), releasing its lease on the way out, so a
    standby takes over at once rather than after the lease runs out."""
    config = controller_config(pool, workers=1)
    Failing(once=set(), always={"worker-0"}).install(monkeypatch)
    lease = config["leaderElection"]["name"]
    with controller_in_thread(control_plane, config, tmp_path) as (ctl, _port, rc):
        assert wait_for("the controller ended", rc) == 1
        assert ctl.supervisor.failed == "worker-0"
        held = kube.get(Lease, lease, namespace="gpuheal-system")
        assert held.spec is not None and not held.spec.holderIdentity


def test_a_crash_of_the_election_ends_the_controller(
    control_plane: ControlPlane,
    crds: None,
    pool: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Restarting an election loop that crashed could lead on a loop nobody can
    trust: the controller ends instead (exit 1) and never leads."""
    config = controller_config(pool, workers=1)
    failing = Failing(once=set(), always={"leader-election"})
    failing.install(monkeypatch)
    with controller_in_thread(control_plane, config, tmp_path) as (ctl, _port, rc):
        assert wait_for("the controller ended", rc) == 1
        assert ctl.supervisor.failed == "leader-election"
        assert "worker-0" not in failing.spawned
