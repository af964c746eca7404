"""The deploy/ files agree with the code: dashboard metric names, Dockerfile lint, the
chart's Xid lists, the node-problem-detector monitor config and dcgm-exporter counters file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from gpuheal.kube import crds
from gpuheal.metrics.agent import AgentMetrics
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.sim.monitoring import OPTIONAL_COUNTERS
from gpuheal.sources.dcgm import queries as dcgm_queries

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


def test_the_charts_xid_lists_are_the_catalogues() -> None:
    """templates/_xids.tpl is what tools/chart_xids.py makes of gpuheal.xid: the
    chart's GPUXidError fires on the node-fault Xids the controller acts on."""
    done = subprocess.run(
        [sys.executable, str(DEPLOY.parent / "tools" / "chart_xids.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_npd_monitor_config_and_the_charts_copy_are_the_catalogues() -> None:
    """deploy/npd/nvidia-monitor.json and the chart's files/ copy are what
    tools/npd_config.py makes of gpuheal.xid (tests/unit/test_sources_npd.py checks
    what its rules match)."""
    done = subprocess.run(
        [sys.executable, str(DEPLOY.parent / "tools" / "npd_config.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_charts_counters_file_lists_every_counter_gpuheal_reads() -> None:
    """dcgmCounters.lines: a line for each counter a DCGM query or a rule reads, as
    dcgm-exporter's counters file writes it (field, type, help), and no more."""
    values = yaml.safe_load((DEPLOY / "helm" / "gpuheal" / "values.yaml").read_text())
    lines = [
        [part.strip() for part in line.split(",", 2)] for line in values["dcgmCounters"]["lines"]
    ]
    read = {m for q in dcgm_queries(85, 95) for m in q.needs}
    fields = {name for name, _, _ in lines}
    assert read <= fields
    exported = {c.name: c for c in OPTIONAL_COUNTERS}
    assert fields == set(exported) | {"DCGM_FI_DRIVER_VERSION"}
    for name, kind, text in lines:
        if name in exported:
            assert (kind, text) == (exported[name].kind, exported[name].help), name
    rules = (DEPLOY / "helm" / "gpuheal" / "templates" / "monitoring.yaml").read_text()
    assert set(re.findall(r"\bDCGM_[A-Z_]+", rules)) <= fields


def test_the_shipped_crds_carry_their_schema_digest_and_every_copy_is_the_same() -> None:
    """gpuheal/crds (what `gpuheal crds apply` installs and the controller compares
    with) = deploy/crds = the chart's crds/, each with its spec's digest."""
    done = subprocess.run(
        [sys.executable, str(DEPLOY.parent / "tools" / "crd_digest.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    shipped = crds.shipped()
    assert set(shipped) == {"gpufaults.gpuheal.io", "gpurollouts.gpuheal.io"}
    for manifest in shipped.values():
        wanted = manifest["metadata"]["annotations"][crds.DIGEST_ANNOTATION]
        assert wanted == crds.digest(manifest["spec"])


def test_the_values_schema_is_the_config_declarations_and_values_yaml() -> None:
    """deploy/helm/gpuheal/values.schema.json is what tools/values_schema.py makes of
    values.yaml and the programs' config declarations: a new key is in it."""
    done = subprocess.run(
        [sys.executable, str(DEPLOY.parent / "tools" / "values_schema.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    schema = json.loads((DEPLOY / "helm" / "gpuheal" / "values.schema.json").read_text())
    config = schema["properties"]["controller"]["properties"]["config"]
    assert config["additionalProperties"] is False and "breakerMaxNodes" in config["properties"]
    pools = config["properties"]["pools"]["properties"]["byName"]["additionalProperties"]
    assert "gpusPerNode" in pools["properties"]
    agent = schema["properties"]["agent"]["properties"]["config"]
    assert "repairRebootSentinel" in agent["properties"]
