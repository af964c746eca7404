"""gpuheal_hygiene_*: the controller's latest fleet-hygiene examination, read when
scraped (controller/hygiene.py runs it). Labels are bounded: the finding's kind
(policy/hygiene.KINDS) and the pool (the pool label's values, tens in a fleet),
never the node: `gpuheal audit` names the nodes, from the same checks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuheal.policy.hygiene import KINDS, Examined


class HygieneCollector(Collector):
    """Every kind for every pool examined, from 0, so an alert on `> 0` and a graph
    both see a finding end; nothing before the first examination."""

    def __init__(self, last: Callable[[], Examined | None]) -> None:
        self.last = last

    def collect(self) -> Iterator[Metric]:
        run = self.last()
        if run is None:
            return
        seen = run.examination
        counts = Counter((f.kind, f.pool) for f in seen.findings)
        findings = GaugeMetricFamily(
            "gpuheal_hygiene_findings",
            "Fleet hygiene findings (gpuheal audit's checks) by kind and pool, from the"
            " latest examination of the controller's caches.",
            labels=["kind", "pool"],
        )
        for pool in sorted({*seen.pools, *(p for _, p in counts)}):
            for kind in KINDS:
                findings.add_metric([kind, pool], counts[(kind, pool)])
        yield findings
        yield GaugeMetricFamily(
            "gpuheal_hygiene_gpu_nodes", "GPU nodes the latest examination saw.", value=seen.nodes
        )
        yield GaugeMetricFamily(
            "gpuheal_hygiene_last_run_timestamp_seconds",
            "Unix time of the latest hygiene examination.",
            value=run.at,
        )
        yield GaugeMetricFamily(
            "gpuheal_hygiene_run_duration_seconds",
            "How long the latest hygiene examination took.",
            value=run.duration_s,
        )
