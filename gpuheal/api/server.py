"""The controller's HTTP API on its event loop (aiohttp).

GET  /healthz            alive
GET  /readyz             caches synced (200) or not (503); says whether this replica leads
                         and, in `reasons`, what keeps it from being ready or from leading,
                         and what the DCGM source cannot see
GET  /metrics            Prometheus exposition
GET  /openapi.yaml       this API, described
POST /api/v1/alerts      Alertmanager webhook (version 4)
POST /api/v1/process     manual trigger: {node, action: quarantine|clear, reason, severity}
                         or {node, xid, detail}: classified by NVIDIA's Xid catalogue
GET  /api/v1/faults      current and recent faults (GPUFault records)
POST /api/v1/faults/{name}/approve|reject   answer a plan awaiting approval
POST /api/v1/faults/{name}/release          let a fault held by the breaker past it, once
GET  /console/...        the web console (gpuheal/api/console/routes.py: its own sessions)

Everything under /api/ needs `Authorization: Bearer <token>` (compared in
constant time; 401 never says which part was wrong), but GET /api/v1/faults
when `apiOpenReads` opens it; /healthz, /readyz, /metrics and /openapi.yaml are
open. Authentication comes first, then the rate limit (429): a request with a
valid token spends its token's budget, any other request the small budget of
its client address, so nobody without the token can exhaust the budget of a
sender that has it (behind SNAT, every client shares an address). Bodies are
capped (413), malformed input gets 400 with a precise message, and nothing a
request says can make the controller act on a node outside its node selector.
Only the leader acts: a standby passes the writes on to it (api/forward.py), and
answers 503 when it cannot, so the sender retries (Alertmanager does).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from gpuheal.api import forward
from gpuheal.api.console.routes import Console, ConsoleIntake
from gpuheal.api.forward import Forwarder
from gpuheal.api.token import ApiTokens
from gpuheal.model import APPROVED, REJECTED, FaultSignal
from gpuheal.policy.ratelimit import TokenBucket
from gpuheal.sources import alertmanager, manual
from gpuheal.sources.alertmanager import PayloadError, Webhook
from gpuheal.sources.xids import Observed
from gpuheal.xid import XidRow

log = logging.getLogger(__name__)

OPENAPI = Path(__file__).with_name("openapi.yaml")
# Who an answer to a plan awaiting approval, or a release of a held fault, is from
# when it comes through the API.
API_CALLER = "api-token"


class Intake(ConsoleIntake, Protocol):
    """What the API needs from the controller (the console's reads included)."""

    def synced(self) -> bool: ...

    def leading(self) -> bool: ...

    def find_node(self, label: str, value: str) -> str | None:
        """A managed node named by an alert label, or None."""

    def node_status(self, name: str) -> str:
        """ "managed", "unmanaged" (outside the node selector or opted out) or "unknown"."""

    def submit(self, signal: FaultSignal) -> bool:
        """Hand a signal to the controller; True if it is new."""

    def resolve(self, node: str, fault_id: str | None, source: str) -> int:
        """Drop a source's signals for a node (one, or all with None); how many."""

    def observe(self, seen: Observed, key: str) -> bool:
        """Count an Xid that is no node fault (and tell its pod); False when `key`
        (an alert's fault id) was told already: Alertmanager's repeats count once."""

    def faults(self, node: str | None, limit: int) -> list[dict[str, Any]]: ...

    async def answer(self, wanted: str, decision: str, by: str) -> tuple[int, dict[str, Any]]:
        """A person's answer to a plan awaiting approval: (HTTP status, body)."""


# The budget of each client address for requests without a valid token: enough
# for a person with curl, or a reader of open fault data, not for guessing tokens.
ANONYMOUS_RATE_PER_SECOND = 1.0
ANONYMOUS_BURST = 10


@dataclass(frozen=True)
class ApiSettings:
    max_body_bytes: int = 1 << 20  # fixed when the server starts
    client_rate_per_second: float = 20.0  # per valid token
    client_burst: int = 40
    node_labels: tuple[str, ...] = ("node", "Hostname", "hostname", "instance")
    open_reads: bool = False  # GET /api/v1/faults without a token
    # A resolved alert withdraws its signal; off, it changes nothing (the signal
    # lasts until it expires, and the node's own health decides).
    resolved_alert_clears: bool = False
    console_secure_cookie: bool = False  # the console's session cookie only over TLS
    # The config's `xid` rows: alerts and manual requests naming an Xid classify by them.
    xid_overrides: Mapping[int, XidRow] = field(default_factory=dict)


class ManualRequest(msgspec.Struct, forbid_unknown_fields=True):
    """POST /api/v1/process's body (its meaning: gpuheal.sources.manual)."""

    node: str
    action: str = manual.QUARANTINE
    # Unset: "ManualRequest" and P0, unless `xid` is given (the catalogue decides).
    reason: str | msgspec.UnsetType = msgspec.UNSET
    severity: str | msgspec.UnsetType = msgspec.UNSET
    faultID: str = ""  # noqa: N815
    xid: int | msgspec.UnsetType = msgspec.UNSET
    detail: str | msgspec.UnsetType = msgspec.UNSET  # the kernel line after the Xid

    @property
    def given(self) -> frozenset[str]:
        return frozenset(
            name
            for name in ("reason", "severity", "detail")
            if getattr(self, name) is not msgspec.UNSET
        )


def decode_webhook(body: bytes) -> Webhook:
    """POST /api/v1/alerts's body (its meaning: gpuheal.sources.alertmanager), or
    PayloadError saying where it is not a webhook."""
    try:
        hook = msgspec.json.decode(body, type=Webhook)
    except msgspec.ValidationError as err:
        raise PayloadError(f"not an Alertmanager webhook: {err}") from None
    except msgspec.DecodeError as err:
        raise PayloadError(f"malformed JSON: {err}") from None
    return alertmanager.checked(hook)


def _problem(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


class _Limiter:
    """A token bucket per client (an address, or a token's digest); old idle
    clients are forgotten."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, client: str) -> float:
        now = time.monotonic()
        if len(self._buckets) > 10_000:
            self._buckets = {k: b for k, b in self._buckets.items() if now - b.updated < 60}
        bucket = self._buckets.get(client) or TokenBucket.full(self.rate, self.burst, now)
        self._buckets[client], wait = bucket.take(now)
        return wait


class ApiMetrics(Protocol):
    """What the API counts and serves on /metrics: the controller's metrics
    (gpuheal/metrics/controller.py), declared there with the rest."""

    @property
    def registry(self) -> CollectorRegistry: ...
    @property
    def api_requests(self) -> Counter: ...
    @property
    def alerts(self) -> Counter: ...


class Api:
    """The request handlers, bound to the controller through `intake`."""

    def __init__(
        self,
        intake: Intake,
        settings: ApiSettings,
        metrics: ApiMetrics,
        *,
        tokens: ApiTokens,
        view_tokens: ApiTokens | None = None,
        reasons: Callable[[], list[str]] = list,
        leader_address: Callable[[], str] = str,
        identity: str = "",
    ) -> None:
        self.intake = intake
        # A standby passes the leader's work on to it (api/forward.py).
        self.leader_address = leader_address
        self.forwarder = Forwarder(identity)
        # For /readyz: why not ready, or ready but unable to lead or to see (the DCGM source).
        self.reasons = reasons
        self.settings = settings
        self.tokens = tokens
        self.registry = metrics.registry
        self.requests = metrics.api_requests
        self.alerts = metrics.alerts
        self.authenticated = _Limiter(settings.client_rate_per_second, settings.client_burst)
        self.anonymous = _Limiter(ANONYMOUS_RATE_PER_SECOND, ANONYMOUS_BURST)
        # Sign-ins spend the budget of their address, as requests without a token do.
        self.console = Console(
            intake,
            act_tokens=tokens,
            view_tokens=view_tokens or ApiTokens(None),
            secure_cookie=lambda: self.settings.console_secure_cookie,
            login_wait=self.anonymous.take,
        )

    def configure(self, settings: ApiSettings) -> None:
        """Apply a reloaded config (all but the body limit, fixed at start)."""
        budget = (settings.client_rate_per_second, settings.client_burst)
        if budget != (self.settings.client_rate_per_second, self.settings.client_burst):
            self.authenticated = _Limiter(*budget)
        self.settings = settings

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self.guard], client_max_size=self.settings.max_body_bytes
        )
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/openapi.yaml", self.openapi)
        app.router.add_post("/api/v1/alerts", self.post_alerts)
        app.router.add_post("/api/v1/process", self.post_process)
        app.router.add_get("/api/v1/faults", self.get_faults)
        app.router.add_post("/api/v1/faults/{name}/approve", self.post_approve)
        app.router.add_post("/api/v1/faults/{name}/reject", self.post_reject)
        app.router.add_post("/api/v1/faults/{name}/release", self.post_release)
        self.console.add_routes(app)
        return app

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        response = await self._guarded(request, handler)
        self.requests.labels(resource.canonical if resource else "?", str(response.status)).inc()
        return response

    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/api/"):
            # Who first, then how much: a client without the token spends only the
            # budget of its own address, never that of a sender with the token.
            identity = self.tokens.identify(_presented(request))
            if identity is not None:
                wait = self.authenticated.take(identity)
            else:
                wait = self.anonymous.take(request.remote or "?")
            if wait > 0:
                return _problem(
                    429, "rate limit exceeded", **{"Retry-After": str(max(1, round(wait)))}
                )
            if identity is None and not self._open(request):
                return _problem(401, "unauthorized", **{"WWW-Authenticate": "Bearer"})
        if forward.wanted(request) and not self.intake.leading():
            leader = self.leader_address()
            if leader:
                return await self.forwarder.forward(request, leader)
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return _problem(413, f"body larger than {self.settings.max_body_bytes} bytes")
        except web.HTTPException as err:
            return _problem(err.status, err.reason)

    def _open(self, request: web.Request) -> bool:
        """Whether this /api/ request may go without a token."""
        return (
            self.settings.open_reads
            and request.method in ("GET", "HEAD")
            and request.path == "/api/v1/faults"
        )

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, _: web.Request) -> web.Response:
        ready = self.intake.synced()
        body = {"ready": ready, "leader": self.intake.leading(), "reasons": self.reasons()}
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def openapi(self, _: web.Request) -> web.Response:
        return web.Response(text=OPENAPI.read_text(), content_type="application/yaml")

    async def post_alerts(self, request: web.Request) -> web.Response:
        if not self.intake.leading():
            return _problem(503, "not the leader; retry", **{"Retry-After": "2"})
        try:
            hook = decode_webhook(await request.read())
        except PayloadError as err:
            return _problem(400, str(err))
        body: dict[str, list[dict[str, Any]]] = {
            "accepted": [], "duplicates": [], "resolved": [], "skipped": [], "observed": [],
        }  # fmt: skip
        outcomes = alertmanager.interpret(
            hook,
            node_labels=self.settings.node_labels,
            find_node=self.intake.find_node,
            overrides=self.settings.xid_overrides,
        )
        invalid = [o.skipped for o in outcomes if o.invalid]
        if invalid:
            # One line per body, however many of its alerts are odd: a rule that
            # makes them keeps making them, at every repeat.
            log.warning(
                "alerts skipped: values that cannot be carried",
                extra={"count": len(invalid), "first": invalid[0], "receiver": hook.receiver},
            )
        for outcome in outcomes:
            entry: dict[str, Any] = {
                "alert": outcome.alert, "node": outcome.node, "faultId": outcome.fault_id,
            }  # fmt: skip
            if outcome.skipped:
                result, entry = "skipped", {**entry, "reason": outcome.skipped}
            elif outcome.status == "resolved":
                withdrawn = self.settings.resolved_alert_clears and bool(
                    self.intake.resolve(outcome.node, outcome.fault_id, alertmanager.SOURCE)
                )
                result, entry = "resolved", {**entry, "withdrawn": withdrawn}
            elif outcome.observed is not None:
                seen = outcome.observed
                entry |= {"xid": seen.xid, "kind": seen.row.kind.value, "reason": seen.row.reason}
                new = self.intake.observe(seen, outcome.fault_id)
                result = "observed" if new else "duplicates"
            elif outcome.signal is not None and self.intake.submit(outcome.signal):
                result = "accepted"
            else:
                result = "duplicates"
            body[result].append(entry)
            counted = "invalid" if outcome.invalid else result
            self.alerts.labels(counted.rstrip("s") if result == "duplicates" else counted).inc()
        return web.json_response(body)

    async def post_process(self, request: web.Request) -> web.Response:
        if not self.intake.leading():
            return _problem(503, "not the leader; retry", **{"Retry-After": "2"})
        row: XidRow | None = None
        xid = 0
        try:
            wanted = msgspec.json.decode(await request.read(), type=ManualRequest)
            if wanted.xid is msgspec.UNSET:
                if "detail" in wanted.given:
                    raise ValueError("$.detail: only with xid")
                reason = wanted.reason if wanted.reason is not msgspec.UNSET else "ManualRequest"
                severity = manual.checked(
                    node=wanted.node,
                    action=wanted.action,
                    reason=reason,
                    severity=wanted.severity if wanted.severity is not msgspec.UNSET else "P0",
                    fault_id=wanted.faultID,
                )
            else:
                xid = wanted.xid
                row = manual.checked_xid(
                    node=wanted.node,
                    action=wanted.action,
                    fault_id=wanted.faultID,
                    xid=xid,
                    detail=wanted.detail if wanted.detail is not msgspec.UNSET else None,
                    given=wanted.given,
                    overrides=self.settings.xid_overrides,
                )
                reason, severity = row.reason, row.severity
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as err:
            return _problem(400, f"invalid request: {err}")
        status = self.intake.node_status(wanted.node)
        if status != "managed":
            code = 404 if status == "unknown" else 403
            why = (
                "not found"
                if status == "unknown"
                else "not managed by gpuheal (node selector or opt-out)"
            )
            return _problem(code, f"node {wanted.node!r} {why}")
        if wanted.action == manual.CLEAR:
            count = self.intake.resolve(wanted.node, wanted.faultID or None, manual.SOURCE)
            return web.json_response({"node": wanted.node, "cleared": count})
        if row is not None and not row.node_fault:
            # NVIDIA: restart the application (or ignore): counted, never a quarantine.
            self.intake.observe(manual.observed(node=wanted.node, xid=xid, row=row), "")
            return web.json_response(
                {"node": wanted.node, "xid": xid, "quarantine": False}
                | {"kind": row.kind.value, "reason": row.reason, "nvidia": row.nvidia}
            )
        signal = manual.signal(
            node=wanted.node,
            reason=reason,
            severity=severity,
            fault_id=wanted.faultID,
            now=dt.datetime.now(dt.UTC),
        )
        new = self.intake.submit(signal)
        body: dict[str, Any] = {"node": wanted.node, "faultId": signal.fault_id, "new": new}
        if row is not None:
            body |= {"xid": xid, "reason": row.reason, "severity": row.severity.value}
        return web.json_response(body, status=202)

    async def post_approve(self, request: web.Request) -> web.Response:
        return await self._answer(request, APPROVED)

    async def post_reject(self, request: web.Request) -> web.Response:
        return await self._answer(request, REJECTED)

    async def _answer(self, request: web.Request, decision: str) -> web.Response:
        if not self.intake.leading():
            return _problem(503, "not the leader; retry", **{"Retry-After": "2"})
        # Whoever holds a token: the tokens carry no names (the record says "api-token").
        status, body = await self.intake.answer(request.match_info["name"], decision, API_CALLER)
        return web.json_response(body, status=status)

    async def post_release(self, request: web.Request) -> web.Response:
        if not self.intake.leading():
            return _problem(503, "not the leader; retry", **{"Retry-After": "2"})
        status, body = await self.intake.release(request.match_info["name"], API_CALLER)
        return web.json_response(body, status=status)

    async def get_faults(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            return _problem(400, "limit: want an integer")
        if not 1 <= limit <= 1000:
            return _problem(400, "limit: want 1..1000")
        faults = self.intake.faults(request.query.get("node") or None, limit)
        return web.json_response({"faults": faults}, dumps=json.dumps)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _presented(request: web.Request) -> bytes:
    """The bearer token the request carries; b"" for none (no token is empty)."""
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer":  # the scheme is no secret: no need for constant time
        return b""
    # aiohttp decodes header bytes that are not UTF-8 as surrogates: surrogateescape
    # gives back the bytes as sent, to compare like any other wrong token.
    return presented.strip().encode("utf-8", "surrogateescape")


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
