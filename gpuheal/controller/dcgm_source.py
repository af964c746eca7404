"""The DCGM source's poller: ask Prometheus at each instant of the grid, name
each finding by its episode (`gpuheal.sources.dcgm`), submit and resolve.

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
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from gpuheal.config import without_url_secrets
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import FaultSignal
from gpuheal.sources.dcgm import (
    Dropped,
    Episode,
    Finding,
    Query,
    episode,
    host_matchers,
    interpret,
    old_episode,
    run_starts,
    run_starts_query,
    signal_for,
)
from gpuheal.values import text

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
        submit: Callable[[FaultSignal], bool],
        resolve: Callable[[str, str], int],
        managed: Callable[[str], bool],
        metrics: ControllerMetrics,
        settle_s: float = SETTLE_S,
        lookback_s: float = LOOKBACK_S,
    ) -> None:
        self.url = prometheus_url.rstrip("/") + "/api/v1/query"
        self.interval_s = interval_s
        self.step_ms = max(1, round(interval_s * 1000))
        self.settle_ms = round(settle_s * 1000)
        self.lookback_ms = round(lookback_s * 1000)
        self.queries = queries
        self.submit = submit
        self.resolve = resolve
        self.managed = managed
        self.metrics = metrics
        # query name -> finding key -> its episode
        self.episodes: dict[str, dict[str, Episode]] = {}
        self.failures = 0  # polls in a row that could not reach Prometheus
        self._evaluated: dict[str, int] = {}  # query name -> last grid instant (ms)
        self._dropped: dict[str, set[str]] = {}  # query name -> series said dropped
        self._complaints: dict[tuple[str, str], _Complaint] = {}

    # -- the loop ----------------------------------------------------------

    async def run(self) -> None:
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
        # A bug here must not stop the source for every node.
        except Exception as err:
            self._failed("poll", "internal", f"{type(err).__name__}: {err}", exc_info=True)
        else:
            if self.failures:
                log.info("prometheus answers again", extra={"failed_polls": self.failures})
            self.failures = 0
            self._settled("poll")
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
        for query in self.queries:
            if self._evaluated.get(query.name) == at_ms:
                continue
            try:
                await self._poll_query(session, query, at_ms)
            except PrometheusError as err:
                if err.abort:
                    raise
                self._failed(query.name, err.reason, str(err))
            else:
                self._settled(query.name)

    async def _poll_query(self, session: aiohttp.ClientSession, query: Query, at_ms: int) -> None:
        reading = interpret(query, await self._ask(session, query.expr, at_ms))
        self._count_dropped(query, reading.dropped)
        present = {f.key: f for f in reading.findings if self.managed(f.node)}
        held = self.episodes.setdefault(query.name, {})
        # A grid instant missed (a failed poll, a late one) may hide a break:
        # then every present finding's episode is looked up again.
        last = self._evaluated.get(query.name)
        missed = last is not None and at_ms - last > self.step_ms
        lookup = [f for key, f in present.items() if missed or key not in held]
        starts = await self._run_starts(session, query, lookup, at_ms) if lookup else {}
        for key in [k for k in held if k not in present]:
            self.resolve(key.split("/", 1)[0], held.pop(key).fault_id)
        for finding in lookup:
            start = starts.get(finding.key)
            found = (
                episode(query.name, finding.gpu, start)
                if start is not None
                else old_episode(query.name, finding.gpu, at_ms, self.lookback_ms)
            )
            old = held.get(finding.key)
            if old is not None and old.fault_id != found.fault_id:
                self.resolve(finding.node, old.fault_id)
            held[finding.key] = found
        self.metrics.dcgm_findings.labels(query.name).set(len(present))
        for key, finding in present.items():
            current = held[key]
            self.submit(signal_for(finding, current.fault_id, current.detected_at))
        self._evaluated[query.name] = at_ms

    async def _run_starts(
        self, session: aiohttp.ClientSession, query: Query, findings: list[Finding], at_ms: int
    ) -> dict[str, int]:
        """When each finding's current run started (ms); absent: before the lookback."""
        starts: dict[str, int] = {}
        by_label: dict[str, dict[str, list[Finding]]] = {}
        for finding in findings:
            by_label.setdefault(finding.host_label, {}).setdefault(finding.node, []).append(finding)
        for host_label, by_node in by_label.items():
            nodes = sorted(by_node)
            for first in range(0, len(nodes), LOOKUP_BATCH_NODES):
                batch = nodes[first : first + LOOKUP_BATCH_NODES]
                wanted = {f.key for n in batch for f in by_node[n]}
                await self._look_back(
                    session, query, host_label=host_label, wanted=wanted, at_ms=at_ms, starts=starts
                )
        return starts

    async def _look_back(
        self,
        session: aiohttp.ClientSession,
        query: Query,
        *,
        host_label: str,
        wanted: set[str],
        at_ms: int,
        starts: dict[str, int],
    ) -> None:
        end, points = at_ms, FIRST_WINDOW_POINTS
        while wanted and at_ms - end < self.lookback_ms:
            window_ms = min(points * self.step_ms, self.lookback_ms - (at_ms - end))
            window_ms -= window_ms % self.step_ms
            if window_ms <= 0:
                break
            matchers = host_matchers(host_label, (k.split("/", 1)[0] for k in wanted))
            expr = run_starts_query(query, matchers, self.step_ms, window_ms)
            for key, start in run_starts(query, await self._ask(session, expr, end)).items():
                if key in wanted:
                    starts[key] = start
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
