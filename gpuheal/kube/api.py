"""A thin asyncio client for the Kubernetes REST API: raw JSON in and out.

aiohttp underneath: one pooled, keep-alive session per client, sized to the
work that shares it (long-lived watches hold a connection each). The
kubeconfig is read by kube/kubeconfig.py and the credentials each request
carries come from kube/credentials.py (a token file re-read as it rotates, an
exec plugin re-run as its credential expires, both renewed once after a 401).
List/watch responses stay bytes, so they can be decoded straight into slim
projections (kube/projections.py) instead of full models.

Every mutating request passes the write gate first: a replica that is not the
leader (or has just lost the lease) cannot write, whatever code path tries
(docs/architecture.md#the-write-gate).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gpuheal.kube.credentials import Credential, Credentials, credentials_for, tls_context
from gpuheal.kube.kubeconfig import RestConfig, load_rest_config
from gpuheal.model import GPUFAULT_API_VERSION, GPUFAULT_PLURAL, GPUROLLOUT_PLURAL

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
USER_AGENT = "gpuheal"

# Besides the workers, each holding at most one request at a time: one watch per
# informer (4), the lease, the event senders (4), retention, and room for bursts.
STANDING_CONNECTIONS = 16
# Shorter than the API server's idle timeout (90 s), so we close idle connections
# first and never send a request down one the server is closing.
KEEPALIVE_S = 30.0
CONNECT_TIMEOUT_S = 10.0
# aiohttp rounds a timeout of 5 s or more up to the next whole second of the loop's
# clock (to batch timers): a 5 s limit fired after up to 6 s. Deadlines here are
# promises (the agent's report, the lease's renewal), so they fire when they say.
EXACT = math.inf


def connections_for(workers: int) -> int:
    """The connection pool for a controller with `workers` reconcile workers."""
    return workers + STANDING_CONNECTIONS


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(
        self, code: int, reason: str, message: str, causes: tuple[Cause, ...] = ()
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.causes = causes  # the Status's details.causes: what exactly was refused


@dataclass(frozen=True)
class Cause:
    """One of a Status's details.causes (e.g. type "DisruptionBudget" on a refused
    eviction, whose message names the budget)."""

    type: str
    message: str


class NotLeaderError(RuntimeError):
    """A write was attempted by a replica that does not hold the lease."""


class WatchStalledError(TimeoutError):
    """A watch stream stayed silent longer than its inactivity limit: the connection
    may be half-open (it would never error), so the watcher should reopen it."""


def _error(code: int, body: bytes) -> ApiError:
    try:
        status = json.loads(body)
        causes = tuple(
            Cause(str(c.get("reason", "")), str(c.get("message", "")))
            for c in (status.get("details") or {}).get("causes") or ()
        )
        return ApiError(code, status.get("reason", ""), status.get("message", ""), causes)
    except (ValueError, AttributeError):
        return ApiError(code, "", body[:200].decode("utf-8", "replace"))


class KubeApi:
    """One API server, one session. Build it anywhere; the session opens on the
    first request, in the event loop that makes it (aiohttp's requirement)."""

    def __init__(
        self,
        config: RestConfig,
        *,
        timeout_s: float = 30.0,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        connections: int = connections_for(4),
        trust_env: bool = False,
        credentials: Credentials | None = None,
    ) -> None:
        self.config = config
        self.credentials = credentials or credentials_for(config)
        self.write_gate: Callable[[], bool] = lambda: True
        self.requests = 0  # for tests and benchmarks: requests sent
        self.connections = connections
        self._ssl = tls_context(config)  # here, so a bad certificate fails at start
        self._timeout = aiohttp.ClientTimeout(
            total=timeout_s, sock_connect=connect_timeout_s, ceil_threshold=EXACT
        )
        self._connect_timeout_s = connect_timeout_s
        self._trust_env = trust_env  # False: HTTP(S)_PROXY of the environment is ignored
        self._server = config.server
        self._extra: dict[str, Any] = {}
        if config.proxy_url:
            self._extra["proxy"] = config.proxy_url
        if config.tls_server_name:
            self._extra["server_hostname"] = config.tls_server_name
        self._headers = {"Accept": JSON}
        if config.disable_compression:
            self._headers["Accept-Encoding"] = "identity"
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(
        cls,
        path: Path | None,
        *,
        context: str | None = None,
        timeout_s: float = 30.0,
        connections: int = connections_for(4),
        trust_env: bool = False,
    ) -> KubeApi:
        """From a kubeconfig file, or (None) $KUBECONFIG / ~/.kube/config / in-cluster."""
        return cls(
            load_rest_config(path, context),
            timeout_s=timeout_s,
            connections=connections,
            trust_env=trust_env,
        )

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.connections,
                keepalive_timeout=KEEPALIVE_S,
                ssl=self._ssl,
                timeout_ceil_threshold=EXACT,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                trust_env=self._trust_env,
                cookie_jar=aiohttp.DummyCookieJar(),
                headers={"User-Agent": USER_AGENT},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _request_options(self, credential: Credential, headers: dict[str, str]) -> dict[str, Any]:
        if credential.authorization:
            headers["Authorization"] = credential.authorization
        options = {**self._extra, "headers": headers}
        if credential.ssl is not None:
            options["ssl"] = credential.ssl  # a client certificate from an exec plugin
        return options

    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = JSON,
        params: dict[str, str] | None = None,
        ungated: bool = False,
    ) -> bytes:
        if method != "GET" and not ungated and not self.write_gate():
            raise NotLeaderError(f"refusing {method} {path}: not the leader")
        content = None if body is None else json.dumps(body).encode()
        http, url = self._http(), self._server + path
        renewed = False
        while True:
            credential = await self.credentials.current()
            headers = dict(self._headers)
            if content is not None:
                headers["Content-Type"] = content_type
            self.requests += 1
            async with http.request(
                method, url, data=content, params=params,
                **self._request_options(credential, headers),
            ) as response:  # fmt: skip
                data = await response.read()
                status = response.status
            # A 401 means the request was not served: retrying even a POST is safe.
            if status == 401 and not renewed and await self.credentials.renew(credential):
                renewed = True
                continue
            if status >= 400:
                raise _error(status, data)
            return data

    async def get(self, path: str, params: dict[str, str] | None = None) -> bytes:
        return await self._send("GET", path, params=params)

    async def create(self, path: str, body: Any, *, ungated: bool = False) -> bytes:
        """POST. `ungated` is for the leader election itself, which must write to lead."""
        return await self._send("POST", path, body=body, ungated=ungated)

    async def update(self, path: str, body: Any, *, ungated: bool = False) -> bytes:
        return await self._send("PUT", path, body=body, ungated=ungated)

    async def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH) -> bytes:
        return await self._send("PATCH", path, body=body, content_type=content_type)

    async def delete(self, path: str, body: Any = None) -> bytes:
        return await self._send("DELETE", path, body=body)

    async def watch(
        self, path: str, params: dict[str, str], read_timeout_s: float
    ) -> AsyncGenerator[bytes]:
        """Stream watch events, one JSON line each. A read that waits longer than
        `read_timeout_s` raises WatchStalledError: the inactivity watchdog. Close the
        iterator (contextlib.aclosing) to give the connection back at once."""
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self._connect_timeout_s,
            sock_read=read_timeout_s,
            ceil_threshold=EXACT,
        )
        http, url = self._http(), self._server + path
        query = {**params, "watch": "true"}
        renewed = False
        while True:
            credential = await self.credentials.current()
            self.requests += 1
            try:
                async with http.get(
                    url, params=query, timeout=timeout,
                    **self._request_options(credential, dict(self._headers)),
                ) as response:  # fmt: skip
                    if response.status == 401 and not renewed:
                        await response.read()
                        if await self.credentials.renew(credential):
                            renewed = True
                            continue
                        raise _error(401, await response.read())
                    if response.status >= 400:
                        raise _error(response.status, await response.read())
                    while line := await response.content.readline():
                        if line != b"\n":
                            yield line
                    return
            except aiohttp.SocketTimeoutError as err:
                raise WatchStalledError(f"watch {path}: silent for {read_timeout_s:g} s") from err


