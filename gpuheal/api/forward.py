"""A standby replica passes on what only the leader may do (approve, reject, release,
a console action, an alert, a manual trigger), so whichever replica a Service or a
`kubectl port-forward svc/...` lands on, it works.

The leader's address is on the Lease (kube/leader.py, ADDRESS_ANNOTATION). The
request goes on as it came: method, path, query, body, the caller's credentials
(its token or session cookie: the leader checks them as it would its own) and its
Host, so the console's same-origin check sees the address the person used. A
request already forwarded is never forwarded again: a replica that is not the
leader either answers 503, as it did before forwarding existed.
"""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

log = logging.getLogger(__name__)

FORWARDED_BY = "X-Gpuheal-Forwarded-By"
TIMEOUT_S = 15.0
# RFC 9110 7.6.1's connection-specific fields, and the length the client sets anew.
_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE",
        "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length",
    )
)  # fmt: skip
# The server hands the body decoded; the leader's answer goes back as it came.
_REQUEST_DROPPED = _HOP | {"content-encoding"}
# Reads and sign-ins need no leader: every replica answers them from its caches and
# the shared token keys.
_LOCAL = frozenset({"/console/login", "/console/logout"})


def wanted(request: web.Request) -> bool:
    """Is this a request only the leader answers (a write to /api/ or /console/)?"""
    return (
        request.method not in ("GET", "HEAD", "OPTIONS")
        and request.path.startswith(("/api/", "/console/"))
        and request.path not in _LOCAL
        and FORWARDED_BY not in request.headers
    )


class Forwarder:
    """Passes requests on to the leader, over one pooled client session."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self._session: aiohttp.ClientSession | None = None

    async def forward(self, request: web.Request, leader: str) -> web.Response:
        body = await request.read()
        headers = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in _REQUEST_DROPPED
        )
        headers[FORWARDED_BY] = self.identity
        url = f"{leader.rstrip('/')}{request.rel_url}"
        session = self._client()
        try:
            async with session.request(
                request.method, url, data=body, headers=headers, allow_redirects=False
            ) as answer:
                content = await answer.read()
                kept = CIMultiDict(
                    (k, v) for k, v in answer.headers.items() if k.lower() not in _HOP
                )
                log.info(
                    "forwarded to the leader",
                    extra={"path": request.path, "leader": leader, "status": answer.status},
                )
                return web.Response(status=answer.status, body=content, headers=kept)
        except (aiohttp.ClientError, TimeoutError) as err:
            log.warning(
                "the leader did not answer a forwarded request",
                extra={"path": request.path, "leader": leader, "error": str(err)[:200]},
            )
            return web.json_response(
                {"title": "not the leader, and the leader did not answer; retry"},
                status=503,
                headers={"Retry-After": "2"},
                content_type="application/problem+json",
            )

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
                # The caller's cookies go in its headers, none kept here.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
