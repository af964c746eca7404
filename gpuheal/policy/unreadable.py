"""gpuheal's node annotations a person (or another tool) may write, and a pod's
checkpoint request, checked with the parsers that read them: a value a reader
cannot read is otherwise taken as absent (a `last-process-time` that is not a
time starts no cooldown, a status other than `faulty` is no fault; a checkpoint
request that is not a time is a deadline passed) and nothing says so. The controller tells each
unreadable value once (controller/reconciler.py::Reconciler._unreadable).

Annotations whose bad values are already said elsewhere are not repeated here:
fault-time and fault-severity (normalized, GPUFaultInputNormalized), and a
maintenance request (refused in its progress record)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuheal.clock import parse_time
from gpuheal.model import (
    CHECKPOINT_REQUESTED,
    COUNTERS_SINCE,
    DIAGNOSTICS,
    ECC_ERRORS,
    FAULT_ID,
    HANDLED_AT,
    LAST_GPU_ERROR,
    LAST_PROCESS_TIME,
    MAINTENANCE_BASELINE,
    MAINTENANCE_SINCE,
    NODE_ENVIRONMENT,
    REPAIR_REQUEST,
    REPAIR_RESULT,
    STATUS,
    STATUS_FAULTY,
    XID_ERRORS,
    PodView,
)
from gpuheal.policy import environment
from gpuheal.policy.gate import parse_baseline, parse_diagnostics
from gpuheal.policy.repairwire import decode_request, decode_result


@dataclass(frozen=True)
class Unreadable:
    annotation: str
    value: str
    why: str  # what a reader expected, and what it does instead


def _time(value: str) -> str:
    return "" if parse_time(value) is not None else "not an RFC 3339 time"


def _count(value: str) -> str:
    return "" if value.strip().isdigit() else "not a whole count"


def _raises(parse: Callable[[str], object]) -> Callable[[str], str]:
    def check(value: str) -> str:
        try:
            parse(value)
        except ValueError as err:
            return str(err)
        return ""

    return check


def _decodes(decode: Callable[[str | None], object | None]) -> Callable[[str], str]:
    return lambda value: "" if decode(value) is not None else "not in its format"


# The annotation, how it is checked, and what its readers do with a bad value.
_CHECKS: tuple[tuple[str, Callable[[str], str], str], ...] = (
    (LAST_PROCESS_TIME, _time, "taken as absent: no cooldown"),
    (HANDLED_AT, _time, "taken as absent"),
    (MAINTENANCE_SINCE, _time, "taken as absent: the gate has no start"),
    (COUNTERS_SINCE, _time, "the health gate fails"),
    (LAST_GPU_ERROR, _time, "the health gate fails"),
    (XID_ERRORS, _count, "the health gate fails"),
    (ECC_ERRORS, _count, "the health gate fails"),
    (DIAGNOSTICS, _raises(parse_diagnostics), "the health gate fails"),
    (MAINTENANCE_BASELINE, _raises(parse_baseline), "the health gate fails"),
    (NODE_ENVIRONMENT, _raises(environment.parse), "the health gate fails"),
    (REPAIR_REQUEST, _decodes(decode_request), "taken as absent: no repair"),
    (REPAIR_RESULT, _decodes(decode_result), "taken as absent: the repair waits"),
)


def unreadable(annotations: Mapping[str, str]) -> tuple[Unreadable, ...]:
    """The node's gpuheal annotations whose values their readers cannot read."""
    found = [
        Unreadable(key, annotations[key], f"{problem}; {effect}")
        for key, check, effect in _CHECKS
        if key in annotations and (problem := check(annotations[key]))
    ]
    status = annotations.get(STATUS)
    if status is not None and status != STATUS_FAULTY:
        found.append(Unreadable(STATUS, status, f"not {STATUS_FAULTY!r}; no fault is reported"))
    elif status == STATUS_FAULTY and not annotations.get(FAULT_ID):
        found.append(
            Unreadable(STATUS, status, f"{STATUS_FAULTY} without {FAULT_ID}; no fault is reported")
        )
    return tuple(found)


def unreadable_pod(pod: PodView) -> Unreadable | None:
    """A pod's checkpoint request that is not a time (a person or a tool wrote it):
    the drain cannot wait for it, so it takes the deadline as passed."""
    value = pod.checkpoint_requested
    if not value or parse_time(value) is not None:
        return None
    why = "not an RFC 3339 time; the checkpoint is taken as timed out: evicted without waiting"
    return Unreadable(CHECKPOINT_REQUESTED, value, why)
