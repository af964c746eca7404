"""The deploy/ files agree with the code: dashboard metric names, Dockerfile lint."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from gpuheal.metrics.agent import AgentMetrics
from gpuheal.metrics.controller import ControllerMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def metric_names() -> set[str]:
    """Every program's metrics: the controller's (its API and notifier included) and the agent's."""
    names = {m.name for m in ControllerMetrics().registry.collect()}
    names |= {m.name for m in AgentMetrics().registry.collect()}
    # Counters are exposed with _total, histograms with _bucket/_sum/_count.
    return names | {f"{n}_total" for n in names} | {f"{n}_bucket" for n in names}


def test_every_dashboard_query_uses_metrics_that_exist() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboard.json").read_text())
    known = metric_names()
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bgpuheal_[a-z_]+", target["expr"])
    }
    assert used and used <= known, used - known


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run(
        [hadolint, str(DEPLOY / "docker" / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
