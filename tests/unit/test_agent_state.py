"""The agent's state files: what it writes it reads back; anything else is set
aside, counted, and the agent starts fresh."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gpuheal.agent.findings import ProbeFinding
from gpuheal.agent.kmsg import Cursor
from gpuheal.agent.sticky import StickyEvents
from gpuheal.model import Severity
from tests import corpus

GPU = corpus.GPU_UUIDS[0]
ITEM = {"at": 1764556212.5, "reason": "XidCritical79", "severity": "P0", "message": "Xid 79"}

CURSORS = {
    "truncated": b'{"boot_id": "boot-1", "se',
    "not an object": b"[41]",
    "seq a string": b'{"boot_id": "boot-1", "seq": "41"}',
    "seq past any int": b'{"boot_id": "boot-1", "seq": 1e400}',  # int(inf) crashed
    "seq a bool": b'{"boot_id": "boot-1", "seq": true}',
    "boot id a number": b'{"boot_id": 7, "seq": 41}',
    "binary garbage": bytes(range(255, -1, -1)),
    "empty": b"",
}


def faults_file(**item: object) -> bytes:
    return json.dumps({"boot_id": "boot-1", "items": {"k": item}}).encode()


FAULTS: dict[str, bytes] = {
    "truncated": b'{"boot_id": "boot-1", "items": {"XidCritical79/GPU-5b2f',
    "items a list": b'{"boot_id": "boot-1", "items": [1]}',
    "unknown severity": faults_file(**{**ITEM, "severity": "P9"}),
    "missing reason": faults_file(at=1.0),
    "time a word": faults_file(**{**ITEM, "at": "yesterday"}),
    "time infinite": b'{"boot_id": "boot-1", "items": {"k": {"at": 1e400, "reason": "X",'
    b' "severity": "P0", "message": ""}}}',
    "binary garbage": b"\x00\xff\xfe" * 100,
    "empty": b"",
}


@pytest.mark.parametrize("shape", list(CURSORS))
def test_a_broken_cursor_is_set_aside_and_counted(
    shape: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "agent-state.json"
    path.write_bytes(CURSORS[shape])
    seen: list[int] = []
    with caplog.at_level(logging.WARNING):
        cursor = Cursor.load(path, "boot-1", lambda: seen.append(1))
    assert cursor == Cursor("boot-1", -1)
    assert seen == [1]
    assert not path.exists()
    assert (tmp_path / "agent-state.json.corrupt").read_bytes() == CURSORS[shape]
    (line,) = caplog.records
    assert line.levelname == "WARNING" and vars(line)["path"] == str(path)
    # The next save is a good file again.
    Cursor("boot-1", 7).save(path)
    assert Cursor.load(path, "boot-1", lambda: seen.append(1)).seq == 7
    assert seen == [1]


@pytest.mark.parametrize("shape", list(FAULTS))
def test_a_broken_faults_file_is_set_aside_and_counted(shape: str, tmp_path: Path) -> None:
    path = tmp_path / "agent-state-faults.json"
    path.write_bytes(FAULTS[shape])
    seen: list[int] = []
    sticky = StickyEvents(path, "boot-1", None, counted=lambda: seen.append(1))
    assert sticky.current() == ()
    assert seen == [1]
    assert (tmp_path / "agent-state-faults.json.corrupt").exists()
    sticky.add(ProbeFinding("XidCritical79", Severity.P0, "Xid 79", (GPU,)))
    again = StickyEvents(path, "boot-1", None, counted=lambda: seen.append(1))
    assert [f.reason for f in again.current()] == ["XidCritical79"]
    assert seen == [1]


def test_what_the_agent_wrote_before_is_read_back_and_another_boot_starts_empty(
    tmp_path: Path,
) -> None:
    # The format written before this module existed (json.dumps of plain dicts).
    path = tmp_path / "agent-state-faults.json"
    item = {**ITEM, "devices": [GPU], "immediate": True}
    path.write_text(json.dumps({"boot_id": "boot-1", "items": {f"XidCritical79/{GPU}": item}}))
    seen: list[int] = []
    (finding,) = StickyEvents(path, "boot-1", None, counted=lambda: seen.append(1)).current()
    assert finding == ProbeFinding("XidCritical79", Severity.P0, "Xid 79", (GPU,), immediate=True)
    assert StickyEvents(path, "boot-2", None, counted=lambda: seen.append(1)).current() == ()
    cursor = tmp_path / "agent-state.json"
    cursor.write_text(json.dumps({"boot_id": "boot-1", "seq": 41}))
    assert Cursor.load(cursor, "boot-1", lambda: seen.append(1)).seq == 41
    assert seen == []  # a good file of another boot is not broken
    assert not list(tmp_path.glob("*.corrupt"))


def test_a_state_path_that_cannot_be_read_is_set_aside_too(tmp_path: Path) -> None:
    path = tmp_path / "agent-state.json"
    path.mkdir()  # e.g. a hostPath volume mounted at the file's path
    seen: list[int] = []
    assert Cursor.load(path, "boot-1", lambda: seen.append(1)).seq == -1
    assert seen == [1]
    assert (tmp_path / "agent-state.json.corrupt").is_dir()
