"""The two node annotations of a maintenance request, as the CLI and the controller
write and read them (who may write which: docs/security.md). Pure: no I/O.

`gpuheal.io/maintenance-request` (the CLI writes it, the controller removes it once
carried out): JSON `{"id", "verb": "start"|"finish", "by", "at", ...}` with
`maintenance start`'s options (`reason`, `checkpoint`, `checkpointWaitSeconds`,
`drain`, `drainTimeoutSeconds`, `deleteEmptyDirData`, `force`) or `finish`'s
(`validate`). One request at a time on a node: a second is refused while one is
pending, so two operators' commands never overwrite each other.

`gpuheal.io/maintenance-progress` (the controller only): JSON `{"id", "verb",
"state": "running"|"done", "by", "at", "lines", "count", "code", "report"}`: the
latest lines the work said so far (the drain's blockers, the validation Job;
`count` of them in all), and once done its exit code and report (what `-o json`
prints). The id says which request it answers.

A request that does not decode is refused with a clear error in its progress,
never guessed at.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuheal.values import text

CHECKPOINT_MODES = ("annotate", "webhook", "none")
LINES_KEPT = 20
LINE_MAX = 512
REASON_MAX = 256
BY_MAX = 256


class Verb(StrEnum):
    START = "start"
    FINISH = "finish"


class State(StrEnum):
    RUNNING = "running"
    DONE = "done"


@dataclass(frozen=True)
class MaintenanceRequest:
    id: str
    verb: Verb
    by: str
    at: str
    reason: str = ""
    checkpoint: str | None = None  # None: config maintenance.checkpoint
    checkpoint_wait_s: float | None = None  # None: config
    drain: bool = True
    drain_timeout_s: float | None = None  # None: config
    delete_emptydir_data: bool = False
    force: bool = False
    validate: bool = False

    def encode(self) -> str:
        body: dict[str, Any] = {
            "id": self.id,
            "verb": self.verb.value,
            "by": self.by,
            "at": self.at,
        }
        if self.verb is Verb.START:
            body |= {
                "reason": self.reason,
                "checkpoint": self.checkpoint,
                "checkpointWaitSeconds": self.checkpoint_wait_s,
                "drain": self.drain,
                "drainTimeoutSeconds": self.drain_timeout_s,
                "deleteEmptyDirData": self.delete_emptydir_data,
                "force": self.force,
            }
        else:
            body["validate"] = self.validate
        return json.dumps(body, separators=(",", ":"))

    def describe(self) -> str:
        return f"{self.verb.value} by {self.by or 'someone'} at {self.at or '?'} (id {self.id})"


class BadRequestError(ValueError):
    """A maintenance request that does not decode: what is wrong with it."""


def _seconds(body: Mapping[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequestError(f"{key} must be a number of seconds, not {value!r}")
    if value < 0:
        raise BadRequestError(f"{key} must be 0 or more")
    return float(value)


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise BadRequestError(f"{key} must be true or false, not {value!r}")
    return value


def _string(body: Mapping[str, Any], key: str, limit: int) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise BadRequestError(f"{key} must be a string")
    return text(value, limit)


def parse_request(raw: str) -> MaintenanceRequest:
    """The request, or BadRequestError naming what is wrong."""
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise BadRequestError(f"not JSON: {err}") from None
    if not isinstance(body, dict):
        raise BadRequestError("not a JSON object")
    request_id = body.get("id")
    if not isinstance(request_id, str) or not request_id or len(request_id) > 64:
        raise BadRequestError("id must be a string of 1 to 64 characters")
    try:
        verb = Verb(str(body.get("verb")))
    except ValueError:
        raise BadRequestError(f"verb must be start or finish, not {body.get('verb')!r}") from None
    by, at = _string(body, "by", BY_MAX), _string(body, "at", 64)
    if verb is Verb.FINISH:
        return MaintenanceRequest(request_id, verb, by, at, validate=_flag(body, "validate", False))
    reason = _string(body, "reason", REASON_MAX)
    if not reason.strip():
        raise BadRequestError("reason is required")
    checkpoint = body.get("checkpoint")
    if checkpoint is not None and checkpoint not in CHECKPOINT_MODES:
        raise BadRequestError(f"checkpoint must be one of {', '.join(CHECKPOINT_MODES)}")
    return MaintenanceRequest(
        request_id,
        verb,
        by,
        at,
        reason=reason,
        checkpoint=checkpoint,
        checkpoint_wait_s=_seconds(body, "checkpointWaitSeconds"),
        drain=_flag(body, "drain", True),
        drain_timeout_s=_seconds(body, "drainTimeoutSeconds"),
        delete_emptydir_data=_flag(body, "deleteEmptyDirData", False),
        force=_flag(body, "force", False),
    )


def request_id_of(raw: str | None) -> str:
    """The id of a request as written ("" when there is none or it has none): what a
    finished request's removal checks, so a newer request is never removed."""
    if not raw:
        return ""
    try:
        body = json.loads(raw)
    except ValueError:
        return ""
    value = body.get("id") if isinstance(body, dict) else None
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class Progress:
    id: str
    verb: str
    state: State
    by: str = ""  # the controller replica carrying it out
    at: str = ""
    lines: tuple[str, ...] = ()  # the latest said
    count: int = 0  # every line said: which of `lines` a reader has not seen yet
    code: int | None = None  # once done: the command's exit code
    report: Mapping[str, Any] = field(default_factory=dict)  # once done

    def encode(self) -> str:
        body: dict[str, Any] = {
            "id": self.id,
            "verb": self.verb,
            "state": self.state.value,
            "by": self.by,
            "at": self.at,
            "lines": list(self.lines[-LINES_KEPT:]),
            "count": self.count,
        }
        if self.state is State.DONE:
            body |= {"code": self.code, "report": dict(self.report)}
        return json.dumps(body, separators=(",", ":"))


def kept_lines(lines: Sequence[str]) -> tuple[str, ...]:
    """The latest lines, each cut to a length an annotation carries."""
    return tuple(text(line, LINE_MAX) for line in lines[-LINES_KEPT:])


def parse_progress(raw: str | None) -> Progress | None:
    """The progress as the controller wrote it; None when absent or unreadable."""
    if not raw:
        return None
    try:
        body = json.loads(raw)
        state = State(body["state"])
        code = body.get("code")
        return Progress(
            id=str(body["id"]),
            verb=str(body.get("verb", "")),
            state=state,
            by=str(body.get("by", "")),
            at=str(body.get("at", "")),
            lines=tuple(str(line) for line in body.get("lines", [])),
            count=int(body.get("count", 0)),
            code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            report=body.get("report") if isinstance(body.get("report"), dict) else {},
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
