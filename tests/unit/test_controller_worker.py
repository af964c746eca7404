"""The reconcile worker: it keeps going, and keeps the key, when a write is
refused because the lease looked stale for a moment; a reconcile that keeps
failing backs off, is counted by reason, is logged once (then now and then),
and puts one Warning Event on the node per failure streak."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import aiohttp
import pytest

from gpuheal.controller.result import Result
from gpuheal.controller.worker import ReconcileFailures, work
from gpuheal.kube.api import ApiError, NotLeaderError
from gpuheal.kube.credentials import CredentialError
from gpuheal.kube.failures import Streaks, failure_reason
from gpuheal.kube.workqueue import WorkQueue
from tests.corpus import EKS_NODE, FQDN_253

# What the API server answered in issue 14 to a taint value over 63 characters.
INVALID = ApiError(
    422,
    "Invalid",
    f'Node "{EKS_NODE}" is invalid: metadata.taints[1].value: Invalid value: '
    f'"{EKS_NODE}-xid79-0000000000000000": must be no more than 63 bytes',
)
FORBIDDEN = ApiError(
    403, "Forbidden", f'nodes "{EKS_NODE}" is forbidden: ValidatingAdmissionPolicy denied'
)


class Told:
    """What the failures reporter said: metric reasons and Events."""

    def __init__(self) -> None:
        self.counted: list[str] = []
        self.events: list[tuple[str, str]] = []

    def failures(self, streaks: Streaks | None = None) -> ReconcileFailures:
        return ReconcileFailures(
            counted=self.counted.append,
            warn=lambda node, note: self.events.append((node, note)),
            streaks=streaks,
        )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _run(
    reconcile_results: dict[str, list[object]],
    keys: list[str],
    failures: ReconcileFailures,
    queue: WorkQueue | None = None,
) -> list[tuple[str, float]]:
    queue = WorkQueue() if queue is None else queue
    seen: list[tuple[str, float]] = []
    done = asyncio.Event()

    async def reconcile(key: str) -> Result:
        seen.append((key, time.monotonic()))
        result = reconcile_results[key].pop(0)
        if not reconcile_results[key] and all(not r for r in reconcile_results.values()):
            done.set()
        if isinstance(result, BaseException):
            raise result
        assert result is None or isinstance(result, float)
        return Result(requeue_after=result)

    worker = asyncio.create_task(work(queue, reconcile, not_leader_retry_s=0.01, failures=failures))
    for key in keys:
        queue.add(key)
    await asyncio.wait_for(done.wait(), timeout=10)
    worker.cancel()
    return seen


def test_a_refused_write_requeues_the_node_and_the_worker_goes_on() -> None:
    results: dict[str, list[object]] = {
        "n1": [NotLeaderError("refusing PATCH: not the leader"), None],
        "n2": [None],
    }
    told = Told()
    seen = [key for key, _ in asyncio.run(_run(results, ["n1", "n2"], told.failures()))]
    assert seen.count("n1") == 2, seen  # looked at again after the refusal
    assert "n2" in seen  # the worker did not stop at the refusal
    assert told.counted == [] and told.events == []  # a refused write is no failure


def test_a_failing_reconcile_backs_off_exponentially() -> None:
    results: dict[str, list[object]] = {EKS_NODE: [INVALID] * 5 + [None]}
    queue = WorkQueue(backoff_base_s=0.02, backoff_max_s=10)
    seen = asyncio.run(_run(results, [EKS_NODE], Told().failures(), queue))
    gaps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(seen)]
    assert len(gaps) == 5
    for n, gap in enumerate(gaps):
        assert gap >= 0.02 * 2**n * 0.95, gaps  # 0.02, 0.04, 0.08, ... (timer slack)


def test_a_reconcile_that_keeps_failing_is_told_once_then_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, told = Clock(), Told()
    failures = told.failures(Streaks(repeat_s=300, clock=clock))
    caplog.set_level(logging.INFO, logger="gpuheal.controller.worker")

    for _ in range(50):  # 50 retries within five minutes
        failures.failed(EKS_NODE, INVALID, retry_s=1.0)
        clock.now += 5
    assert told.counted == ["Invalid"] * 50  # every failure counts
    assert [node for node, _ in told.events] == [EKS_NODE]  # one Event per streak
    assert "Invalid" in told.events[0][1] and "must be no more than 63 bytes" in told.events[0][1]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].getMessage() == "reconcile failed"
    assert vars(errors[0])["reason"] == "Invalid" and vars(errors[0])["node"] == EKS_NODE
    assert errors[0].exc_info is None  # the API server's answer says it all: no traceback

    clock.now += 60  # five minutes since the first line: a reminder with the count
    failures.failed(EKS_NODE, INVALID, retry_s=60.0)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == ["reconcile failed", "reconcile still failing"]
    assert vars(errors[1])["failures"] == 51 and vars(errors[1])["untold"] == 49
    assert len(told.events) == 1

    failures.failed(EKS_NODE, FORBIDDEN, retry_s=60.0)  # a new reason is told at once
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert vars(errors[-1])["reason"] == "Forbidden" and len(errors) == 3
    assert len(told.events) == 1  # still the same streak

    failures.succeeded(EKS_NODE)
    assert [r.getMessage() for r in caplog.records][-1] == "reconcile recovered"
    failures.failed(EKS_NODE, INVALID, retry_s=0.5)  # a new streak: told again, new Event
    assert len(told.events) == 2
    assert [r.getMessage() for r in caplog.records][-1] == "reconcile failed"


def test_a_bug_is_logged_with_its_traceback_once(caplog: pytest.LogCaptureFixture) -> None:
    told = Told()
    failures = told.failures()
    caplog.set_level(logging.INFO, logger="gpuheal.controller.worker")
    for _ in range(3):
        try:
            raise KeyError(FQDN_253)
        except KeyError as err:
            failures.failed(FQDN_253, err, retry_s=0.5)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert told.counted == ["Unexpected"] * 3


def test_failures_from_the_worker_are_counted_and_the_streak_ends_on_success() -> None:
    told = Told()
    results: dict[str, list[object]] = {"n1": [INVALID, INVALID, 0.0, FORBIDDEN, None]}
    queue = WorkQueue(backoff_base_s=0.01, backoff_max_s=0.05)
    asyncio.run(_run(results, ["n1"], told.failures(), queue))
    assert told.counted == ["Invalid", "Invalid", "Forbidden"]
    assert [node for node, _ in told.events] == ["n1", "n1"]  # two streaks, two Events


@pytest.mark.parametrize(
    ("err", "reason"),
    [
        (INVALID, "Invalid"),
        (ApiError(422, "", "no status body"), "Invalid"),
        (ApiError(409, "Conflict", "the object has been modified"), "Conflict"),
        (ApiError(409, "AlreadyExists", "exists"), "AlreadyExists"),
        (ApiError(418, "Teapot", "x"), "ClientError"),  # unknown reasons never become labels
        (ApiError(502, "", "bad gateway"), "ServerError"),
        (ApiError(504, "", "gateway timeout"), "Timeout"),
        (ApiError(500, "InternalError", "etcdserver: request timed out"), "InternalError"),
        (aiohttp.ClientConnectionError("connection refused"), "Unreachable"),
        (aiohttp.ServerDisconnectedError(), "Unreachable"),
        (aiohttp.ClientPayloadError("response cut off"), "Unreachable"),
        (aiohttp.SocketTimeoutError("timed out"), "Timeout"),
        (aiohttp.ConnectionTimeoutError("connect timed out"), "Timeout"),
        (CredentialError("exec credential plugin aws failed"), "Unauthorized"),
        (ValueError(FQDN_253), "Unexpected"),
    ],
)
def test_failure_reasons_are_few_and_fixed(err: Exception, reason: str) -> None:
    assert failure_reason(err) == reason
