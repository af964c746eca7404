"""A thin asyncio client for the Kubernetes REST API: raw JSON in and out.

lightkube loads the kubeconfig (files, in-cluster service account, token
rotation, exec plugins) and builds the HTTP client; this module only sends
requests, so list/watch responses can be decoded straight into slim
projections (kube/projections.py) instead of full models.

Every mutating request passes the write gate first: a replica that is not the
leader (or has just lost the lease) cannot write, whatever code path tries.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from lightkube import KubeConfig
from lightkube.config import client_adapter

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


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


def _error(response: httpx2.Response) -> ApiError:
    try:
        status = json.loads(response.content)
        causes = tuple(
            Cause(str(c.get("reason", "")), str(c.get("message", "")))
            for c in (status.get("details") or {}).get("causes") or ()
        )
        return ApiError(
            response.status_code, status.get("reason", ""), status.get("message", ""), causes
        )
    except (ValueError, AttributeError):
        return ApiError(response.status_code, "", response.text[:200])


class KubeApi:
    def __init__(self, http: httpx2.AsyncClient) -> None:
        self.http = http
        self.write_gate: Callable[[], bool] = lambda: True
        self.requests = 0  # for tests and benchmarks: requests sent

    @classmethod
    def from_kubeconfig(cls, path: Path | None, *, timeout_s: float = 30.0) -> KubeApi:
        """From a kubeconfig file, or (None) in-cluster / $KUBECONFIG / ~/.kube/config."""
        config = KubeConfig.from_file(path) if path else KubeConfig.from_env()
        single = config.get()
        if single is None:
            raise ValueError("kubeconfig has no current context")
        params = client_adapter.ConnectionParams(timeout=httpx2.Timeout(timeout_s), trust_env=False)
        return cls(client_adapter.AsyncClient(single, params))

    async def close(self) -> None:
        await self.http.aclose()

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
        headers = {"Accept": JSON}
        content = None
        if body is not None:
            headers["Content-Type"] = content_type
            content = json.dumps(body).encode()
        self.requests += 1
        response = await self.http.request(
            method, path, content=content, headers=headers, params=params
        )
        if response.status_code >= 400:
            raise _error(response)
        return response.content

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
    ) -> AsyncIterator[bytes]:
        """Stream watch events, one JSON line each. A read that waits longer than
        `read_timeout_s` raises httpx2.ReadTimeout: the inactivity watchdog."""
        timeout = httpx2.Timeout(10.0, read=read_timeout_s)
        request = self.http.build_request(
            "GET", path, params={**params, "watch": "true"}, timeout=timeout
        )
        self.requests += 1
        response = await self.http.send(request, stream=True)
        try:
            if response.status_code >= 400:
                await response.aread()
                raise _error(response)
            async for line in response.aiter_lines():
                if line:
                    yield line.encode()
        finally:
            await response.aclose()


def node_path(name: str = "") -> str:
    return f"/api/v1/nodes/{name}" if name else "/api/v1/nodes"


def pod_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{namespace}/pods"
    return f"{base}/{name}" if name else base


GPUFAULT_GROUP = "gpuheal.io"
GPUFAULT_VERSION = "v1alpha1"


def gpufault_path(name: str = "", status: bool = False) -> str:
    base = f"/apis/{GPUFAULT_GROUP}/{GPUFAULT_VERSION}/gpufaults"
    if not name:
        return base
    return f"{base}/{name}/status" if status else f"{base}/{name}"
