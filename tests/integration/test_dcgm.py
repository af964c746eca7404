"""The DCGM source against the real Prometheus (Debian's package), fed by a fake
dcgm-exporter that publishes the series and labels dcgm-exporter really does,
on EKS-style node names.

Most tests drive the source itself (no control plane): its fault ids, how it
reads the sticky Xid gauge and the windowed Xid count, what it says of counters
dcgm-exporter does not export, what it does with samples no fault can be made
of, and with a Prometheus that fails. The last ones run it inside real
controller processes (tests/integration/test_dcgm_catalogue.py: the whole
fleet of cases, through the chart's own rules too)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from lightkube import Client

from gpuheal.controller.dcgm_source import DcgmSource
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import FaultSignal, Severity
from gpuheal.sim.monitoring import (
    CLOCK_EVENTS,
    DEFAULT_COUNTERS,
    OPTIONAL_COUNTERS,
    FakeDcgmExporter,
    Monitoring,
)
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes, wait_nodes_ready
from gpuheal.sources.dcgm import (
    XID_GAUGE,
    XID_WINDOW,
    Query,
    host_matchers,
    last_value_query,
    node_xid_query,
    presence_query,
    run_starts_query,
    window_query,
)
from gpuheal.sources.dcgm import queries as dcgm_queries
from gpuheal.sources.xids import Observed
from gpuheal.values import is_label_value
from tests.corpus import FQDN_253, GPU_UUIDS, dcgm_labels, unique_eks_node
from tests.helpers import wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    our_taint,
)
from tests.port import Port

pytestmark = pytest.mark.timeout(240)

XID = "DCGM_FI_DEV_XID_ERRORS"
DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
TEMP = "DCGM_FI_DEV_GPU_TEMP"
SOURCE_LOG = "gpuheal.controller.dcgm_source"


@dataclass
class Heard:
    """What a source told the controller."""

    submitted: list[FaultSignal] = field(default_factory=list)
    resolved: list[tuple[str, str]] = field(default_factory=list)
    observed: list[Observed] = field(default_factory=list)

    def observe(self, seen: Observed) -> None:
        self.observed.append(seen)

    def submit(self, signal: FaultSignal) -> bool:
        self.submitted.append(signal)
        return True

    def resolve(self, node: str, fault_id: str) -> int:
        self.resolved.append((node, fault_id))
        return 1

    def ids(self, node: str | None = None) -> list[str]:
        found = [s.fault_id for s in self.submitted if node is None or s.node == node]
        return list(dict.fromkeys(found))


@pytest.fixture
def exporter(request: pytest.FixtureRequest) -> Iterator[FakeDcgmExporter]:
    """dcgm-exporter with its default counters; `@pytest.mark.parametrize("exporter",
    [OPTIONAL_COUNTERS], indirect=True)`: with the optional fields enabled."""
    started = FakeDcgmExporter(getattr(request, "param", DEFAULT_COUNTERS)).start()
    yield started
    started.stop()


@pytest.fixture
def prometheus(tmp_path: Path, exporter: FakeDcgmExporter) -> Iterator[Monitoring]:
    token = tmp_path / "token"
    token.write_text("unused\n")
    monitoring = Monitoring(
        tmp_path / "monitoring",
        targets=[f"127.0.0.1:{exporter.port}"],
        rules=[],
        webhook_url="http://127.0.0.1:9/unused",
        token_file=token,
    ).start()
    yield monitoring
    monitoring.stop()


def source(
    prometheus: Monitoring,
    heard: Heard,
    nodes: set[str],
    *,
    metrics: ControllerMetrics | None = None,
    queries: list[Query] | None = None,
    managed: Callable[[str], bool] | None = None,
) -> DcgmSource:
    """A source as the controller makes one, polling every second; a new one is
    what a restarted controller, or the standby taking over, starts with."""
    return DcgmSource(
        prometheus.prometheus_url,
        1.0,
        queries or dcgm_queries(85, 95, application_xids_per_gpu=3),
        port=Port(heard.submit, heard.resolve, managed or nodes.__contains__),
        metrics=metrics or ControllerMetrics(),
        observe=heard.observe,
        settle_s=1.0,
    )


# What these tests assert is what Prometheus answers, not how fast: Prometheus bounds
# an evaluation itself (its `timeout` parameter; an error answer past it), and the
# client waits for that answer. A 5 s client limit failed the widest lookup (10,000
# points, as the controller asks) twice while a Kubernetes build loaded the machine.
PROMETHEUS_EVALUATION_S = 60


def series(prometheus: Monitoring, expr: str) -> list[object]:
    query = urllib.parse.urlencode({"query": expr, "timeout": f"{PROMETHEUS_EVALUATION_S}s"})
    url = f"{prometheus.prometheus_url}/api/v1/query?{query}"
    wait_s = PROMETHEUS_EVALUATION_S + 10
    with urllib.request.urlopen(url, timeout=wait_s) as response:  # noqa: S310 -- loopback
        result: list[object] = json.load(response)["data"]["result"]
        return result


def wait_scraped(prometheus: Monitoring, expr: str, count: int) -> None:
    wait_for(f"{count} series of {expr}", lambda: len(series(prometheus, expr)) == count)


async def poll_until(
    what: str,
    dcgm: DcgmSource,
    session: aiohttp.ClientSession,
    check: Callable[[], object],
    timeout_s: float = 30,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await dcgm.poll(session)
        await asyncio.sleep(0.2)


async def run_until(
    what: str, dcgm: DcgmSource, check: Callable[[], object], timeout_s: float = 30
) -> None:
    """Run the source's own loop until `check`; the loop must still be running."""
    task = asyncio.create_task(dcgm.run())
    try:
        deadline = time.monotonic() + timeout_s
        while not check() and not task.done():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
            await asyncio.sleep(0.1)
        if task.done():
            task.result()  # its exception, if it died of one
            raise AssertionError("the DCGM source's loop ended")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def value(metrics: ControllerMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


# -- fault ids: the episode as Prometheus sees it ---------------------------


def test_every_query_and_its_episode_lookup_is_promql_prometheus_runs(
    prometheus: Monitoring,
) -> None:
    matchers = host_matchers("Hostname", [unique_eks_node(), FQDN_253])
    asked = dcgm_queries(85, 95)
    node_xids = node_xid_query(asked[0])
    for query in [*asked, node_xids]:
        for expr in (query.expr, run_starts_query(query, matchers, 30_000, 10_000 * 30_000)):
            assert series(prometheus, expr) == [], expr  # answered, and nothing is wrong
    assert series(prometheus, last_value_query(node_xids, matchers, 30_000, 300_000)) == []
    assert series(prometheus, window_query()) == []
    assert series(prometheus, presence_query([XID_GAUGE, XID_WINDOW])) == []


def test_a_restarted_or_standby_source_names_a_present_finding_as_the_first_did(
    prometheus: Monitoring, exporter: FakeDcgmExporter
) -> None:
    """Before: the id embedded the process's clock (dcgm-xid-<uuid>-<time the
    process first saw it>), so a second process named the same Xid differently
    (a second GPUFault, Event and notification), and the id, 65 characters
    with a real UUID, was no valid taint value."""
    node = unique_eks_node()
    labels = dcgm_labels(node, 3)
    exporter.set(XID, labels, 0)
    wait_scraped(prometheus, f"{XID} == 0", 1)
    time.sleep(2)  # a few grid instants with the GPU fine
    exporter.set(XID, labels, 79)

    async def scenario() -> None:
        first = Heard()
        a = source(prometheus, first, {node})
        async with aiohttp.ClientSession() as session:
            await poll_until("the first source's finding", a, session, lambda: first.submitted)
            (fault_id,) = first.ids()
            signal = first.submitted[0]
            assert (signal.node, signal.reason, signal.devices) == (
                node,
                "XidCritical79",
                (GPU_UUIDS[3],),
            )
            assert is_label_value(fault_id) and len(fault_id) <= 40
            assert signal.detected_at  # the episode's start, as Prometheus has it

            await asyncio.sleep(2.5)  # later: a restarted controller, or the standby
            second = Heard()
            b = source(prometheus, second, {node})
            await poll_until("the second source's finding", b, session, lambda: second.submitted)
            assert second.ids() == [fault_id]
            assert second.submitted[0].detected_at == signal.detected_at

            # A new pod on the GPU: dcgm-exporter publishes the series under new pod
            # labels. The same GPU, the same episode.
            moved = {**labels, "pod": "llama-70b-pretrain-worker-4"}
            exporter.set(XID, moved, 79)
            exporter.remove(XID, labels)
            wait_scraped(prometheus, XID, 1)
            polls = len(first.submitted)
            await poll_until("more polls", a, session, lambda: len(first.submitted) >= polls + 3)
            assert first.ids() == [fault_id] and first.resolved == []

            # The GPU recovers, then fails again: a new episode, a new fault.
            exporter.set(XID, moved, 0)
            await poll_until("the recovery", a, session, lambda: first.resolved)
            assert first.resolved == [(node, fault_id)]
            exporter.set(XID, moved, 79)
            await poll_until("the new episode", a, session, lambda: len(first.ids()) == 2)
            again = first.ids()[1]
            assert again != fault_id
            third = Heard()
            c = source(prometheus, third, {node})
            await poll_until("a third source's finding", c, session, lambda: third.submitted)
            assert third.ids() == [again]

    asyncio.run(scenario())


# -- the sticky Xid gauge ----------------------------------------------------------


def test_a_node_fault_xid_lasts_the_gauges_run_and_a_restarted_source_names_it_the_same(
    prometheus: Monitoring, exporter: FakeDcgmExporter
) -> None:
    """Before: the gauge's value was the fault at each poll, so an Xid 48 followed by
    the application's Xid 43 (the gauge keeps the last) withdrew the fault, and the
    node was given back with its GPU's double-bit error."""
    node = unique_eks_node()
    gpu = exporter.add_gpu(dcgm_labels(node, 2))
    wait_scraped(prometheus, f"{XID_GAUGE} == 0", 1)
    time.sleep(2)  # a few grid instants with the GPU fine
    exporter.xid(gpu, 48)

    async def scenario() -> None:
        first = Heard()
        a = source(prometheus, first, {node})
        async with aiohttp.ClientSession() as session:
            await poll_until("the fault", a, session, lambda: first.submitted)
            (fault_id,) = first.ids()
            assert first.submitted[0].reason == "EccDoubleBit48"
            exporter.xid(gpu, 43)  # the application fails too: the gauge shows 43
            wait_scraped(prometheus, f"{XID_GAUGE} == 43", 1)
            polls = len(first.submitted)
            await poll_until("more polls", a, session, lambda: len(first.submitted) >= polls + 3)
            assert first.ids() == [fault_id] and first.resolved == []
            assert first.submitted[-1].reason == "EccDoubleBit48"  # the run's node-fault value
            assert [(o.xid, o.row.kind.value) for o in first.observed] == [(43, "informational")]

            # A restarted controller (or the standby) sees 43 only: it asks Prometheus.
            second = Heard()
            b = source(prometheus, second, {node})
            await poll_until("the restarted source", b, session, lambda: second.submitted)
            assert second.ids() == [fault_id]
            assert second.submitted[0].reason == "EccDoubleBit48"
            assert second.submitted[0].detected_at == first.submitted[0].detected_at

            # dcgm-exporter restarts (the GPU was reset): the gauge is 0, the fault over.
            exporter.restart()
            await poll_until("the fault withdrawn", a, session, lambda: first.resolved)
            assert first.resolved == [(node, fault_id)]
            await poll_until("the fault withdrawn", b, session, lambda: second.resolved)
            assert second.resolved == [(node, fault_id)]

    asyncio.run(scenario())


def test_an_application_xid_staying_in_the_gauge_is_no_fault_and_observed_once(
    prometheus: Monitoring, exporter: FakeDcgmExporter
) -> None:
    node = unique_eks_node()
    gpu = exporter.add_gpu(dcgm_labels(node, 0))
    exporter.xid(gpu, 13)
    wait_scraped(prometheus, f"{XID_GAUGE} == 13", 1)
    heard, metrics = Heard(), ControllerMetrics()
    dcgm = source(prometheus, heard, {node}, metrics=metrics)

    polls: list[int] = []

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(6):  # six grid instants: the value stays, no new fault
                await dcgm.poll(session)
                polls.append(dcgm._evaluated.get("xid", 0))
                await asyncio.sleep(1.0)

    asyncio.run(scenario())
    assert len(set(polls)) >= 4
    assert heard.submitted == [] and heard.resolved == []
    (seen,) = heard.observed
    assert (seen.source, seen.node, seen.xid, seen.device) == ("dcgm", node, 13, GPU_UUIDS[0])
    assert (seen.namespace, seen.pod) == ("ml-training", "llama-70b-pretrain-worker-3")
    assert value(metrics, "gpuheal_dcgm_findings", query="xid") == 0


# -- counters dcgm-exporter does not export -------------------------------------------


def test_a_query_whose_counters_dcgm_exporter_does_not_export_is_said(
    prometheus: Monitoring, exporter: FakeDcgmExporter
) -> None:
    """Before: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, not in dcgm-exporter's default list,
    was queried forever and matched nothing, silently."""
    node = unique_eks_node()
    exporter.add_gpu(dcgm_labels(node, 0))
    wait_scraped(prometheus, XID_GAUGE, 1)
    time.sleep(2)  # the source reads a settled instant: one the scrapes had reached
    heard, metrics = Heard(), ControllerMetrics()
    dcgm = source(prometheus, heard, {node}, metrics=metrics)

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            await poll_until("a poll", dcgm, session, lambda: dcgm.series)

    asyncio.run(scenario())
    names = (
        "xid",
        "dbe",
        "remapfail",
        "remappend",
        "tempcrit",
        "nvreplay",
        "nvrecover",
        "hwslow",
        "appxids",
    )
    blind = {q for q in names if value(metrics, "gpuheal_dcgm_query_series", query=q) == 0}
    assert blind == {"dbe", "remappend", "nvreplay", "nvrecover", "hwslow", "appxids"}
    said = dcgm.problems()
    assert [p.split(" ")[2] for p in said] == [
        "dbe", "remappend", "nvreplay", "nvrecover", "hwslow", "hwthermal", "hwbrake", "appxids",
    ]  # fmt: skip
    assert "DCGM_FI_DEV_ROW_REMAP_PENDING (not in dcgm-exporter's default counters" in said[1]


# -- clock slowdowns ----------------------------------------------------------------


@pytest.mark.parametrize("exporter", [OPTIONAL_COUNTERS], indirect=True)
def test_a_hardware_slowdown_held_most_of_the_window_is_a_fault_a_moment_of_one_is_not(
    prometheus: Monitoring, exporter: FakeDcgmExporter
) -> None:
    """dcgmSlowdownWindowSeconds at 20 (600 shipped: the same query, scaled), and
    Prometheus scraping every second: 12 of the 20 looks must see the bit."""
    node = unique_eks_node()
    held = exporter.add_gpu(dcgm_labels(node, 0), **{CLOCK_EVENTS.name: 0x8 | 0x4})
    exporter.add_gpu(dcgm_labels(node, 1), **{CLOCK_EVENTS.name: 0x4 | 0x20})  # capped
    blip = exporter.add_gpu(dcgm_labels(node, 2), **{CLOCK_EVENTS.name: 0x80})
    wait_scraped(prometheus, f"{CLOCK_EVENTS.name} > 0", 3)
    exporter.set_field(blip, CLOCK_EVENTS, 0x1)  # a brake for a second, then idle
    heard = Heard()
    queries = dcgm_queries(85, 95, application_xids_per_gpu=3, slowdown_window_s=20)
    dcgm = source(prometheus, heard, {node}, queries=queries)
    started = time.monotonic()

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            await poll_until("the held slowdown", dcgm, session, lambda: heard.submitted)
            (signal,) = heard.submitted
            assert (signal.reason, signal.severity, signal.source) == (
                "HwSlowdown", Severity.P1, "dcgm/hwslow"
            )  # fmt: skip
            assert signal.devices == (GPU_UUIDS[0],)
            # The power cap and the software thermal slowdown are the driver at work.
            for _ in range(5):
                await asyncio.sleep(1)
                await dcgm.poll(session)
            assert [s.devices for s in heard.submitted] == [(GPU_UUIDS[0],)] * len(heard.submitted)
            exporter.set_field(held, CLOCK_EVENTS, 0x4)  # the slowdown ends
            await poll_until("withdrawn", dcgm, session, lambda: heard.resolved, timeout_s=40)

    asyncio.run(scenario())
    print(f"the held slowdown was a fault {time.monotonic() - started:.1f} s into the window")


# -- the windowed Xid count -----------------------------------------------------------


@pytest.mark.parametrize("exporter", [OPTIONAL_COUNTERS], indirect=True)
def test_application_xids_counted_in_the_window_make_a_fault_only_at_the_rate(
    prometheus: Monitoring, exporter: FakeDcgmExporter
) -> None:
    node = unique_eks_node()
    gpu = exporter.add_gpu(dcgm_labels(node, 4))
    exporter.xid(gpu, 13)
    exporter.xid(gpu, 43)
    wait_scraped(prometheus, f"{XID_WINDOW} > 0", 2)
    heard = Heard()
    dcgm = source(prometheus, heard, {node})  # applicationXids.perGpu: 3

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            await poll_until("the window read", dcgm, session, lambda: len(heard.observed) >= 2)
            await asyncio.sleep(2)
            await dcgm.poll(session)
            assert heard.submitted == []  # one application Xid, one ignorable: no fault
            # From the window, each Xid once (not the gauge's last value as well).
            assert sorted((o.xid, o.count) for o in heard.observed) == [(13, 1), (43, 1)]
            exporter.xid(gpu, 31)
            exporter.xid(gpu, 13)  # three application Xids on the GPU within the window
            await poll_until("the rate's fault", dcgm, session, lambda: heard.submitted)
            signal = heard.submitted[0]
            assert (signal.reason, signal.severity, signal.source) == (
                "RepeatedApplicationXids", Severity.P1, "dcgm/appxids"
            )  # fmt: skip
            assert signal.devices == (GPU_UUIDS[4],)
            assert sorted((o.xid, o.count) for o in heard.observed) == [
                (13, 1), (13, 1), (31, 1), (43, 1)
            ]  # fmt: skip
            exporter.window_passed(gpu)  # the window moves on: the rate is gone
            await poll_until("the rate withdrawn", dcgm, session, lambda: heard.resolved)

    asyncio.run(scenario())


# -- samples no fault can be made of ------------------------------------------


def test_a_non_finite_sample_costs_no_other_node_and_the_source_lives_on(
    prometheus: Monitoring, exporter: FakeDcgmExporter, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a +Inf Xid sample raised OverflowError out of the poll loop (the
    task died, silently, for every node); NaN aborted every poll. (An exporter's
    `1e400` fails the whole scrape in Prometheus, so it never gets this far; the
    source drops it all the same: tests/unit/test_dcgm.py.)"""
    bad = {
        unique_eks_node(): (XID, "+Inf"),
        unique_eks_node(): (XID, "NaN"),
        unique_eks_node(): (XID, "-Inf"),
        unique_eks_node(): (DBE, "+Inf"),
        unique_eks_node(): (TEMP, "+Inf"),
    }
    good = unique_eks_node()
    for node, (metric, sample) in bad.items():
        exporter.set(metric, dcgm_labels(node, 0), sample)
    exporter.set(XID, dcgm_labels(good, 1), 79)
    wait_scraped(prometheus, '{__name__=~"DCGM_.*"}', len(bad) + 1)
    heard, metrics = Heard(), ControllerMetrics()
    dcgm = source(prometheus, heard, {good, *bad}, metrics=metrics)
    caplog.set_level(logging.WARNING, logger=SOURCE_LOG)

    def polled_thrice() -> bool:
        return len(heard.submitted) >= 3

    asyncio.run(run_until("three polls", dcgm, polled_thrice))

    assert {s.node for s in heard.submitted} == {good}
    assert heard.submitted[0].reason == "XidCritical79"
    polls = len(heard.submitted)  # one per poll of the Xid query
    dropped = value(metrics, "gpuheal_dcgm_samples_dropped_total", query="xid", why="non-finite")
    assert 3 * polls <= dropped <= 3 * (polls + 1)
    assert value(metrics, "gpuheal_dcgm_samples_dropped_total", query="dbe", why="non-finite") > 0
    temp = value(metrics, "gpuheal_dcgm_samples_dropped_total", query="tempcrit", why="non-finite")
    assert temp > 0
    said = [r for r in caplog.records if r.getMessage().startswith("DCGM sample dropped")]
    assert len(said) == len(bad)  # once per series, not once per poll
    assert {getattr(r, "series", "").split('Hostname="')[1].split('"')[0] for r in said} == set(bad)
    assert metrics.registry.get_sample_value("gpuheal_dcgm_poll_errors_total", {}) is None


# -- a Prometheus that fails ----------------------------------------------------


def test_a_failing_query_a_bug_and_an_unreachable_prometheus_each_cost_little(
    prometheus: Monitoring, exporter: FakeDcgmExporter, caplog: pytest.LogCaptureFixture
) -> None:
    node = unique_eks_node()
    exporter.set(XID, dcgm_labels(node, 0), 79)
    wait_scraped(prometheus, XID, 1)
    # Prometheus refuses to parse this one: the other queries go on without it.
    broken = Query("broken", XID + "{m}{o} !=", "Broken", Severity.P0)
    calls = 0

    def managed(name: str) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in a callback")
        return name == node

    heard, metrics = Heard(), ControllerMetrics()
    dcgm = source(
        prometheus,
        heard,
        {node},
        metrics=metrics,
        queries=[broken, *dcgm_queries(85, 95)],
        managed=managed,
    )
    caplog.set_level(logging.DEBUG, logger=SOURCE_LOG)
    asyncio.run(run_until("three polls", dcgm, lambda: len(heard.submitted) >= 3))

    assert value(metrics, "gpuheal_dcgm_poll_errors_total", reason="internal") == 1
    refused = value(metrics, "gpuheal_dcgm_poll_errors_total", reason="prometheus")
    assert refused >= 3  # one per poll, each poll at its normal pace
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [(getattr(r, "query", ""), getattr(r, "reason", "")) for r in warned] == [
        ("broken", "prometheus"),  # once, however many polls
        ("poll", "internal"),
    ]
    assert warned[1].exc_info is not None  # a bug: with its traceback

    # Prometheus goes away: each poll costs one request, and the polls back off.
    prometheus.stop()
    caplog.clear()

    async def seven_seconds() -> None:
        started = time.monotonic()
        await run_until("7 s", dcgm, lambda: time.monotonic() - started > 7)

    asyncio.run(seven_seconds())
    unreachable = value(metrics, "gpuheal_dcgm_poll_errors_total", reason="connection")
    assert 2 <= unreachable <= 4  # at 0, 2 and 6 s; a poll a second without the backoff
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [getattr(r, "reason", "") for r in warned] == ["connection"]


# -- inside the controller ------------------------------------------------------


def test_a_restarted_controller_keeps_one_record_for_a_present_dcgm_finding(
    kube: Client,
    pool: dict[str, str],
    start_controller: StartController,
    prometheus: Monitoring,
    exporter: FakeDcgmExporter,
) -> None:
    """Before: the restarted controller named the still-present Xid anew, and
    made a second GPUFault (superseding the first) with its Events."""
    node, hot = unique_eks_node(), unique_eks_node()
    create_gpu_nodes(kube, [node, hot], labels=pool)
    try:
        wait_nodes_ready(kube, [node, hot])
        exporter.set(XID, dcgm_labels(node, 3), 79)
        # dcgm-exporter has spelled the host label both ways.
        lower = {("hostname" if k == "Hostname" else k): v for k, v in dcgm_labels(hot).items()}
        exporter.set(TEMP, lower, 97)
        wait_scraped(prometheus, '{__name__=~"DCGM_.*"}', 2)
        config = controller_config(
            pool, dcgmPrometheusUrl=prometheus.prometheus_url, dcgmIntervalSeconds=1
        )
        first = start_controller(config).wait_leading()
        wait_for("both quarantined", lambda: our_taint(kube, node) and our_taint(kube, hot))
        (record,) = faults_of(kube, node)
        assert record.spec["reason"] == "XidCritical79" and record.spec["source"] == "dcgm/xid"
        assert record.spec["devices"] == [GPU_UUIDS[3]]
        assert our_taint(kube, node) == record.spec["faultID"]
        (thermal,) = faults_of(kube, hot)
        assert thermal.spec["reason"] == "Thermal" and thermal.spec["severity"] == "P0"
        # Its Event is sent behind a queue: seen before the stop, so that one counted
        # after the restart is the first controller's, not lost in its shutdown.
        events_for(kube, node, "GPUFaultQuarantined", at_least=1)
        first.stop()

        second = start_controller(config).wait_leading()
        wait_for(
            "the new controller's findings",
            lambda: (
                'gpuheal_dcgm_findings{query="xid"} 1.0' in second.metrics()
                and 'gpuheal_dcgm_findings{query="tempcrit"} 1.0' in second.metrics()
            ),
        )
        time.sleep(3)  # more polls and reconciles: still one fault each
        (again,) = faults_of(kube, node)
        assert again.metadata.name == record.metadata.name
        assert again.spec["faultID"] == record.spec["faultID"]
        assert len(faults_of(kube, hot)) == 1
        assert len(events_for(kube, node, "GPUFaultQuarantined", at_least=1)) == 1
        assert our_taint(kube, node) == record.spec["faultID"]
    finally:
        delete_nodes(kube, [node, hot])
