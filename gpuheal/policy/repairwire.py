"""The two node annotations of a repair, as the controller and the agent write and
read them (who may write which: docs/security.md). Pure: no I/O.

`gpuheal.io/repair-request` (the controller, only): `<action>;<fault>;<attempt>;<time>`,
e.g. `reset-gpu;3f2a9c0d1e;1;2026-12-01T09:30:00Z`. `<fault>` is the digest of the
fault id (`fault_digest`): a fault id may be any text, the digest is always ten hex
characters, and both sides compute it from the id they already hold.

`gpuheal.io/repair-result` (the agent, only): the request's first three fields, then
`<outcome>;<time>;<detail>`, e.g. `reset-gpu;3f2a9c0d1e;1;done;2026-12-01T09:31:02Z;
reset GPU-…`. The detail is the last field, so it may contain ";".

A request is one attempt of one fault: its key (fault digest and attempt) is what the
agent acts on at most once, and what the result answers. A value that does not
decode is no request (or no result): nothing is done on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from gpuheal import values
from gpuheal.xid import Action

# The repairs an agent can carry out (the catalogue's contact-support is a person's).
REPAIRS = (Action.RESET_GPU, Action.REBOOT)
DETAIL_MAX = 300
_DIGEST = re.compile(r"[0-9a-f]{10}")
_TIME = re.compile(r"[0-9T:.Z+-]{1,40}")


class Outcome(StrEnum):
    DONE = "done"  # carried out (a reset that cleared, a reboot that came back)
    FAILED = "failed"  # tried, and it did not work
    REFUSED = "refused"  # not tried: a process holds the GPU, no reboot method, ...


def fault_digest(fault_id: str) -> str:
    """The fault's name in a request: the digest of its id as gpuheal carries it."""
    return values.digest(values.fault_id(fault_id))


@dataclass(frozen=True)
class RepairRequest:
    action: Action
    fault: str  # fault_digest
    attempt: int
    time: str

    @property
    def key(self) -> str:
        """The attempt's identity: what is done at most once, and what a result answers."""
        return f"{self.fault}/{self.attempt}"

    def encode(self) -> str:
        return f"{self.action.value};{self.fault};{self.attempt};{self.time}"


@dataclass(frozen=True)
class RepairResult:
    action: Action
    fault: str
    attempt: int
    outcome: Outcome
    time: str
    detail: str = ""

    @property
    def key(self) -> str:
        return f"{self.fault}/{self.attempt}"

    def answers(self, request: RepairRequest) -> bool:
        return self.key == request.key and self.action is request.action

    def encode(self) -> str:
        detail = values.text(self.detail, DETAIL_MAX)
        return (
            f"{self.action.value};{self.fault};{self.attempt};{self.outcome.value};"
            f"{self.time};{detail}"
        )


def _head(parts: list[str]) -> tuple[Action, str, int] | None:
    action, fault, attempt = parts[0], parts[1], parts[2]
    if action not in {a.value for a in REPAIRS} or not _DIGEST.fullmatch(fault):
        return None
    if not attempt.isdigit() or not 1 <= int(attempt) <= 999:
        return None
    return Action(action), fault, int(attempt)


def decode_request(value: str | None) -> RepairRequest | None:
    parts = (value or "").split(";")
    if len(parts) != 4 or not _TIME.fullmatch(parts[3]):
        return None
    head = _head(parts)
    return None if head is None else RepairRequest(*head, parts[3])


def decode_result(value: str | None) -> RepairResult | None:
    parts = (value or "").split(";", 5)
    if len(parts) != 6 or parts[3] not in {o.value for o in Outcome}:
        return None
    if not _TIME.fullmatch(parts[4]):
        return None
    head = _head(parts)
    if head is None:
        return None
    return RepairResult(*head, Outcome(parts[3]), parts[4], values.clean(parts[5]))
