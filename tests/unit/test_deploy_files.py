"""The deploy/ files agree with the code: dashboard metric names, Dockerfile lint."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuheal.agent.app import AgentMetrics
from gpuheal.api.server import Api, ApiSettings
from gpuheal.api.token import ApiTokens
from gpuheal.controller.notify import Notifier
from gpuheal.metrics import ControllerMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def metric_names() -> set[str]:
    registry = ControllerMetrics().registry
    Api(intake=None, settings=ApiSettings(), registry=registry, tokens=ApiTokens(None))  # type: ignore[arg-type]
    names = {m.name for m in registry.collect()}
    names |= {m.name for m in AgentMetrics().registry.collect()}
    notifier_registry = CollectorRegistry()
    Notifier((), notifier_registry)
    names |= {m.name for m in notifier_registry.collect()}
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
