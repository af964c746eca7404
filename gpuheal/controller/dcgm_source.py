"""The DCGM source's poller: ask Prometheus at each instant of the grid, name
each finding by its episode (`gpuheal.sources.dcgm`), submit and resolve.

The Xid gauge is read its own way (`_poll_xids`): a node-fault value seen in the
gauge's current run is the fault until the run ends, whatever value follows; any
other value is an Xid that is no node fault, told to `observe` when it appears.
With dcgm-exporter's windowed Xid count exported, those are told from the window
instead (each Xid, not only the last), and the window's application Xids per GPU
are the `appxids` query. Each poll also asks how many series each counter the
queries read has (`problems()`: what the source cannot see, for /readyz).

Nothing Prometheus answers stops it: a query whose answer is unusable is
skipped for that poll (the others go on), a Prometheus that cannot be reached
is retried with a backoff, and any other exception is logged and counted, never
the end of the loop. Each kind of failure is logged once, then at most every
COMPLAINT_INTERVAL_S while it lasts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

from gpuheal.config import without_url_secrets
from gpuheal.controller.signals import SignalPort
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.sources.dcgm import (
    XID,
    XID_WINDOW,
    DcgmFinding,
    Dropped,
    Episode,
    Query,
    XidGauge,
    episode,
    host_matchers,
    interpret,
    is_node_fault,
    last_value_query,
    last_values,
    node_xid_query,
    observed,
    old_episode,
    presence_query,
    run_starts,
    run_starts_query,
    series_counts,
    signal_for,
    window_query,
    window_xids,
    xid_code,
)
from gpuheal.sources.xids import Observed
from gpuheal.values import text
from gpuheal.xid import XidRow, classify

log = logging.getLogger(__name__)

# A sample is read this long after its grid instant: a scrape's samples carry
# the time the scrape began and are visible only once it ends.
SETTLE_S = 5.0
# How far back an episode's start is looked for (within most Prometheus
# retentions: 15 days by default, 10 in kube-prometheus-stack).
LOOKBACK_S = 7 * 86400.0
# Episode lookups cover a few hours first (most findings are new) and then
# widen; Prometheus answers at most 11,000 points per series.
FIRST_WINDOW_POINTS = 360
MAX_WINDOW_POINTS = 10_000
# Nodes per episode lookup: each brings its GPUs' series over the whole window.
LOOKUP_BATCH_NODES = 25
BACKOFF_MAX_S = 300.0
COMPLAINT_INTERVAL_S = 300.0
# The pseudo-queries of a poll, for the logs and the failure counts.
PRESENCE = "presence"
WINDOW = "xidwindow"

Expr = Callable[[str, int], str]  # (matchers, window ms) -> PromQL
Parse = Callable[[object], Mapping[str, float]]  # result -> finding key -> value


class PrometheusError(Exception):
    """A request to Prometheus that failed; `abort`: Prometheus itself is
    unreachable or unwell, so the rest of the poll is not tried either."""

    def __init__(self, reason: str, message: str, *, abort: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.abort = abort


@dataclass
class _Complaint:
    logged_at: float
    repeats: int = 0


class DcgmSource:
    def __init__(
        self,
        prometheus_url: str,
        interval_s: float,
        queries: list[Query],
        *,
        port: SignalPort,
        metrics: ControllerMetrics,
        observe: Callable[[Observed], object] = lambda _: None,
        overrides: Mapping[int, XidRow] | None = None,
        settle_s: float = SETTLE_S,
        lookback_s: float = LOOKBACK_S,
    ) -> None:
        self.url = prometheus_url.rstrip("/") + "/api/v1/query"
        self.interval_s = interval_s
        self.step_ms = max(1, round(interval_s * 1000))
        self.settle_ms = round(settle_s * 1000)
        self.lookback_ms = round(lookback_s * 1000)
        # Settled after each complete poll: what the source does not report is not there.
        self.port = port
        self.metrics = metrics
        self.observe = observe  # an Xid that is no node fault
        # query name -> finding key -> its episode
        self.episodes: dict[str, dict[str, Episode]] = {}
        self.configure(queries, overrides)
        # finding key -> the Xid gauge's run, while the gauge is nonzero
        self.gauges: dict[str, XidGauge] = {}
        # (node, gpu, xid) -> the windowed count last seen
        self.window: dict[tuple[str, str, int], int] = {}
        # counter -> its series in Prometheus at the last presence poll
        self.series: dict[str, int] = {}
        self.failures = 0  # polls in a row that could not reach Prometheus
        self.last_error = ""
        self._evaluated: dict[str, int] = {}  # query name -> last grid instant (ms)
        self._dropped: dict[str, set[str]] = {}  # query name -> series said dropped
        self._complaints: dict[tuple[str, str], _Complaint] = {}

    def configure(self, queries: list[Query], overrides: Mapping[int, XidRow] | None) -> None:
        """The queries and the config's `xid` rows (at start, and on a reload: the
        findings of a query no longer asked, `appxids` turned off, are withdrawn)."""
        names = {q.name for q in queries}
        for name in [n for n in self.episodes if n not in names]:
            for key, held in self.episodes.pop(name).items():
                self.port.resolve(key.split("/", 1)[0], held.fault_id)
        self.queries = queries
        self.overrides = dict(overrides or {})
        gauge = next((q for q in queries if q.name == XID), None)
        self.node_xids = node_xid_query(gauge, self.overrides) if gauge else None

    def problems(self) -> list[str]:
        """What keeps this source from seeing faults, for /readyz (not a reason to be
        unready: a counter left out of dcgm-exporter's list is the user's choice)."""
        said = []
        if self.failures:
            said.append(f"dcgm: Prometheus cannot be asked ({self.last_error})")
        for query in self.queries:
            if self.series and not self._sees(query):
                where = (
                    "not in dcgm-exporter's default counters: list it in its counters file"
                    if query.optional
                    else "in dcgm-exporter's default counters: is dcgm-exporter scraped?"
                )
                said.append(
                    f"dcgm: query {query.name} ({query.reason}) cannot see anything: "
                    f"Prometheus has no series of {', '.join(query.needs)} ({where})"
                )
        return said

    def _sees(self, query: Query) -> bool:
        return sum(self.series.get(m, 0) for m in query.needs) > 0

    # -- the loop ----------------------------------------------------------

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Poll until cancelled, the first time once `ready` is set: the node cache
        has synced. Before, every finding's node is unknown (`managed` says no) and
        would be dropped, and that look would settle the source with nothing seen,
        releasing a restarted controller's quarantines of faults still present."""
        if ready is not None:
            await ready.wait()
        timeout = aiohttp.ClientTimeout(total=max(5.0, self.interval_s))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                delay = await self.poll_safely(session)
                await asyncio.sleep(delay)

    async def poll_safely(self, session: aiohttp.ClientSession) -> float:
        """One poll; never raises (but cancellation). The seconds to wait for the next."""
        try:
            await self.poll(session)
        except PrometheusError as err:
            self._failed("poll", err.reason, str(err))
            self.last_error = f"{err.reason}: {err}"
        # A bug here must not stop the source for every node.
        except Exception as err:
            self._failed("poll", "internal", f"{type(err).__name__}: {err}", exc_info=True)
            self.last_error = f"internal: {type(err).__name__}"
        else:
            if self.failures:
                log.info("prometheus answers again", extra={"failed_polls": self.failures})
            self.failures = 0
            self.last_error = ""
            self._settled("poll")
            self.port.settled()
            return self._until_next_instant()
        self.failures += 1
        # The exponent is capped: 2.0**1024 raises, and the cap is reached long before.
        backoff = self.interval_s * 2.0 ** min(self.failures, 16)
        return min(backoff, max(BACKOFF_MAX_S, self.interval_s))

    def grid_instant(self, now_s: float) -> int:
        """The latest grid instant (ms) whose samples have settled."""
        settled = int(now_s * 1000) - self.settle_ms
        return settled - settled % self.step_ms

    def _until_next_instant(self) -> float:
        now = time.time()
        due = self.grid_instant(now) + self.step_ms + self.settle_ms
        return max(0.05, due / 1000 - now)

    # -- one poll ----------------------------------------------------------

    async def poll(self, session: aiohttp.ClientSession) -> None:
        """Evaluate every query at the latest settled grid instant. A query whose
        answer is unusable is skipped (its findings stay as they were); raises
        PrometheusError when Prometheus cannot be asked at all."""
        at_ms = self.grid_instant(time.time())
        queries = {q.name: q for q in self.queries}
        for name in (PRESENCE, *queries, WINDOW):
            if self._evaluated.get(name) == at_ms:
                continue
            try:
                await self._poll_one(session, name, queries.get(name), at_ms)
            except PrometheusError as err:
                if err.abort:
                    raise
                self._failed(name, err.reason, str(err))
            else:
                self._settled(name)

    async def _poll_one(
        self, session: aiohttp.ClientSession, name: str, query: Query | None, at_ms: int
    ) -> None:
        if query is None:
            await (self._poll_presence if name == PRESENCE else self._poll_window)(session, at_ms)
        elif query.name == XID:
            await self._poll_xids(session, query, at_ms)
        else:
            await self._poll_query(session, query, at_ms)

    async def _poll_presence(self, session: aiohttp.ClientSession, at_ms: int) -> None:
        """How many series each counter the queries read has: a query whose counters
        have none can never find anything, and is said (metric, log, /readyz)."""
        counters = {m for q in self.queries for m in q.needs} | {XID_WINDOW}
        before = {q.name: self._sees(q) for q in self.queries} if self.series else {}
        self.series = series_counts(await self._ask(session, presence_query(counters), at_ms))
        self.series |= {m: 0 for m in counters if m not in self.series}
        for query in self.queries:
            count = sum(self.series[m] for m in query.needs)
            self.metrics.dcgm_query_series.labels(query.name).set(count)
            if before.get(query.name, True) and not count:
                log.info(
                    "DCGM query cannot see anything: Prometheus has no series of its counters",
                    extra={"query": query.name, "counters": list(query.needs),
                           "optional": query.optional},
                )  # fmt: skip
        self._evaluated[PRESENCE] = at_ms

    async def _poll_query(self, session: aiohttp.ClientSession, query: Query, at_ms: int) -> None:
        reading = interpret(query, await self._ask(session, query.expr, at_ms))
        self._count_dropped(query, reading.dropped)
        present = {f.key: f for f in reading.findings if self.port.managed(f.node)}
        held = self.episodes.setdefault(query.name, {})
        # A grid instant missed (a failed poll, a late one) may hide a break:
        # then every present finding's episode is looked up again.
        last = self._evaluated.get(query.name)
        missed = last is not None and at_ms - last > self.step_ms
        lookup = [f for key, f in present.items() if missed or key not in held]
        starts = await self._starts(session, query, lookup, at_ms)
        for key in [k for k in held if k not in present]:
            self.port.resolve(key.split("/", 1)[0], held.pop(key).fault_id)
        for finding in lookup:
            start = starts.get(finding.key)
            found = (
                episode(query.name, finding.gpu, round(start))
                if start is not None
                else old_episode(query.name, finding.gpu, at_ms, self.lookback_ms)
            )
            old = held.get(finding.key)
            if old is not None and old.fault_id != found.fault_id:
                self.port.resolve(finding.node, old.fault_id)
            held[finding.key] = found
        self.metrics.dcgm_findings.labels(query.name).set(len(present))
        for key, finding in present.items():
            current = held[key]
            self.port.submit(signal_for(finding, current.fault_id, current.detected_at))
        self._evaluated[query.name] = at_ms

    # -- the Xid gauge -------------------------------------------------------

    async def _poll_xids(self, session: aiohttp.ClientSession, query: Query, at_ms: int) -> None:
        """The Xid gauge at `at_ms`: each GPU's run (nonzero without a break) and the
        node fault seen in it, if any; the values that are none, observed."""
        reading = interpret(query, await self._ask(session, query.expr, at_ms))
        self._count_dropped(query, reading.dropped)
        present = {f.key: f for f in reading.findings if self.port.managed(f.node)}
        last = self._evaluated.get(query.name)
        missed = last is not None and at_ms - last > self.step_ms
        for key in [k for k in self.gauges if k not in present]:
            ended = self.gauges.pop(key)  # the run is over: the exporter restarted, or the GPU went
            if ended.fault is not None:
                self.port.resolve(key.split("/", 1)[0], ended.fault.fault_id)
        lookup = [f for key, f in present.items() if missed or key not in self.gauges]
        found = await self._xid_runs(session, query, lookup, at_ms)
        for key, finding in present.items():
            code = xid_code(finding.value) or 0  # interpret let only Xids through
            node_fault = is_node_fault(finding.value, self.overrides)
            old = self.gauges.get(key)
            before = old.value if old is not None else None
            fresh = found.get(key)
            if fresh is not None:  # looked up: what Prometheus says replaces what was held
                self.gauges[key] = fresh
                replaced = old.fault if old and old.fault != fresh.fault else None
            elif old is not None:  # the next instant of a run followed since it began
                replaced = old.step(code, node_fault, at_ms, finding.gpu)
            else:
                continue  # not reached: a key not held is looked up
            if replaced is not None:
                self.port.resolve(finding.node, replaced.fault_id)
            if not node_fault and before != code:
                self._observe_gauge(finding, code)
        faults = 0
        for key, gauge in self.gauges.items():
            if gauge.fault is None:
                continue
            faults += 1
            finding = present[key]
            shown = DcgmFinding(finding.node, query, finding.gpu, float(gauge.fault_value),
                            finding.host_label)  # fmt: skip
            fault = gauge.fault
            self.port.submit(signal_for(shown, fault.fault_id, fault.detected_at, self.overrides))
        self.metrics.dcgm_findings.labels(query.name).set(faults)
        self._evaluated[query.name] = at_ms

    def _observe_gauge(self, finding: DcgmFinding, code: int) -> None:
        if self.series.get(XID_WINDOW, 0) > 0:
            return  # the window tells every Xid, this one included (_poll_window)
        row = classify(code, self.overrides)
        self.observe(observed(finding.node, finding.gpu, code, row, namespace=finding.namespace,
                              pod=finding.pod))  # fmt: skip

    async def _xid_runs(
        self, session: aiohttp.ClientSession, query: Query, findings: list[DcgmFinding], at_ms: int
    ) -> dict[str, XidGauge]:
        """Each finding's run as Prometheus has it: whether a node-fault value was
        seen in it, the latest start of a run of them (the fault's name) and the
        latest such value. What any controller process asking now would find."""
        nodes = self.node_xids
        if not findings or nodes is None:
            return {}
        step = self.step_ms
        begun = await self._starts(session, query, findings, at_ms)
        # Node-fault values are looked for within the gauge's run only (the whole
        # lookback only for a run older than it): one window for most.
        within = {key: at_ms - round(start) + step for key, start in begun.items()}
        node_starts = await self._lookup(
            session,
            findings,
            at_ms,
            expr=lambda m, w: run_starts_query(nodes, m, step, w),
            parse=lambda r: run_starts(nodes, r),
            within=within,
        )

        def maybe(f: DcgmFinding) -> bool:
            """Whether a node-fault value may have been seen in the run of a gauge
            showing another now: its latest value is then looked up."""
            started, node_started = begun.get(f.key), node_starts.get(f.key)
            if node_started is None:
                return started is None  # the run is older than the lookback: look
            return started is None or node_started >= started

        rest = [f for f in findings if not is_node_fault(f.value, self.overrides)]
        asked = [f for f in rest if maybe(f)]
        looked = {f.key for f in asked}
        latest = await self._lookup(
            session,
            asked,
            at_ms,
            expr=lambda m, w: last_value_query(nodes, m, step, w),
            parse=lambda r: last_values(nodes, r),
            within=within,
        )
        found = {}
        for f in findings:
            code = xid_code(f.value) or 0
            node_fault = is_node_fault(f.value, self.overrides)
            value = code if node_fault else xid_code(latest.get(f.key, 0.0))
            gauge = XidGauge(code, node_fault)
            if value is not None and (node_fault or f.key in looked):
                start = node_starts.get(f.key)
                gauge.fault = (
                    episode(XID, f.gpu, round(start))
                    if start is not None
                    else old_episode(XID, f.gpu, at_ms, self.lookback_ms)
                )
                gauge.fault_value = value
            found[f.key] = gauge
        return found

    # -- the windowed Xid count ------------------------------------------------

    async def _poll_window(self, session: aiohttp.ClientSession, at_ms: int) -> None:
        """dcgm-exporter's windowed Xid count, where exported: each Xid that is no node
        fault observed as its count rises (node-fault ones are the gauge's)."""
        if self.series.get(XID_WINDOW, 0) == 0:
            self.window = {}
            return
        counts: dict[tuple[str, str, int], int] = {}
        pods: dict[tuple[str, str, int], tuple[str, str]] = {}
        for seen in window_xids(await self._ask(session, window_query(), at_ms)):
            if not self.port.managed(seen.node) or classify(seen.xid, self.overrides).node_fault:
                continue
            counts[seen.key] = counts.get(seen.key, 0) + seen.count
            if seen.pod or seen.key not in pods:
                pods[seen.key] = (seen.namespace, seen.pod)
        for key, count in counts.items():
            rise = count - self.window.get(key, 0)
            if rise > 0:
                node, gpu, xid = key
                namespace, pod = pods[key]
                row = classify(xid, self.overrides)
                self.observe(observed(node, gpu, xid, row, count=rise, namespace=namespace,
                                      pod=pod))  # fmt: skip
        self.window = counts
        self._evaluated[WINDOW] = at_ms

    # -- episode lookups ---------------------------------------------------

    async def _starts(
        self, session: aiohttp.ClientSession, query: Query, findings: list[DcgmFinding], at_ms: int
    ) -> Mapping[str, float]:
        """When each finding's current run started (ms); absent: before the lookback."""
        step = self.step_ms
        return await self._lookup(
            session,
            findings,
            at_ms,
            expr=lambda m, w: run_starts_query(query, m, step, w),
            parse=lambda r: run_starts(query, r),
        )

    async def _lookup(
        self,
        session: aiohttp.ClientSession,
        findings: list[DcgmFinding],
        at_ms: int,
        *,
        expr: Expr,
        parse: Parse,
        within: Mapping[str, int] | None = None,
    ) -> dict[str, float]:
        """`expr` asked of the findings' nodes over windows further and further back
        (the lookback at most; `within`: per finding key, at most this far, ms), in
        batches of nodes: per finding, what the most recent window that has an
        answer says."""
        found: dict[str, float] = {}
        by_label: dict[str, dict[str, list[DcgmFinding]]] = {}
        for finding in findings:
            by_label.setdefault(finding.host_label, {}).setdefault(finding.node, []).append(finding)
        for host_label, by_node in by_label.items():
            nodes = sorted(by_node)
            for first in range(0, len(nodes), LOOKUP_BATCH_NODES):
                batch = nodes[first : first + LOOKUP_BATCH_NODES]
                wanted = {f.key for n in batch for f in by_node[n]}
                await self._look_back(
                    session, expr, parse, host_label=host_label, wanted=wanted, at_ms=at_ms,
                    found=found, within=within or {},
                )  # fmt: skip
        return found

    async def _look_back(
        self,
        session: aiohttp.ClientSession,
        expr: Expr,
        parse: Parse,
        *,
        host_label: str,
        wanted: set[str],
        at_ms: int,
        found: dict[str, float],
        within: Mapping[str, int],
    ) -> None:
        end, points = at_ms, FIRST_WINDOW_POINTS
        while wanted and at_ms - end < self.lookback_ms:
            wanted -= {k for k in wanted if at_ms - end >= within.get(k, self.lookback_ms)}
            if not wanted:
                break
            window_ms = min(points * self.step_ms, self.lookback_ms - (at_ms - end))
            window_ms -= window_ms % self.step_ms
            if window_ms <= 0:
                break
            matchers = host_matchers(host_label, (k.split("/", 1)[0] for k in wanted))
            for key, value in parse(
                await self._ask(session, expr(matchers, window_ms), end)
            ).items():
                if key in wanted:
                    found[key] = value
                    wanted.discard(key)
            end -= window_ms
            points = min(points * 4, MAX_WINDOW_POINTS)

    async def _ask(self, session: aiohttp.ClientSession, expr: str, at_ms: int) -> object:
        """An instant query at `at_ms`: its `data.result`, or PrometheusError."""
        form = {"query": expr, "time": f"{at_ms / 1000:.3f}"}
        try:
            async with session.post(self.url, data=form) as response:
                status = response.status
                try:
                    body = await response.json(content_type=None)
                except ValueError:
                    body = None
        except TimeoutError as err:
            raise PrometheusError("timeout", "no answer in time", abort=True) from err
        except aiohttp.ClientError as err:
            # The message may quote the URL, which may carry user:password.
            message = f"{type(err).__name__}: {without_url_secrets(str(err), self.url)}"
            raise PrometheusError("connection", message, abort=True) from err
        if not isinstance(body, dict):
            # Prometheus answers its own errors in JSON; anything else is a proxy or
            # a server in trouble.
            raise PrometheusError("http", f"HTTP {status} without a JSON body", abort=status >= 500)
        if body.get("status") != "success":
            kind = text(str(body.get("errorType", "")), 64)
            error = text(str(body.get("error", "failed")), 512)
            overloaded = status == 503 or kind in ("timeout", "unavailable", "canceled")
            raise PrometheusError("prometheus", f"HTTP {status} {kind}: {error}", abort=overloaded)
        data = body.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list):
            raise PrometheusError("response", "the answer has no data.result list")
        return result

    # -- saying what went wrong, once ----------------------------------------

    def _count_dropped(self, query: Query, dropped: list[Dropped]) -> None:
        before = self._dropped.get(query.name, set())
        for sample in dropped:
            self.metrics.dcgm_samples_dropped.labels(query.name, sample.why).inc()
            if sample.series not in before:
                log.warning(
                    "DCGM sample dropped: no fault can be made of it",
                    extra={
                        "query": query.name,
                        "series": sample.series,
                        "value": sample.value,
                        "why": sample.why,
                    },
                )
        self._dropped[query.name] = {s.series for s in dropped}

    def _failed(self, what: str, reason: str, message: str, *, exc_info: bool = False) -> None:
        self.metrics.dcgm_poll_errors.labels(reason).inc()
        now = time.monotonic()
        complaint = self._complaints.get((what, reason))
        extra = {"query": what, "reason": reason, "error": message}
        if complaint is None or now - complaint.logged_at >= COMPLAINT_INTERVAL_S:
            repeats = complaint.repeats if complaint else 0
            log.warning(
                "DCGM source: prometheus query failed",
                extra=extra | {"repeats_since_last_log": repeats},
                exc_info=exc_info,
            )
            self._complaints[(what, reason)] = _Complaint(now)
        else:
            complaint.repeats += 1
            log.debug("DCGM source: prometheus query failed again", extra=extra)

    def _settled(self, what: str) -> None:
        for key in [k for k in self._complaints if k[0] == what]:
            del self._complaints[key]
