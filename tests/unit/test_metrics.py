"""The programs' metrics: declared in gpuheal/metrics/ only, and the gauges of the
fleet's state read it when scraped (no server: nothing here is sent to one)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import gpuheal
from gpuheal.config import Config
from gpuheal.controller.app import Controller
from gpuheal.kube.api import KubeApi
from gpuheal.kube.kubeconfig import RestConfig
from tests.corpus import EKS_NODES

PACKAGE = Path(gpuheal.__file__).parent
METRICS = PACKAGE / "metrics"
# What makes a metric: the client's metric classes, a family a collector yields,
# a collector of one's own.
MAKERS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum", "Collector"}


def _device_gauges(controller: Controller) -> tuple[float | None, ...]:
    registry = controller.metrics.registry
    return tuple(
        registry.get_sample_value(f"gpuheal_devices_{state}")
        for state in ("unknown", "suspect", "quarantined")
    )


def test_the_device_gauges_follow_the_reconcilers_counts_when_scraped() -> None:
    # Nothing here is sent: the API's session opens on the first request.
    api = KubeApi(RestConfig("https://127.0.0.1:1", "unit"))
    controller = Controller(Config(), api, "unit")
    counts = controller.reconciler.device_counts
    first, second, third = EKS_NODES[:3]
    assert _device_gauges(controller) == (0, 0, 0)

    counts[first] = (2, 1, 0)
    counts[second] = (0, 1, 3)
    assert _device_gauges(controller) == (2, 2, 3)

    counts[first] = (0, 0, 1)
    counts[third] = (1, 0, 0)
    assert _device_gauges(controller) == (1, 1, 4)

    # A node gone from the cache: its reconcile forgets its counts, and the gauges with them.
    asyncio.run(controller.reconciler.reconcile(second))
    assert second not in counts
    assert _device_gauges(controller) == (1, 0, 1)


def metric_definitions(paths: list[Path]) -> list[str]:
    """`path:line name` of each place that makes a metric: a call of one of
    prometheus_client's metric classes or of a collector's metric family, or a
    Collector of its own (by the names imported from prometheus_client)."""
    found = []
    for path in paths:
        module = ast.parse(path.read_text(), str(path))
        makers = {
            alias.asname or alias.name
            for node in ast.walk(module)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus")
            for alias in node.names
            if alias.name in MAKERS or alias.name.endswith("MetricFamily")
        }
        for node in ast.walk(module):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                named = [node.func]
            elif isinstance(node, ast.ClassDef):
                named = [base for base in node.bases if isinstance(base, ast.Name)]
            else:
                continue
            rel = path.relative_to(PACKAGE.parent)
            found += [f"{rel}:{node.lineno} {name.id}" for name in named if name.id in makers]
    return found


def test_no_module_outside_gpuheal_metrics_defines_a_metric() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    inside = [path for path in modules if path.is_relative_to(METRICS)]
    # The check sees what it looks for: the declarations and the kernel log's collector.
    assert {line.split()[-1] for line in metric_definitions(inside)} >= {
        "Counter",
        "Gauge",
        "Histogram",
        "CounterMetricFamily",
        "Collector",
    }
    outside = [path for path in modules if not path.is_relative_to(METRICS)]
    assert metric_definitions(outside) == []
