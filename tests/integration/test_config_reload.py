"""A real controller process given a bad config: at start, and on SIGHUP."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client

from gpuheal.sim import ControlPlane
from gpuheal.sim.controller import ControllerProcess
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    our_taint,
    report_fault,
)

pytestmark = pytest.mark.timeout(240)

REFUSED = "config reload refused; keeping the running config"


def log_lines(controller: ControllerProcess, msg: str) -> list[dict[str, Any]]:
    lines = []
    for line in controller.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == msg:
            lines.append(entry)
    return lines


def refused(controller: ControllerProcess, message: str) -> bool:
    return any(message in e["error"] for e in log_lines(controller, REFUSED))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"breakerMaxPercent": float("nan")}, "breakerMaxPercent: must be a finite number"),
        ({"workers": 100_000}, "workers: must be between 1 and 64, got 100000"),
        ({"apiTokenFile": "/var/run/gpuheal/token/token"}, "apiTokenFile: cannot read"),
    ],
)
def test_a_bad_config_stops_the_start_naming_the_key(
    control_plane: ControlPlane, crds: None, tmp_path: Path, bad: dict[str, Any], message: str
) -> None:
    config = {**controller_config({"gpuheal.test/pool": tmp_path.name}), **bad}
    controller = ControllerProcess(tmp_path, control_plane.kubeconfig, config, identity="bad")
    controller.component.start()
    # Before: NaN and 100000 workers started; a missing token file crashed with a traceback.
    assert controller.wait_exit(30) == 2
    assert message in controller.log()
    assert "Traceback" not in controller.log()


def test_a_bad_config_on_sighup_is_refused_and_the_running_one_kept(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    tmp_path: Path,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    token = tmp_path / "token"
    token.write_text("d3c0de-7e57-t0ken\n")
    good = controller_config(pool, apiTokenFile=str(token))
    controller = start_controller(good)
    bad_configs: list[tuple[dict[str, Any], str]] = [
        ({"breakerMaxPercent": float("nan")}, "breakerMaxPercent: must be a finite number"),
        ({"workers": 100_000}, "workers: must be between 1 and 64"),
        ({"apiTokenFile": str(tmp_path / "rotated-away")}, "apiTokenFile: cannot read"),
    ]
    for bad, message in bad_configs:
        controller.config_path.write_text(yaml.safe_dump({**good, **bad}))  # NaN as .nan
        controller.hangup()
        key = message.split(":")[0]
        wait_for(f"the reload refused naming {key}", partial(refused, controller, message), 20)
        assert all(e["level"] == "error" for e in log_lines(controller, REFUSED))
    assert log_lines(controller, "config reloaded") == []

    # The running config (breakerMaxPercent 100) still quarantines.
    report_fault(kube, node, f"{node}-20261201T023012Z-c0ffee")
    wait_for("the node quarantined", lambda: our_taint(kube, node), timeout_s=30)

    # A good config is applied on the next SIGHUP.
    controller.config_path.write_text(yaml.safe_dump({**good, "mode": "observe"}))
    controller.hangup()
    wait_for("the good config applied", lambda: log_lines(controller, "config reloaded"))
    assert log_lines(controller, "config reloaded")[-1]["mode"] == "observe"
