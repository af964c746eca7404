"""Debounce and fault identity: when a node is reported faulty, when it is cleared.

A fault is reported after `fail_rounds` consecutive faulty rounds (or at once
for an immediate P0 Xid, if allowed). Its id is made on the healthy->faulty
transition and kept while the node stays faulty; `healthy_rounds` consecutive
healthy rounds clear it. Unknown rounds (the probes could not run) advance
neither count: not knowing is not evidence either way. Its severity is the
worst the fault has been: a P1 that worsens to P0 is reported P0 under the
same id (the controller escalates it), and never goes back to P1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuheal.agent.findings import Health, Verdict
from gpuheal.model import Severity


@dataclass(frozen=True)
class Report:
    """The fault the node currently reports."""

    fault_id: str
    fault_time: str
    reason: str
    message: str
    devices: tuple[str, ...]
    severity: Severity = Severity.P0


@dataclass(frozen=True)
class Debounce:
    reported: Report | None = None
    failing: int = 0
    healthy: int = 0


def step(
    state: Debounce,
    seen: Verdict,
    *,
    fail_rounds: int,
    healthy_rounds: int,
    immediate_p0: bool,
    new_fault_id: str,
    now: str,
) -> Debounce:
    """The state after one round. `new_fault_id` is used only on a new fault."""
    if seen.health is Health.UNKNOWN:
        return state
    if seen.health is Health.HEALTHY:
        healthy = state.healthy + 1
        if state.reported is not None and healthy >= healthy_rounds:
            return Debounce(reported=None, failing=0, healthy=healthy)
        return replace(state, failing=0, healthy=healthy)
    failing = state.failing + 1
    if state.reported is not None:
        # Same fault, same id: details may change (another device joins), identity does not.
        devices = tuple(dict.fromkeys((*state.reported.devices, *seen.devices)))
        reported = replace(
            state.reported,
            reason=seen.reason,
            message=seen.message,
            devices=devices,
            severity=worst(state.reported.severity, seen.severity or Severity.P0),
        )
        return Debounce(reported=reported, failing=failing, healthy=0)
    if failing >= fail_rounds or (immediate_p0 and seen.immediate):
        report = Report(
            fault_id=new_fault_id,
            fault_time=now,
            reason=seen.reason,
            message=seen.message,
            devices=seen.devices,
            severity=seen.severity or Severity.P0,
        )
        return Debounce(reported=report, failing=failing, healthy=0)
    return Debounce(reported=None, failing=failing, healthy=0)


def worst(a: Severity, b: Severity) -> Severity:
    return a if a.rank <= b.rank else b
