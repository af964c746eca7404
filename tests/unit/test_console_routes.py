"""The console's routes on an aiohttp test server, bound to a stand-in for the
controller's intake (no Kubernetes here: the caches are the synthetic fleet):
the event stream says each change, assets are served only under their version,
a standby refuses actions, a signed-out request is sent to sign in."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpuheal.api.console import render
from gpuheal.api.console.feed import ChangeFeed
from gpuheal.api.console.routes import CSP, Console
from gpuheal.api.console.views import Cluster
from gpuheal.api.token import ApiTokens
from tests.console_fleet import cluster

TOKEN = "console-unit-token-5b1e"


class Intake:
    """What the controller hands the console: here a synthetic fleet."""

    def __init__(self) -> None:
        self.changes = ChangeFeed()
        self.leads = True
        self.answers: list[tuple[str, str, str]] = []

    def leading(self) -> bool:
        return self.leads

    def cluster(self) -> Cluster:
        return cluster(30, version=self.changes.tag())

    async def answer(self, wanted: str, decision: str, by: str) -> tuple[int, dict[str, Any]]:
        self.answers.append((wanted, decision, by))
        return 200, {"name": wanted}

    async def release(self, wanted: str, by: str) -> tuple[int, dict[str, Any]]:
        self.answers.append((wanted, "release", by))
        return 200, {"name": wanted}

    async def acknowledge(self, wanted: str, by: str) -> tuple[int, dict[str, Any]]:
        self.answers.append((wanted, "acknowledge", by))
        return 200, {"name": wanted}


@asynccontextmanager
async def console(
    tmp_path: Path, intake: Intake, wait: float = 0.0
) -> AsyncIterator[TestClient[Any, Any]]:
    (tmp_path / "token").write_text(TOKEN + "\n")
    tokens = ApiTokens(tmp_path / "token")
    tokens.refresh()
    app = web.Application()
    Console(
        intake,
        act_tokens=tokens,
        view_tokens=ApiTokens(None),
        secure_cookie=lambda: False,
        login_wait=lambda _address: wait,
    ).add_routes(app)
    async with TestClient(TestServer(app)) as client:
        yield client


async def sign_in(client: TestClient[Any, Any]) -> str:
    """Sign in; the CSRF token of the session's forms."""
    form = await (await client.get("/console/login")).text()
    (csrf,) = re.findall(r'name="_csrf" value="([^"]+)"', form)
    answer = await client.post(
        "/console/login", data={"_csrf": csrf, "user": "night-oncall", "token": TOKEN}
    )
    page = await answer.text()
    assert answer.url.path == "/console/fleet", page
    session_csrf: str
    (session_csrf,) = set(re.findall(r'name="_csrf" value="([^"]+)"', page))
    return session_csrf


def run(tmp_path: Path, test: Callable[[TestClient[Any, Any], Intake], Awaitable[None]]) -> Intake:
    intake = Intake()

    async def go() -> None:
        async with console(tmp_path, intake) as client:
            await test(client, intake)

    asyncio.run(go())
    return intake


def test_the_event_stream_says_each_change_of_the_caches(tmp_path: Path) -> None:
    async def test(client: TestClient[Any, Any], intake: Intake) -> None:
        await sign_in(client)
        stream = await client.get("/console/events")
        assert stream.headers["Content-Type"] == "text/event-stream"
        assert stream.headers["Content-Security-Policy"] == CSP
        epoch = intake.changes.epoch
        first = await stream.content.readuntil(b"\n\n")
        assert first == f"event: version\ndata: {epoch}.0\n\n".encode()
        intake.changes.on_change(None, None)
        intake.changes.on_change(None, None)
        line = await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 5)
        assert line == f"event: version\ndata: {epoch}.2\n\n".encode()
        fragment = await (await client.get("/console/fleet?fragment=1")).text()
        assert fragment.startswith(f'<main id="live" data-version="{epoch}.2">')
        stream.close()

    run(tmp_path, test)


def test_signed_out_requests_are_sent_to_sign_in_or_refused(tmp_path: Path) -> None:
    async def test(client: TestClient[Any, Any], _: Intake) -> None:
        page = await client.get("/console/fleet", allow_redirects=False)
        assert (page.status, page.headers["Location"]) == (303, "/console/login")
        for path in ("/console/events", "/console/fleet?fragment=1"):
            assert (await client.get(path)).status == 401, path
        forged = await client.post("/console/faults/x/approve", data={"_csrf": "x"})
        assert forged.status == 401

    assert run(tmp_path, test).answers == []


def test_assets_are_served_only_under_their_version(tmp_path: Path) -> None:
    async def test(client: TestClient[Any, Any], _: Intake) -> None:
        base = f"/console/static/{render.ASSET_VERSION}"
        script = await client.get(f"{base}/console.js")
        assert script.status == 200
        assert script.headers["Content-Type"].startswith("text/javascript")
        assert "immutable" in script.headers["Cache-Control"]
        assert await script.read() == render.ASSETS["console.js"]
        for path in ("/console/static/0000/console.js", f"{base}/token", f"{base}/..%2Fauth.py"):
            assert (await client.get(path)).status == 404, path

    run(tmp_path, test)


def test_an_action_goes_through_with_the_csrf_token_and_on_the_leader_only(
    tmp_path: Path,
) -> None:
    async def test(client: TestClient[Any, Any], intake: Intake) -> None:
        csrf = await sign_in(client)
        done = await client.post(
            "/console/faults/rec-1/approve", data={"_csrf": csrf}, allow_redirects=False
        )
        assert (done.status, done.headers["Location"]) == (303, "/console/faults/rec-1")
        assert (await client.post("/console/faults/rec-1/reject", data={})).status == 403
        assert (await client.post("/console/faults/rec-2/release", data={})).status == 403
        released = await client.post(
            "/console/faults/rec-2/release", data={"_csrf": csrf}, allow_redirects=False
        )
        assert (released.status, released.headers["Location"]) == (303, "/console/faults/rec-2")
        intake.leads = False
        standby = await client.post("/console/faults/rec-1/acknowledge", data={"_csrf": csrf})
        assert standby.status == 503

    intake = run(tmp_path, test)
    assert intake.answers == [
        ("rec-1", "approved", "console:night-oncall"),
        ("rec-2", "release", "console:night-oncall"),
    ]


def test_a_sign_in_beyond_the_addresss_budget_is_refused_before_its_token_is_looked_at(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with console(tmp_path, Intake(), wait=3.2) as client:
            form = await (await client.get("/console/login")).text()
            (csrf,) = re.findall(r'name="_csrf" value="([^"]+)"', form)
            data = {"_csrf": csrf, "user": "night-oncall", "token": TOKEN}
            answer = await client.post("/console/login", data=data, allow_redirects=False)
            assert answer.status == 429
            assert "wait 3 s" in await answer.text()
            assert "gpuheal_session" not in answer.cookies
            # Without the form's own token (another site's form), not even tried.
            forged = await client.post("/console/login", data={**data, "_csrf": "x" * 32})
            assert forged.status == 403

    asyncio.run(go())