# Dynamic Resource Allocation (resource.k8s.io, GA at v1 since Kubernetes 1.34).
RESOURCE_API = "/apis/resource.k8s.io/v1"


def device_taint_rule_path(name: str = "", version: str = "v1beta2") -> str:
    """gpuheal's device fence (KEP-5055): resource.k8s.io/v1beta2 in Kubernetes 1.36
    (where that version is turned on), v1 from 1.37."""
    base = f"/apis/resource.k8s.io/{version}/devicetaintrules"
    return f"{base}/{name}" if name else base


def claim_path(namespace: str, name: str = "") -> str:
    base = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"
    return f"{base}/{name}" if name else base


def node_path(name: str = "") -> str:
    return f"/api/v1/nodes/{name}" if name else "/api/v1/nodes"


def pod_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{namespace}/pods"
    return f"{base}/{name}" if name else base


def configmap_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps/{name}"


def gpufault_path(name: str = "", status: bool = False) -> str:
    base = f"/apis/{GPUFAULT_API_VERSION}/{GPUFAULT_PLURAL}"
    if not name:
        return base
    return f"{base}/{name}/status" if status else f"{base}/{name}"


def gpurollout_path(name: str = "", status: bool = False) -> str:
    base = f"/apis/{GPUFAULT_API_VERSION}/{GPUROLLOUT_PLURAL}"
    if not name:
        return base
    return f"{base}/{name}/status" if status else f"{base}/{name}"
