"""The maintenance request and its progress as written on the node
(policy/maintenancewire.py): what the CLI writes the controller reads back
exactly; a request that does not decode is refused naming what is wrong, never
guessed at; a progress record the CLI cannot read is no record."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuheal.policy.maintenancewire import (
    LINES_KEPT,
    BadRequestError,
    MaintenanceRequest,
    Progress,
    State,
    Verb,
    kept_lines,
    parse_progress,
    parse_request,
    request_id_of,
)
from gpuheal.values import text

pytestmark = pytest.mark.unit

START = MaintenanceRequest(
    id="5f1c2a9e0b7d",
    verb=Verb.START,
    by="alice@example.com",
    at="2026-12-06T12:00:00Z",
    reason="driver 550.54.15",
    checkpoint="webhook",
    checkpoint_wait_s=120.0,
    drain=True,
    drain_timeout_s=3600.0,
    delete_emptydir_data=True,
    force=False,
)


@given(
    # As the CLI writes it: cleaned to what a node's annotation carries (values.text).
    reason=st.text(min_size=1, max_size=200).map(text).filter(str.strip),
    wait=st.none() | st.floats(0, 86400),
    timeout=st.none() | st.floats(0, 86400),
    drain=st.booleans(),
    force=st.booleans(),
)
def test_a_start_request_reads_back_as_written(
    reason: str, wait: float | None, timeout: float | None, drain: bool, force: bool
) -> None:
    request = MaintenanceRequest(
        "a1", Verb.START, "bob", "2026-12-06T12:00:00Z", reason=reason,
        checkpoint_wait_s=wait, drain=drain, drain_timeout_s=timeout, force=force,
    )  # fmt: skip
    assert parse_request(request.encode()) == request


def test_a_finish_request_carries_only_validate() -> None:
    request = MaintenanceRequest("b2", Verb.FINISH, "bob", "2026-12-06T12:00:00Z", validate=True)
    assert json.loads(request.encode()) == {
        "id": "b2", "verb": "finish", "by": "bob", "at": "2026-12-06T12:00:00Z", "validate": True,
    }  # fmt: skip
    assert parse_request(request.encode()) == request
    assert parse_request(START.encode()) == START


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("start please", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"verb":"start","reason":"r"}', "id must be"),
        ('{"id":"x","verb":"stop"}', "verb must be start or finish, not 'stop'"),
        ('{"id":"x","verb":"start","reason":"  "}', "reason is required"),
        ('{"id":"x","verb":"start","reason":"r","checkpoint":"email"}', "checkpoint must be"),
        (
            '{"id":"x","verb":"start","reason":"r","drainTimeoutSeconds":-1}',
            "drainTimeoutSeconds must be 0 or more",
        ),
        (
            '{"id":"x","verb":"start","reason":"r","checkpointWaitSeconds":"soon"}',
            "checkpointWaitSeconds must be a number of seconds",
        ),
        ('{"id":"x","verb":"start","reason":"r","force":"yes"}', "force must be true or false"),
        ('{"id":"x","verb":"finish","validate":1}', "validate must be true or false"),
    ],
)
def test_a_request_that_does_not_decode_is_refused_naming_what_is_wrong(raw: str, why: str) -> None:
    with pytest.raises(BadRequestError, match=why):
        parse_request(raw)


def test_the_id_of_a_request_is_read_even_when_the_rest_is_bad() -> None:
    assert request_id_of('{"id":"x9","verb":"stop"}') == "x9"
    assert request_id_of(None) == request_id_of("not json") == request_id_of("[]") == ""


def test_progress_reads_back_and_keeps_only_the_latest_lines() -> None:
    said = [f"waiting on pod ns/job-{i}" for i in range(50)]
    running = Progress("a1", "start", State.RUNNING, "ctl-0", "2026-12-06T12:00:01Z",
                       kept_lines(said), count=50)  # fmt: skip
    back = parse_progress(running.encode())
    assert back is not None and back.state is State.RUNNING
    assert back.lines == tuple(said[-LINES_KEPT:]) and back.count == 50
    assert back.code is None and back.report == {}
    done = Progress("a1", "start", State.DONE, count=51, code=4, report={"result": "timed-out"})
    back = parse_progress(done.encode())
    assert back is not None and (back.code, dict(back.report)) == (4, {"result": "timed-out"})


@pytest.mark.parametrize("raw", [None, "", "{", '{"id":"a"}', '{"id":"a","state":"later"}'])
def test_a_progress_record_that_cannot_be_read_is_none(raw: str | None) -> None:
    assert parse_progress(raw) is None
