"""Small helpers shared by the tests."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from gpuheal.config import AutoscalersConfig
from gpuheal.model import ActionEntry
from gpuheal.policy.actions import Plan, UpdateRecord

T = TypeVar("T")

# No disruption guard: for the policy tests of other rules, whose plans would
# otherwise carry its actions too (tests/unit/test_policy_disruption.py has them).
NO_GUARD = AutoscalersConfig(do_not_disrupt=())

# fake_gpu_nodes(count, **options) -> node names
FakeNodes = Callable[..., list[str]]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_for(what: str, check: Callable[[], T], timeout_s: float = 60) -> T:
    """Poll `check` until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


def pid_alive(pid: int) -> bool:
    """True while a process with this PID exists (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:  # noqa: PTH123
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def plan_entries(plan: Plan, action: str = "") -> list[ActionEntry]:
    """The record entries a Plan writes (its UpdateRecord actions'), stage by stage
    in order; with `action`, only those of that action."""
    return [
        a.entry
        for a in plan.actions
        if isinstance(a, UpdateRecord) and (not action or a.entry.action == action)
    ]


def gpufault_spec(node: str, fault_id: str) -> dict[str, str]:
    """A GPUFault's spec as the controller writes it for an agent's P0 report of
    Xid 79 (`fault_id`) on `node`."""
    return {
        "node": node,
        "faultID": fault_id,
        "scope": "node",
        "source": "agent",
        "reason": "XidCritical79",
        "severity": "P0",
        "detectedAt": "2026-12-01T02:30:12Z",
    }


__all__ = ["FakeNodes", "gpufault_spec", "pid_alive", "plan_entries", "unique", "wait_for"]


_REFUSAL = re.compile(r"\b403\b|Forbidden")


def refusals(text: str) -> list[str]:
    """The lines of a log or an output that tell of a refusal (HTTP 403, Forbidden):
    a whole number 403, not one inside a port (42403) or a time (.403Z)."""
    return [line for line in text.splitlines() if _REFUSAL.search(line)]
