"""The kernel log: /dev/kmsg records and the NVIDIA driver lines in them.

Parsing is pure (`parse_record`, `parse_message`): any line, however broken,
yields an event or None, never an exception. `KmsgFollower` reads a kmsg
device (one record per read) or, for tests and replays, a file or FIFO (one
record per line), and persists (boot id, last sequence number) so a restarted
agent never reports the same line twice.

A /dev/kmsg record is `prio,seq,usec,flags[,...];message`, then its dictionary
(" SUBSYSTEM=pci" lines). The kernel escapes control characters in the message,
so a driver print that spans lines ("fallen off the bus") is one record with
`\\x0a` in it; `parse_message` reads the lines of a record as one text.

The driver's lines in a record are parsed by `gpuheal.xid.lines` (`parse_message`;
its docstring says what it takes from each), which the controller's node-condition
source shares for the lines node-problem-detector reports.

Lines that belong to another record's event (`Continuations`, a pure helper the
follower feeds every kernel record): the driver prints an SXid as a first line,
then its Severity and Data lines with the same switch, address and code (and,
after "26006, SOE HALTED", one "SOE HALT data[N] = …" line per trace entry). Such
a line within `Continuations.RECORDS` records and `Continuations.WINDOW_USEC` of
kernel time after a line of the same (switch, PCI, code) is attached to it: no
event of its own, only counted. One whose first line was never read (it left
the ring buffer, or came before an agent restart) is an event of its own, and
the lines after it attach to it. Likewise a "fallen off the bus" message the
kernel gave as separate records ("NVRM: The NVIDIA GPU 0000:b3:00.0", then
"…fallen off the bus…") is one `OffTheBus` with the address of its first record.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec

from gpuheal.agent.statefile import load_state
from gpuheal.supervisor import Supervisor
from gpuheal.xid.lines import (
    GpuAt,
    KernelEvent,
    OffTheBus,
    SxidEvent,
    XidEvent,
    message_text,
    normalize_pci,
    off_bus_opener,
    parse_message,
)

log = logging.getLogger(__name__)

# The driver lines' parser is gpuheal.xid.lines'; its names are the agent's too.
__all__ = [
    "Continuations",
    "Cursor",
    "CursorFile",
    "GpuAt",
    "KernelEvent",
    "KmsgFollower",
    "KmsgRecord",
    "OffTheBus",
    "SxidEvent",
    "XidEvent",
    "message_text",
    "normalize_pci",
    "parse_message",
    "parse_record",
    "read_boot_id",
]

_DICTIONARY = re.compile(r" [A-Z0-9_]+=")


@dataclass(frozen=True)
class KmsgRecord:
    facility: int  # 0 = the kernel; anything else was written by user space
    priority: int
    seq: int
    usec: int
    message: str


def parse_record(raw: str) -> KmsgRecord | None:
    """`prio,seq,usec,flags[,...];message[\\n KEY=value...]` or None. The dictionary
    lines (" SUBSYSTEM=pci") are dropped; any other line is message text (/dev/kmsg
    escapes a newline in the message as `\\x0a`, a file may hold it as is)."""
    head, sep, message = raw.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 3:
        return None
    try:
        priority, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    first, *more = message.split("\n")
    text = [first, *(line for line in more if line and not _DICTIONARY.match(line))]
    return KmsgRecord(priority >> 3, priority & 7, seq, usec, "\n".join(text))


@dataclass(frozen=True)
class _Seen:
    seq: int
    usec: int


class Continuations:
    """Kernel records -> events, with the lines that continue an earlier record's
    event attached to it (the module docstring says which). Pure: no clock, no I/O;
    what it holds is bounded by `RECORDS`."""

    RECORDS = 16  # the driver prints an SXid's lines together; other drivers' lines may interleave
    WINDOW_USEC = 1_000_000  # of the records' own (kernel) time

    def __init__(self) -> None:
        self._sxids: dict[tuple[str, str, int], _Seen] = {}
        self._opener: tuple[str, _Seen] | None = None  # a fallen-off message's first record
        self.attached = 0  # SXid Severity/Data lines attached to their SXid

    def event(self, record: KmsgRecord) -> KernelEvent | None:
        now = _Seen(record.seq, record.usec)
        self._forget(now)
        event = parse_message(record.message)
        if isinstance(event, SxidEvent):
            return self._sxid(event, now)
        if event is None:
            if (pci := off_bus_opener(record.message)) is not None:
                self._opener = (pci, now)
            return None
        if isinstance(event, OffTheBus) and not event.pci and self._opener is not None:
            pci, _ = self._opener
            self._opener = None
            return replace(event, pci=pci)
        return event

    def _sxid(self, event: SxidEvent, now: _Seen) -> SxidEvent | None:
        key = (event.switch, event.pci, event.sxid)
        held = key in self._sxids
        self._sxids[key] = now
        if event.continuation and held:
            self.attached += 1
            return None
        return event

    def _near(self, earlier: _Seen, now: _Seen) -> bool:
        return (
            0 <= now.seq - earlier.seq <= self.RECORDS
            and 0 <= now.usec - earlier.usec <= self.WINDOW_USEC
        )

    def _forget(self, now: _Seen) -> None:
        if self._sxids:
            self._sxids = {k: seen for k, seen in self._sxids.items() if self._near(seen, now)}
        if self._opener is not None and not self._near(self._opener[1], now):
            self._opener = None


class CursorFile(msgspec.Struct):
    """The cursor's file, exactly as `Cursor.save` writes it."""

    boot_id: str
    seq: int = -1


