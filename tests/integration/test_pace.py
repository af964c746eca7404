"""A fault storm at the pace the chart ships: the rate limit and the breaker at
their defaults (the chart's rendered controller config, not a test's raised
values), proved from the API server's audit log; and the evidence the storm
leaves: the queue depth rising and falling, every action's JSON log line.

A token bucket bounds how many taints any stretch of time holds, not each gap: a
take that comes late banks the lateness, and the next gap is that much shorter
(measured: 0.42 to 0.52 s between consecutive taints at 2/s). So the spacing
asserted is the bucket's own law, from the storm's start: the k-th new
quarantine (from 0) cannot reach the server before (k + 1 - burst) / rate
seconds have passed. The server's stamp of a taint PATCH is later than its token,
and the storm's start (this process's clock, the same host's) earlier than the
first token: the bound holds with no allowance at all.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client

from gpuheal.clock import parse_time
from gpuheal.config import Config, parse_config
from gpuheal.model import TAINT_KEY, Phase
from gpuheal.policy.breaker import quarantine_capacity
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.controller import ControllerProcess
from tests.helpers import FakeNodes, unique, wait_for
from tests.integration.chart import render
from tests.integration.conftest import (
    StartController,
    faults_of,
    our_taint,
    record_phase,
    report_fault,
)
from tests.integration.test_failures import metric

pytestmark = pytest.mark.timeout(180)

# 10% of 100 GPU nodes is 10, the absolute cap too: the breaker as documented.
NODES = 100
FAULTY = 16  # 10 fenced, 6 Held
PACE = ("rate_limit_per_second", "rate_limit_burst", "breaker_max_nodes", "breaker_max_percent")
# The defaults docs/operations.md's arithmetic is about.
SHIPPED_PACE = {
    "rate_limit_per_second": 2.0,
    "rate_limit_burst": 2,
    "breaker_max_nodes": 10,
    "breaker_max_percent": 10.0,
}
ACTION_FIELDS = {"node": str, "fault_id": str, "action": str, "result": str}


def pace(config: Config) -> dict[str, Any]:
    return {key: getattr(config, key) for key in PACE}


def shipped_config(
    control_plane: ControlPlane, tmp_path: Path, pool: dict[str, str]
) -> dict[str, Any]:
    """The chart's controller config as `helm template` renders it with the default
    values, for this test's pool and in quarantine mode (the chart starts in observe,
    which writes nothing to Nodes: the staged roll-out's next stage)."""
    objects = render(control_plane, "gh", "gpuheal-system")
    configmap = next(
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gh-controller"
    )
    chart = yaml.safe_load(configmap["data"]["config.yaml"])
    token = tmp_path / "api-token"
    token.write_text("t\n")
    config = {**chart, "mode": "quarantine", "nodeSelector": pool, "apiTokenFile": str(token),
              "leaderElection": {**chart["leaderElection"], "name": unique("pace")}}  # fmt: skip
    # The pace is the chart's, and the chart's is Config()'s: it sets none of the keys.
    assert pace(parse_config(config)) == pace(parse_config(chart)) == pace(Config()) == SHIPPED_PACE
    return config


class DepthSampler:
    """gpuheal_queue_depth scraped every 20 ms in a thread, until stopped."""

    def __init__(self, controller: ControllerProcess) -> None:
        self.controller = controller
        self.seen: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.seen.append(metric(self.controller, "gpuheal_queue_depth"))
            except OSError:  # a scrape the busy controller answered late: the next one
                continue

    def __enter__(self) -> DepthSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def new_quarantines(made: list[audit.Request], nodes: set[str]) -> list[audit.Request]:
    """The first successful PATCH carrying our taint of each node, in the server's order."""
    first: dict[str, audit.Request] = {}
    for r in made:
        ours = (r.verb, r.resource, r.code) == ("patch", "nodes", 200) and r.name in nodes
        if ours and r.name not in first and TAINT_KEY in json.dumps(r.body):
            first[r.name] = r
    return sorted(first.values(), key=lambda r: r.at)


