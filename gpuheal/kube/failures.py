"""Failures of work that talks to the API server, made visible without noise.

`failure_reason` names a failure with one word from a small fixed set, so a
metric label built from it cannot grow without bound (a message or an object
name never becomes a label). `Streaks` decides when a failure that repeats on
every retry is worth a log line: the first failure of a key, a change of
reason, and otherwise once per interval with the count of repeats in between,
so a failure that lasts a day costs a few hundred lines, not one per retry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from gpuheal.kube.api import ApiError
from gpuheal.kube.credentials import CredentialError

# The API server's own StatusReason values (k8s.io/apimachinery metav1.StatusReason).
STATUS_REASONS = frozenset(
    {
        "BadRequest",
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Gone",
        "Expired",
        "Invalid",
        "ServerTimeout",
        "StoreReadError",
        "Timeout",
        "TooManyRequests",
        "MethodNotAllowed",
        "NotAcceptable",
        "RequestEntityTooLarge",
        "UnsupportedMediaType",
        "InternalError",
        "ServiceUnavailable",
    }
)
# What a bare status code means when the body named no (known) reason.
_BY_CODE = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Gone",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
CLIENT_ERROR = "ClientError"  # another 4xx
SERVER_ERROR = "ServerError"  # another 5xx
TIMEOUT = "Timeout"
UNREACHABLE = "Unreachable"  # no answer: connection refused, reset, TLS failure
UNEXPECTED = "Unexpected"  # not an answer from the API server: a bug of ours


def failure_reason(err: BaseException) -> str:
    """A short name for what went wrong, from a bounded set (for metric labels)."""
    if isinstance(err, ApiError):
        return _answer_reason(err)
    if isinstance(err, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
        return TIMEOUT
    if isinstance(
        err, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | ConnectionError
    ):
        return UNREACHABLE  # refused, reset, TLS failure, or cut off mid-answer
    if isinstance(err, CredentialError):
        return "Unauthorized"  # nothing to prove who we are: no request was sent
    return UNEXPECTED


def _answer_reason(err: ApiError) -> str:
    if err.reason in STATUS_REASONS:
        return err.reason
    if err.code in _BY_CODE:
        return _BY_CODE[err.code]
    return SERVER_ERROR if err.code >= 500 else CLIENT_ERROR


def describe(err: BaseException, limit: int = 512) -> str:
    """The failure in one line for logs, Events and /readyz (messages can be long)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Streak:
    """One key's failures since its last success."""

    reason: str
    error: str
    started: float
    reported: float
    failures: int = 1
    unreported: int = 0  # failures since the last report


@dataclass(frozen=True)
class Report:
    """A failure worth a log line: the first of a streak, a new reason, or a reminder."""

    streak: Streak
    first: bool
    changed: bool
    repeats: int  # failures left unreported since the previous report


class Streaks:
    """Failure streaks per key, and when each is worth reporting again."""

    def __init__(
        self, repeat_s: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.repeat_s = repeat_s
        self.clock = clock
        self._streaks: dict[str, Streak] = {}

    def get(self, key: str) -> Streak | None:
        return self._streaks.get(key)

    def failed(self, key: str, reason: str, error: str) -> Report | None:
        """Note a failure; a Report when it should be told, None to stay quiet."""
        now = self.clock()
        streak = self._streaks.get(key)
        if streak is None:
            streak = self._streaks[key] = Streak(reason, error, started=now, reported=now)
            return Report(streak, first=True, changed=False, repeats=0)
        streak.failures += 1
        changed = reason != streak.reason
        streak.reason, streak.error = reason, error
        if not changed and now - streak.reported < self.repeat_s:
            streak.unreported += 1
            return None
        repeats, streak.unreported, streak.reported = streak.unreported, 0, now
        return Report(streak, first=False, changed=changed, repeats=repeats)

    def succeeded(self, key: str) -> Streak | None:
        """End the key's streak; the streak that ended, if there was one."""
        return self._streaks.pop(key, None)
