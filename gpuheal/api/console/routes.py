"""The console's routes on the controller's HTTP server (docs/console.md).

GET  /console/login, POST /console/login, POST /console/logout
GET  /console/fleet, /console/faults, /console/faults/{name}, /console/nodes/{name}
     (`?fragment=1`: only the live part, for the page's script)
GET  /console/events                      server-sent events: the caches' version
POST /console/faults/{name}/approve|reject|release|acknowledge
GET  /console/static/{version}/{file}

Reads come from this replica's informer caches (no API server request); an
answer goes through the same path as the API's (`Intake.answer`), on the leader.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

from aiohttp import web

from gpuheal.api.console import render
from gpuheal.api.console.auth import (
    SESSION_PURPOSE,
    SESSION_SECONDS,
    Role,
    Session,
    issue,
    valid_user,
    verify,
)
from gpuheal.api.console.feed import ChangeFeed
from gpuheal.api.console.views import Cluster
from gpuheal.api.token import ApiTokens
from gpuheal.model import APPROVED, REJECTED

log = logging.getLogger(__name__)

SESSION_COOKIE = "gpuheal_session"
LOGIN_COOKIE = "gpuheal_login"  # the login form's double-submit CSRF token
# No script or style but the package's own, no frames, forms only to here.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # same-origin, not no-referrer: with no-referrer a form POST says `Origin: null`.
    "Referrer-Policy": "same-origin",
}
# A quiet stream still says something this often, so proxies keep it open.
HEARTBEAT_S = 15.0
# Changes come in bursts (a storm, a relist): one event per interval at most.
EVENT_INTERVAL_S = 0.5
MAX_STREAMS = 64  # open event streams per replica

Page = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConsoleIntake(Protocol):
    """What the console needs from the controller."""

    def leading(self) -> bool: ...

    def cluster(self) -> Cluster:
        """The caches, read in place, and the change feed's version."""

    @property
    def changes(self) -> ChangeFeed: ...

    async def answer(self, wanted: str, decision: str, by: str) -> tuple[int, dict[str, Any]]: ...

    async def release(self, wanted: str, by: str) -> tuple[int, dict[str, Any]]:
        """A person's release of a fault the breaker holds: (HTTP status, body)."""

    async def acknowledge(self, wanted: str, by: str) -> tuple[int, dict[str, Any]]: ...


