"""The kernel-log parser over a corpus of real-world NVIDIA driver line shapes
(gathered from the driver source, NVIDIA's Xid catalogue, DCGM and NVSentinel
tests, and public logs; values changed): no exception, no false positive."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuheal.agent.kmsg import (
    Cursor,
    GpuAt,
    KmsgFollower,
    OffTheBus,
    SxidEvent,
    XidEvent,
    normalize_pci,
    parse_message,
    parse_record,
)
from gpuheal.metrics.agent import AgentMetrics
from gpuheal.supervisor import Supervisor

CORPUS = Path(__file__).parent / "data" / "kmsg_corpus.txt"
WELL_FORMED_XID = re.compile(
    r"^NVRM: Xid \((?:PCI:)?[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.\d)?"
    r"(?: GPU-I:\d+)?(?: GPU-CI:\d+)?\): (\d{1,5})(?:,|\s*\(|$)"
)
WELL_FORMED_SXID = re.compile(
    r"^nvidia-nvswitch\d+: SXid \(PCI:[0-9a-f:.]+\): (\d+), (Fatal|Non-fatal)"
)


def sections() -> list[tuple[str, list[str]]]:
    """(shape heading, message lines) for every "# SHAPE:" section of the corpus."""
    found: list[tuple[str, list[str]]] = []
    for line in CORPUS.read_text().splitlines():
        if line.startswith("# SHAPE:"):
            found.append((line.removeprefix("# SHAPE:").strip(), []))
        elif found and line and not line.startswith("#"):
            found[-1][1].append(line)
    return found


def test_the_corpus_is_substantial() -> None:
    lines = [line for _, group in sections() for line in group]
    assert len(lines) >= 150


def test_no_line_raises_and_every_well_formed_xid_is_recognised() -> None:
    for shape, lines in sections():
        for line in lines:
            record = parse_record(line) if shape.startswith("RAW") else None
            message = record.message if record else line
            event = parse_message(message)
            if "MALFORMED" in shape:
                continue
            if match := WELL_FORMED_XID.match(message):
                assert isinstance(event, XidEvent), (shape, line)
                assert event.xid == int(match.group(1))
            if match := WELL_FORMED_SXID.match(message):
                assert isinstance(event, SxidEvent), (shape, line)
                assert event.sxid == int(match.group(1))
                assert event.fatal == (match.group(2) == "Fatal")


@pytest.mark.parametrize("heading", ["NON-MATCHING", "GPU-lost / reset-required companions"])
def test_lines_that_must_not_be_reported(heading: str) -> None:
    (lines,) = [group for shape, group in sections() if shape.startswith(heading)]
    assert lines
    for line in lines:
        event = parse_message(line)
        assert event is None or isinstance(event, GpuAt), line


def test_malformed_and_truncated_lines_never_become_a_fault_they_do_not_state() -> None:
    (lines,) = [group for shape, group in sections() if shape.startswith("MALFORMED")]
    for line in lines:
        event = parse_message(line)
        if isinstance(event, XidEvent):
            # Only a line that really carries an Xid number is one ("...: 46" cut after the code).
            assert WELL_FORMED_XID.match(" ".join(line.split())), line


def test_the_shapes_in_detail() -> None:
    mig = parse_message(
        "NVRM: Xid (PCI:0000:b7:00 GPU-I:01 GPU-CI:00): 94, pid=7, name=python3, Contained: SM"
    )
    assert isinstance(mig, XidEvent) and (mig.xid, mig.pci, mig.pid, mig.process) == (
        94,
        "0000:b7:00",
        "7",
        "python3",
    )
    unknown = parse_message(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    )
    assert isinstance(unknown, XidEvent) and unknown.pid == "<unknown>"
    bare = parse_message("NVRM: Xid (PCI:0000:3b:00.0): 79, GPU has fallen off the bus.")
    assert isinstance(bare, XidEvent) and bare.pci == "0000:3b:00" and bare.pid == ""
    flr = parse_message(
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)"
    )
    assert isinstance(flr, XidEvent) and flr.recovery_action == 1
    escaped = parse_message(
        r"NVRM: The NVIDIA GPU 0000:5d:00.0\x0aNVRM: (PCI ID: 10de:2330) installed in this system has\x0aNVRM: fallen off the bus and is not responding to commands."
    )
    assert isinstance(escaped, OffTheBus) and escaped.pci == "0000:5d:00"
    at = parse_message("NVRM: GPU at PCI:0000:3b:00: GPU-4f0e2c1a-8b7d-11ee-9a3c-0242ac120002")
    assert at == GpuAt("0000:3b:00", "GPU-4f0e2c1a-8b7d-11ee-9a3c-0242ac120002")
    sxid = parse_message(
        "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 30 LTSSM Fault Up"
    )
    assert isinstance(sxid, SxidEvent) and sxid.fatal and sxid.switch == "nvidia-nvswitch3"


def test_pci_addresses_from_the_driver_and_from_nvml_meet() -> None:
    assert normalize_pci("PCI:0000:3B:00.0") == normalize_pci("00000000:3B:00.0") == "0000:3b:00"


def test_kmsg_records_and_their_facility() -> None:
    kernel = parse_record(
        "4,1231,437815002,c;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n SUBSYSTEM=pci"
    )
    assert kernel is not None and (kernel.facility, kernel.priority, kernel.seq) == (0, 4, 1231)
    assert kernel.message.endswith("fallen off the bus.")
    user = parse_record("12,1232,437815003,-;NVRM: Xid (PCI:0000:3b:00): 79, fake")
    assert (
        user is not None and user.facility == 1
    )  # written from user space: ignored by the follower
    for broken in ("", "garbage", "4,x,1,-;m", "4,1;m"):
        assert parse_record(broken) is None


def test_the_cursor_survives_restarts_of_the_same_boot_only(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    Cursor("boot-a", 41).save(path)
    assert Cursor.load(path, "boot-a").seq == 41
    assert Cursor.load(path, "boot-b").seq == -1  # a reboot: everything in the new log is new
    path.write_text("{not json")
    assert Cursor.load(path, "boot-a").seq == -1


def test_the_follower_reads_raw_records_once_and_ignores_user_space_writes(tmp_path: Path) -> None:
    (raw,) = [group for shape, group in sections() if shape.startswith("RAW")]
    source = tmp_path / "kmsg"
    source.write_text("\n".join(raw) + "\n")
    state = tmp_path / "state.json"
    seen: list[object] = []

    def follow() -> None:
        follower = KmsgFollower(source, state, "boot-1", seen.append)
        follower.start()
        deadline = time.monotonic() + 5
        while follower.cursor.seq < 7104 and time.monotonic() < deadline:
            time.sleep(0.05)
        follower.stop()

    follow()
    xids = sorted(e.xid for e in seen if isinstance(e, XidEvent))
    assert xids == [43, 45, 79, 154]  # 119 was written from user space (facility 1)
    assert [e.switch for e in seen if isinstance(e, SxidEvent)] == ["nvidia-nvswitch0"]
    assert sum(isinstance(e, OffTheBus) for e in seen) == 2
    count = len(seen)
    follow()  # a restart on the same boot reads nothing again
    assert len(seen) == count


def test_the_follower_exports_what_it_reads_and_what_it_cannot(tmp_path: Path) -> None:
    """A follower that stalls or reads garbage must show on /metrics: records read,
    parse errors, and the age of the newest record."""
    source = tmp_path / "kmsg"
    source.write_text(
        "6,7100,1000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15\n"
        " SUBSYSTEM=pci\n"  # a continuation line: part of the record above, not an error
        "this is not a kmsg record\n"
        "3,7101,2000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
    )
    metrics = AgentMetrics()
    follower = KmsgFollower(source, tmp_path / "cursor.json", "boot-1", lambda _: None)
    metrics.follow_kmsg(follower)

    def scraped() -> dict[str, float]:
        text = generate_latest(metrics.registry).decode()
        return {
            s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("gpuheal_agent_kmsg_")
        }

    before = scraped()
    assert before["gpuheal_agent_kmsg_records_total"] == 0
    assert before["gpuheal_agent_kmsg_last_record_timestamp_seconds"] == 0
    follower.start()
    deadline = time.monotonic() + 5
    while follower.cursor.seq < 7101 and time.monotonic() < deadline:
        time.sleep(0.05)
    follower.stop()
    after = scraped()
    print(after)
    assert after["gpuheal_agent_kmsg_records_total"] == 2
    assert after["gpuheal_agent_kmsg_parse_errors_total"] == 1
    assert after["gpuheal_agent_kmsg_read_errors_total"] == 0
    assert abs(after["gpuheal_agent_kmsg_last_record_timestamp_seconds"] - time.time()) < 60
    assert 0 <= after["gpuheal_agent_kmsg_last_record_age_seconds"] < 60


def test_a_follower_that_crashes_is_said_counted_restarted_and_loses_no_event(
    tmp_path: Path,
) -> None:
    """An unexpected error in the follower's thread (here from its consumer, on the
    first Xid) must not end the kernel log's intake silently: the supervisor counts
    it and starts the thread again, and the Xid that was being handled is read
    again (its cursor was not saved)."""
    source = tmp_path / "kmsg"
    source.write_text(
        "3,7101,2000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
    )
    seen: list[object] = []

    def consume(event: object) -> None:
        if not seen:
            seen.append("crashed")
            raise ValueError("a bug in the consumer")
        seen.append(event)

    counted: list[str] = []
    supervisor = Supervisor("agent", counted=counted.append, base_s=0.5, max_s=0.5)
    follower = KmsgFollower(source, tmp_path / "cursor.json", "boot-1", consume)
    follower.start(supervisor)
    deadline = time.monotonic() + 5
    while follower.readable is not False and time.monotonic() < deadline:
        time.sleep(0.01)
    # Down: the agent-access fact (doctor, status) says why the kernel log is not read.
    assert follower.error == "follower crashed: a bug in the consumer"
    (down,) = supervisor.down()
    assert down.startswith("task kmsg crashed (ValueError: a bug in the consumer")
    while follower.cursor.seq < 7101 and time.monotonic() < deadline:
        time.sleep(0.05)
    follower.stop()
    assert counted == ["kmsg"]
    assert [type(e).__name__ for e in seen] == ["str", "XidEvent"]
    assert follower.readable is True and follower.cursor.seq == 7101