def held(kube: Client, nodes: list[str]) -> list[str]:
    return [n for n in nodes if any(record_phase(r) == Phase.HELD for r in faults_of(kube, n))]


def action_lines(log: str) -> list[dict[str, Any]]:
    """The controller's log is JSON lines (docs/controller.md): each line parsed,
    and each action's fields there and typed."""
    entries = []
    for line in log.splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a log line that is not JSON: {line[:300]}")
    actions = [e for e in entries if e.get("msg") == "action"]
    for entry in actions:
        for field, kind in ACTION_FIELDS.items():
            assert isinstance(entry.get(field), kind), f"{field} of {entry}"
        assert entry["node"] and entry["action"] and entry["result"], entry
        took = entry.get("duration_ms")
        assert isinstance(took, int | float) and took >= 0, f"duration_ms of {entry}"
    return actions


def told(actions: list[dict[str, Any]], action: str, result: str) -> set[tuple[str, str]]:
    """(node, fault id) of the action lines saying `action` came to `result`."""
    wanted = (action, result)
    return {(a["node"], a["fault_id"]) for a in actions if (a["action"], a["result"]) == wanted}


def test_a_storm_at_the_shipped_pace_is_fenced_two_at_once_then_two_a_second_up_to_the_breaker(
    kube: Client,
    control_plane: ControlPlane,
    tmp_path: Path,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    audited_controller_user: str,
    start_controller: StartController,
) -> None:
    config = shipped_config(control_plane, tmp_path, pool)
    shipped = parse_config(config)
    rate, burst = shipped.rate_limit_per_second, shipped.rate_limit_burst
    cap = quarantine_capacity(NODES, shipped)
    assert cap == 10
    faulty = fake_gpu_nodes(NODES, labels=pool)[:FAULTY]
    fault_of = {node: f"storm-{i}" for i, node in enumerate(faulty)}
    controller = start_controller(config, user=audited_controller_user).wait_leading()
    since = audit.offset(control_plane.audit_log)

    with DepthSampler(controller) as depth:
        began = dt.datetime.now(dt.UTC)
        for node in faulty:
            report_fault(kube, node, fault_of[node])
        heldback = FAULTY - cap
        wait_for(f"{heldback} faults Held", lambda: len(held(kube, faulty)) == heldback, 30)
    wait_for("the queue empty", lambda: metric(controller, "gpuheal_queue_depth") == 0)

    made = list(audit.requests(control_plane.audit_log, user=audited_controller_user, since=since))
    fenced = new_quarantines(made, set(faulty))
    after = [(parse_time(r.at) - began).total_seconds() for r in fenced]  # type: ignore[operator]
    print("taints, seconds after the storm began:", [f"{s:.6f}" for s in after])
    print(f"queue depth: {len(depth.seen)} samples, max {max(depth.seen, default=0)}")
    # The breaker: never more than its cap fenced; the rest Held, untainted.
    tainted = [n for n in faulty if our_taint(kube, n) is not None]
    assert len(fenced) == cap
    assert sorted(r.name for r in fenced) == sorted(tainted)
    assert sorted(held(kube, faulty)) == sorted(set(faulty) - set(tainted))
    # The rate limit: the k-th taint no sooner than its tokens allow...
    for k, seconds in enumerate(after):
        assert seconds >= (k + 1 - burst) / rate, f"taint {k} at {seconds:.6f}s: {after}"
    # ...and the burst's taints at once, before the bucket could refill one token.
    assert after[burst - 1] - after[0] < 1 / rate, after
    # The queue: nodes waited in it during the storm, and it emptied after.
    assert max(depth.seen, default=0) > 0, depth.seen

    controller.stop()  # its log whole: no line cut short
    actions = action_lines(controller.log())
    assert told(actions, "AddTaint", "tainted") == {(n, fault_of[n]) for n in tainted}
    untainted = set(faulty) - set(tainted)
    assert told(actions, "UpdateRecord", Phase.HELD) == {(n, fault_of[n]) for n in untainted}