@dataclass
class Cursor:
    """Where we are in this boot's kernel log; persisted across restarts."""

    boot_id: str
    seq: int = -1

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(CursorFile(self.boot_id, self.seq)))
        tmp.replace(path)  # atomic: a crash never leaves half a state file

    @classmethod
    def load(cls, path: Path, boot_id: str, counted: Callable[[], None] = lambda: None) -> Cursor:
        """The saved cursor of this boot; a broken file is set aside and `counted`."""
        saved = load_state(path, CursorFile, counted)
        if saved is not None and saved.boot_id == boot_id:
            return cls(boot_id, saved.seq)
        return cls(boot_id)  # new boot (or no/broken state): everything is new


def read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "unknown-boot"


class KmsgFollower:
    """Follow the kernel log in a thread; call `on_event` for each new driver event."""

    def __init__(
        self,
        source: Path,
        state_path: Path,
        boot_id: str,
        on_event: Callable[[KernelEvent], None],
        state_corrupt: Callable[[], None] = lambda: None,
    ) -> None:
        self.source = source
        self.state_path = state_path
        self.cursor = Cursor.load(state_path, boot_id, state_corrupt)
        self.on_event = on_event
        self.continuations = Continuations()
        # Exported by the agent (AgentMetrics.follow_kmsg): a follower that stalls
        # or cannot read must show.
        self.lines = 0  # records read (new ones: past the saved cursor)
        self.errors = 0  # failed opens and reads of the source
        self.parse_errors = 0  # records that are not `prio,seq,usec,...;message`
        self.started_at = time.time()
        # Whether the source opened (None: not tried yet) and the last error if not.
        self.readable: bool | None = None
        self.error = ""
        self.last_record_at: float | None = None  # wall-clock time of the newest record read
        self._saved_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def sxid_continuations(self) -> int:
        """SXid Severity and Data lines attached to their SXid (no event of their own)."""
        return self.continuations.attached

    def start(self, supervisor: Supervisor | None = None) -> None:
        """Follow in a thread of `supervisor`'s: a crash is said, counted and
        restarted after a backoff (the cursor keeps what was already reported)."""
        supervisor = supervisor or Supervisor("agent")
        self._thread = supervisor.thread("kmsg", self._supervised, self._stop)
        self._thread.start()

    def _supervised(self) -> None:
        try:
            self._run()
        except Exception as err:
            # Not reading while down: the agent-access fact says so (doctor, status).
            self.readable, self.error = False, f"follower crashed: {str(err)[:200]}"
            raise

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.cursor.save(self.state_path)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if stat.S_ISCHR(self.source.stat().st_mode):
                    self._follow_device()
                else:
                    self._follow_lines()
            except OSError as err:
                self.errors += 1
                self.readable, self.error = False, err.strerror or str(err)
                log.warning(
                    "kmsg read failed", extra={"source": str(self.source), "error": str(err)}
                )
                self._stop.wait(2.0)

    def _handle(self, raw: str) -> None:
        if not raw or raw[0].isspace():
            return  # a continuation line (" KEY=value") of a record written line by line
        record = parse_record(raw)
        if record is None:
            self.parse_errors += 1
            return
        if record.seq <= self.cursor.seq:
            return
        self.lines += 1
        self.last_record_at = time.time()
        # Only the kernel speaks with facility 0: a process writing a fake
        # "NVRM: Xid 79" into /dev/kmsg must not be able to quarantine a node.
        event = self.continuations.event(record) if record.facility == 0 else None
        if event is not None:
            self.on_event(event)
        self.cursor.seq = record.seq
        # Persist at once after an event (never report it twice), else at most once a second.
        now = time.monotonic()
        if event is not None or now - self._saved_at >= 1.0:
            self.cursor.save(self.state_path)
            self._saved_at = now

    def _follow_device(self) -> None:
        fd = os.open(self.source, os.O_RDONLY | os.O_NONBLOCK)
        self.readable, self.error = True, ""
        try:
            while not self._stop.is_set():
                try:
                    data = os.read(fd, 16384)
                except BlockingIOError:
                    self._stop.wait(0.2)
                    continue
                except BrokenPipeError:
                    continue  # records were overwritten before we read them: go on
                self._handle(data.decode(errors="replace"))
        finally:
            os.close(fd)

    def _follow_lines(self) -> None:
        with self.source.open(errors="replace") as stream:
            self.readable, self.error = True, ""
            while not self._stop.is_set():
                line = stream.readline()
                if not line:
                    time.sleep(0.1)
                    continue
                self._handle(line.rstrip("\n"))