class Console:
    def __init__(
        self,
        intake: ConsoleIntake,
        *,
        act_tokens: ApiTokens,
        view_tokens: ApiTokens,
        secure_cookie: Callable[[], bool],
        login_wait: Callable[[str], float],
    ) -> None:
        """`login_wait(address)`: seconds until that address may try a token again
        (0: now), spending one try."""
        self.intake = intake
        self.act_tokens = act_tokens
        self.view_tokens = view_tokens
        self.secure_cookie = secure_cookie
        self.login_wait = login_wait
        self._streams: set[asyncio.Task[Any]] = set()

    def add_routes(self, app: web.Application) -> None:
        routes = app.router
        routes.add_get("/console", self._redirect_home)
        routes.add_get("/console/", self._redirect_home)
        routes.add_get("/console/login", _secured(self.login_form))
        routes.add_post("/console/login", _secured(self.login))
        routes.add_post("/console/logout", _secured(self.logout))
        routes.add_get("/console/fleet", _secured(self.fleet))
        routes.add_get("/console/faults", _secured(self.faults))
        routes.add_get("/console/faults/{name}", _secured(self.fault))
        routes.add_get("/console/nodes/{name}", _secured(self.node))
        routes.add_get("/console/events", self.events)
        routes.add_post("/console/faults/{name}/approve", _secured(self.approve))
        routes.add_post("/console/faults/{name}/reject", _secured(self.reject))
        routes.add_post("/console/faults/{name}/release", _secured(self.release))
        routes.add_post("/console/faults/{name}/acknowledge", _secured(self.acknowledge))
        routes.add_get("/console/static/{version}/{file}", self.static)
        app.on_shutdown.append(self._close_streams)

    # --- sessions

    def session(self, request: web.Request) -> Session | None:
        cookie = request.cookies.get(SESSION_COOKIE)
        if not cookie:
            return None
        keys = {
            Role.ACT: self.act_tokens.keys(SESSION_PURPOSE),
            Role.VIEW: self.view_tokens.keys(SESSION_PURPOSE),
        }
        return verify(cookie, keys, time.time())

    def _cookie(self, response: web.StreamResponse, name: str, value: str, path: str) -> None:
        response.set_cookie(
            name,
            value,
            path=path,
            httponly=True,
            samesite="Strict",
            secure=self.secure_cookie(),
            max_age=None if name == LOGIN_COOKIE else SESSION_SECONDS,
        )

    async def _redirect_home(self, _: web.Request) -> web.Response:
        return _see_other("/console/fleet")

    async def login_form(self, request: web.Request, error: str = "") -> web.Response:
        csrf = secrets.token_urlsafe(24)
        body = render.page("login.html", csrf=csrf, error=error)
        response = _html(body, 401 if error else 200)
        self._cookie(response, LOGIN_COOKIE, csrf, "/console/login")
        return response

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        presented = str(form.get("_csrf", ""))
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not secrets.compare_digest(presented.encode(), expected.encode()):
            return self._refused(403, "the sign-in form expired: load it again")
        wait = self.login_wait(request.remote or "?")
        if wait > 0:
            return self._refused(429, f"too many tries: wait {max(1, round(wait))} s")
        user = str(form.get("user", "")).strip()
        if not valid_user(user):
            return await self.login_form(
                request, "name: letters, digits and . _ @ - (up to 63), starting with one"
            )
        token = str(form.get("token", "")).strip().encode("utf-8", "surrogateescape")
        role, key = self._role_of(token)
        if role is None or key is None:
            log.warning("console sign-in refused", extra={"user": user, "from": request.remote})
            return await self.login_form(request, "unknown token")
        cookie, _ = issue(role, user, key, time.time())
        log.info("console sign-in", extra={"user": user, "role": role.value})
        response = _see_other("/console/fleet")
        self._cookie(response, SESSION_COOKIE, cookie, "/console")
        response.del_cookie(LOGIN_COOKIE, path="/console/login")
        return response

    def _role_of(self, token: bytes) -> tuple[Role | None, bytes | None]:
        """The role a token opens and its session key. Both files are read whole,
        each token compared in constant time; an act token wins."""
        for role, tokens in ((Role.ACT, self.act_tokens), (Role.VIEW, self.view_tokens)):
            ident = tokens.identify(token)
            if ident is not None:
                keys = dict(zip(tokens.idents(), tokens.keys(SESSION_PURPOSE), strict=True))
                return role, keys[ident]
        return None, None

    async def logout(self, request: web.Request) -> web.Response:
        session = self.session(request)
        refused = await self._check_post(request, session, act=False)
        if refused is not None:
            return refused
        response = _see_other("/console/login")
        response.del_cookie(SESSION_COOKIE, path="/console")
        return response

    async def _check_post(
        self, request: web.Request, session: Session | None, *, act: bool
    ) -> web.Response | None:
        """Why a POST is refused, or None: no session 401; another site's origin, no
        or a wrong CSRF token, or a view session asking to act 403."""
        if session is None:
            return self._refused(401, "not signed in")
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.host:
            return self._refused(403, "a request from another site")
        form = await request.post()
        if not session.csrf_ok(str(form.get("_csrf", ""))):
            return self._refused(403, "missing or wrong CSRF token: reload the page")
        if act and not session.may_act:
            return self._refused(403, f"{session.user} signed in with a view token: may not act")
        return None

    def _refused(self, status: int, message: str) -> web.Response:
        return _html(render.page("error.html", status=status, message=message, back=""), status)

    # --- pages

    async def _page(
        self, request: web.Request, draw: Callable[[Cluster, Session, bool], str | None]
    ) -> web.Response:
        session = self.session(request)
        fragment = request.query.get("fragment") == "1"
        if session is None:
            if fragment:
                return self._refused(401, "not signed in")
            return _see_other("/console/login")
        body = draw(self.intake.cluster(), session, fragment)
        if body is None:
            return _html(
                render.page(
                    "error.html",
                    status=404,
                    message="not found",
                    back="/console/fleet",
                    session=session,
                ),
                404,
            )
        return _html(body)

    async def fleet(self, request: web.Request) -> web.Response:
        return await self._page(request, lambda c, s, f: render.fleet_page(c, s, fragment=f))

    async def faults(self, request: web.Request) -> web.Response:
        return await self._page(request, lambda c, s, f: render.faults_page(c, s, fragment=f))

    async def fault(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return await self._page(request, lambda c, s, f: render.fault_page(c, name, s, fragment=f))

    async def node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return await self._page(request, lambda c, s, f: render.node_page(c, name, s, fragment=f))

    # --- actions

    async def approve(self, request: web.Request) -> web.Response:
        return await self._answer(request, APPROVED)

    async def reject(self, request: web.Request) -> web.Response:
        return await self._answer(request, REJECTED)

    async def release(self, request: web.Request) -> web.Response:
        return await self._act(request, "release")

    async def acknowledge(self, request: web.Request) -> web.Response:
        return await self._act(request, "acknowledge")

    async def _answer(self, request: web.Request, decision: str) -> web.Response:
        return await self._act(request, decision)

    async def _act(self, request: web.Request, what: str) -> web.Response:
        """One action on a fault (approved, rejected, release, acknowledge), from an act
        session with its CSRF token, on the leader; back to the fault's page."""
        session = self.session(request)
        refused = await self._check_post(request, session, act=True)
        if refused is not None:
            return refused
        assert session is not None  # noqa: S101 -- _check_post refuses a request without
        name = request.match_info["name"]
        if not self.intake.leading():
            return self._refused(503, "this replica does not lead: open the leader's console")
        if what == "acknowledge":
            status, body = await self.intake.acknowledge(name, session.by)
        elif what == "release":
            status, body = await self.intake.release(name, session.by)
        else:
            status, body = await self.intake.answer(name, what, session.by)
        log.info(
            "console action",
            extra={"fault": name, "action": what, "by": session.by, "status": status},
        )
        if status != 200:
            return _html(
                render.page(
                    "error.html",
                    status=status,
                    message=str(body.get("error", "refused")),
                    back=f"/console/faults/{quote(name)}",
                    session=session,
                ),
                status,
            )
        return _see_other(f"/console/faults/{quote(str(body['name']))}")

    # --- live updates and assets

    async def events(self, request: web.Request) -> web.StreamResponse:
        session = self.session(request)
        if session is None:
            return self._refused(401, "not signed in")
        if len(self._streams) >= MAX_STREAMS:
            return self._refused(503, "too many open consoles on this replica")
        response = web.StreamResponse(
            headers={
                **HEADERS,
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",  # a proxy must pass each event on at once
            }
        )
        await response.prepare(request)
        task = asyncio.current_task()
        assert task is not None  # noqa: S101 -- a handler runs in a task
        self._streams.add(task)
        feed = self.intake.changes
        sent = -1
        try:
            while time.time() < session.expires:
                version = await feed.after(sent, HEARTBEAT_S)
                if version != sent:
                    await response.write(f"event: version\ndata: {feed.tag(version)}\n\n".encode())
                    sent = version
                    await asyncio.sleep(EVENT_INTERVAL_S)
                else:
                    await response.write(b": still here\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the page went away, or the server stops
        finally:
            self._streams.discard(task)
        return response

    async def _close_streams(self, _: web.Application) -> None:
        """Stopping: end the event streams, else the server waits for them."""
        for task in list(self._streams):
            task.cancel()

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["file"]
        if request.match_info["version"] != render.ASSET_VERSION or name not in render.ASSETS:
            return web.Response(status=404, text="not found\n", headers=HEADERS)
        return web.Response(
            body=render.ASSETS[name],
            headers={
                **HEADERS,
                "Content-Type": render.ASSET_TYPES[name],
                "Cache-Control": "public, max-age=31536000, immutable",
            },
        )


def _secured(handler: Page) -> Page:
    """A handler whose every answer carries the console's security headers."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        response = await handler(request)
        if not response.prepared:
            response.headers.update(HEADERS)
        return response

    return wrapped


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(
        text=body,
        status=status,
        content_type="text/html",
        headers={**HEADERS, "Cache-Control": "no-store"},
    )


def _see_other(location: str) -> web.Response:
    # Returned, not raised: the API's guard turns a raised HTTPException into JSON.
    return web.Response(status=303, headers={**HEADERS, "Location": location})
