"""repair.replace end to end on the real control plane: the controller calls a
provider webhook (a tiny aiohttp receiver in the test, counting calls and
idempotency keys) with its intent recorded first; a controller SIGKILLed between
the intent and the call calls again under the same key; a failing hook is retried
with backoff a bounded number of times, then a person is asked; the provider's
deletion of the node closes the record."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal.policy.replace import IDEMPOTENCY_HEADER, idempotency_key
from gpuheal.sim.resources import GPUFault
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    events_for,
    faults_of,
    our_taint,
    record_entries,
    record_of,
)
from tests.integration.test_repair import held, phase, repair_config, report

pytestmark = pytest.mark.timeout(240)

SECRET = "s3cr3t-path-token-9f8e"
PROVIDER_ID = "aws:///us-west-2a/i-0f1e2d3c4b5a69788"


@dataclass
class Receiver:
    """The provider's side: every call as it came (key header, body), and the status
    it answers with."""

    status: int = 202
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    url: str = ""

    def keys(self) -> list[str]:
        return [key for key, _ in self.calls]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    got = Receiver()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner: web.AppRunner | None = None

    async def hook(request: web.Request) -> web.Response:
        body = await request.json()
        got.calls.append((request.headers.get(IDEMPOTENCY_HEADER, ""), body))
        return web.json_response({"accepted": got.status < 300}, status=got.status)

    async def serve() -> None:
        nonlocal runner
        app = web.Application()
        app.router.add_post(f"/hook/{SECRET}", hook)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        got.url = f"http://127.0.0.1:{port}/hook/{SECRET}"
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop)
    assert started.wait(10)
    yield got
    if runner is not None:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def replacing(pool: dict[str, str], url: str, **hook: Any) -> dict[str, Any]:
    return repair_config(
        pool,
        actionByReason={"EccUncontained95": "replace"},
        replace={"webhook": url, "timeoutSeconds": 5, **hook},
    )


def test_the_hook_is_called_once_per_attempt_through_a_controller_kill_then_the_record_closes(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    receiver: Receiver,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    kube.patch(Node, node, {"spec": {"providerID": PROVIDER_ID}})
    config = replacing(pool, receiver.url)
    # Killed right after the intent is stored, before the call.
    doomed = start_controller(config, env={"GPUHEAL_CRASH_AFTER": "ReplaceIntent"})
    report(kube, node, "replace-me")
    assert doomed.wait_exit(60) == -9, "the controller was not killed after the intent"
    record = record_of(kube, node)
    (intent,) = record_entries(record, "replace-requested")
    assert not record_entries(record, "replace-accepted") and receiver.calls == []
    key = idempotency_key("replace-me", 1)
    assert intent["detail"] == f"replace attempt 1: key {key}"

    survivor = start_controller(config)
    wait_for(
        "accepted", lambda: record_entries(record_of(kube, node), "replace-accepted"), timeout_s=30
    )
    # At least once, never under another key: one distinct key for the one attempt.
    assert set(receiver.keys()) == {key} and 1 <= len(receiver.calls) <= 2
    _, body = receiver.calls[0]
    assert body == {
        "node": node,
        "faultId": "replace-me",
        "attempt": 1,
        "reason": "EccUncontained95",
        "providerID": PROVIDER_ID,
        "idempotencyKey": key,
    }
    record = record_of(kube, node)
    assert len(record_entries(record, "replace-requested")) == 1
    (accepted,) = record_entries(record, "replace-accepted")
    assert "HTTP 202" in accepted["detail"] and SECRET not in json.dumps(record.status)
    assert len(events_for(kube, node, "GPUNodeReplaceAccepted", at_least=1)) == 1
    assert our_taint(kube, node) is not None  # quarantined until the provider acts
    calls = len(receiver.calls)

    kube.delete(Node, node)  # the provider replaced it
    name = record.metadata.name
    wait_for("record closed", lambda: phase(kube, name) == "Resolved", timeout_s=30)
    assert record_entries(kube.get(GPUFault, name), "node-deleted")
    assert len(receiver.calls) == calls
    assert SECRET not in doomed.log() + survivor.log()


def test_a_failing_hook_is_retried_with_backoff_a_bounded_number_of_times_then_a_person(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    receiver: Receiver,
) -> None:
    receiver.status = 500
    (node,) = fake_gpu_nodes(1, labels=pool)
    start_controller(replacing(pool, receiver.url, maxAttempts=3, retryBaseSeconds=0.5))
    report(kube, node, "provider-down")

    wait_for("the record", lambda: faults_of(kube, node), timeout_s=30)  # held() wants one
    record = wait_for("contact support", lambda: held(kube, node), timeout_s=60)
    keys = [idempotency_key("provider-down", n) for n in (1, 2, 3)]
    assert receiver.keys() == keys  # one call per attempt, each its own key
    failed = record_entries(record, "replace-failed")
    assert [f["detail"].split(":")[0] for f in failed] == [
        f"replace attempt {n}" for n in (1, 2, 3)
    ]
    assert all("HTTP 500" in f["detail"] for f in failed)
    (exhausted,) = record_entries(record, "repair-exhausted")
    assert "3 replace call(s) failed" in exhausted["detail"]
    assert len(events_for(kube, node, "GPUNodeReplaceFailed", at_least=3)) == 3
    assert len(events_for(kube, node, "GPUContactSupport", at_least=1)) == 1
    wait_for("no more calls", lambda: len(receiver.calls) == 3, timeout_s=2)
    assert our_taint(kube, node) is not None
