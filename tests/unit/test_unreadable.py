"""gpuheal annotations a person may write, checked by the parsers that read them
(gpuheal/policy/unreadable.py): each malformed value is found, each good one not."""

from __future__ import annotations

from dataclasses import replace

import pytest

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
    XID_ERRORS,
    PodView,
)
from gpuheal.policy.unreadable import unreadable, unreadable_pod

pytestmark = pytest.mark.unit

# As the controller, the agent or a diagnostics job writes them.
GOOD = {
    LAST_PROCESS_TIME: "2026-12-06T10:00:00Z",
    HANDLED_AT: "2026-12-06T10:00:00Z",
    MAINTENANCE_SINCE: "2026-12-06T09:00:00Z",
    COUNTERS_SINCE: "2026-12-06T08:00:00Z",
    LAST_GPU_ERROR: "2026-12-06T08:30:00.123456Z",
    XID_ERRORS: "3",
    ECC_ERRORS: "0",
    DIAGNOSTICS: '{"result": "pass", "time": "2026-12-06T09:30:00Z", "tool": "dcgmi diag -r 3"}',
    MAINTENANCE_BASELINE: '{"xid": 3, "ecc": 0, "since": "2026-12-06T09:00:00Z"}',
    NODE_ENVIRONMENT: "modules=ok;persistenced=ok;fabricmanager=n/a;runtimehook=ok",
    STATUS: "faulty",
    FAULT_ID: "manual-1765015200",
}
# What a person gets wrong: no such date, a local format, a count as a word, text for JSON.
BAD = {
    LAST_PROCESS_TIME: "2026-13-45T10:00:00Z",
    HANDLED_AT: "yesterday",
    MAINTENANCE_SINCE: "1765015200",
    COUNTERS_SINCE: "06/12/2026",
    LAST_GPU_ERROR: "10:00 UTC",
    XID_ERRORS: "-1",
    ECC_ERRORS: "two",
    DIAGNOSTICS: "pass",
    MAINTENANCE_BASELINE: '{"xid": "3"}',
    NODE_ENVIRONMENT: "modules",
    REPAIR_REQUEST: "reset-gpu",
    REPAIR_RESULT: "done",
}


def test_values_as_written_by_their_writers_are_readable() -> None:
    assert unreadable(GOOD) == ()


@pytest.mark.parametrize("annotation", sorted(BAD))
def test_each_malformed_annotation_is_found_with_why(annotation: str) -> None:
    (found,) = unreadable({annotation: BAD[annotation]})
    assert found.annotation == annotation and found.value == BAD[annotation]
    assert found.why


@pytest.mark.parametrize(
    ("written", "why"),
    [
        ({STATUS: "Faulty", FAULT_ID: "manual-1"}, "not 'faulty'; no fault is reported"),
        ({STATUS: "true"}, "not 'faulty'; no fault is reported"),
        ({STATUS: "faulty"}, f"faulty without {FAULT_ID}; no fault is reported"),
    ],
)
def test_a_status_that_reports_no_fault_is_found(written: dict[str, str], why: str) -> None:
    (found,) = unreadable(written)
    assert (found.annotation, found.why) == (STATUS, why)


def test_a_pods_checkpoint_request_that_is_not_a_time_is_found() -> None:
    pod = PodView("ml", "train-0", "uid-1", "node-1", "Running", gpu=True, gpu_count=8)
    assert unreadable_pod(pod) is None
    assert unreadable_pod(replace(pod, checkpoint_requested="2026-12-07T04:00:00Z")) is None
    found = unreadable_pod(replace(pod, checkpoint_requested="in ten minutes"))
    assert found is not None and found.annotation == CHECKPOINT_REQUESTED
    assert "evicted without waiting" in found.why
