"""The checkpoint webhook's failure is told without its URL's secrets."""

from __future__ import annotations

import asyncio
import http.server
import io
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest
from rich.console import Console

from gpuheal.config import parse_config
from gpuheal.kube.api import KubeApi
from gpuheal.ops.context import Context
from gpuheal.ops.maintenance import _call_webhook

SECRET = "XqZ7vN2kLp9RtY4wMb6c8dFg"  # a made-up webhook secret


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def refusing() -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_a_failing_checkpoint_webhook_is_named_by_its_host(refusing: str) -> None:
    url = f"http://ops:pa55w0rd@{refusing[len('http://') :]}/services/T0A/B0B/{SECRET}?k=q-t0k"
    config = parse_config({"maintenance": {"checkpoint": "webhook", "checkpointWebhookUrl": url}})
    stderr = io.StringIO()
    ctx = Context(
        api=cast(KubeApi, None),  # the webhook needs no cluster
        config=config,
        err=Console(file=stderr, width=400),
    )
    why = asyncio.run(_call_webhook(ctx, "gpu-node-7", "firmware", "2026-12-01T02:35:12Z", []))
    # Before: "checkpoint webhook http://ops:pa55w0rd@.../services/T0A/B0B/<secret>?k=...
    # failed: Client error '404 Not Found' for url 'http://ops:pa55w0rd@...'".
    assert why == f"checkpoint webhook {refusing} failed: HTTP 404 Not Found"
    for told in (why, stderr.getvalue()):
        for secret in (SECRET, "pa55w0rd", "q-t0k", "services"):
            assert secret not in told, told
