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

What the parser takes from each driver line:

- Xid: `NVRM: Xid (PCI:…[ GPU-I:nn][ GPU-CI:nn]): <code>` followed by ", ",
  by "(" or by nothing; `detail` is the text after it (whitespace-normalised,
  at most 512 characters), which `gpuheal.xid.classify` decodes for Xids 74,
  144-150 and 154; pid, process name and Xid 154's recovery action come from it.
- SXid: `nvidia-nvswitchN: SXid (PCI:…): <code>, …`. `fatal` is the line's
  Fatal/Non-fatal word, or the driver's severity number on a "Severity N Engine
  instance …" line (NVSWITCH_ERROR_SEVERITY_NONFATAL = 0, _FATAL = 1), else None;
  `data` is the payload of a "Data {…}" line. The table in `gpuheal.xid.sxid`
  decides what an SXid means; the word is only its fallback.
- `NVRM: GPU at PCI:…: GPU-…`: the PCI address -> UUID map.
- "fallen off the bus" without an Xid number, with or without an address.

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

log = logging.getLogger(__name__)

_PCI = r"(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
# "NVRM: GPU 18:00.0: GPU has fallen off the bus." (GPUd's tests): no domain.
_PCI_ANY = r"(?:PCI:)?(?P<pci>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
# MIG adds " GPU-I:nn" and " GPU-CI:nn" inside the parentheses.
_MIG = r"(?:\s+GPU-I:\d+)?(?:\s+GPU-CI:\d+)?"
# The code ends at ",", at "(" ("154 (" in NVSentinel's tests) or at the end of the line.
_XID = re.compile(rf"NVRM: Xid \({_PCI}{_MIG}\): (?P<xid>\d{{1,5}})(?=,|\s*\(|$)")
_SXID = re.compile(
    rf"(?P<switch>nvidia-nvswitch\d+): SXid \({_PCI}\): (?P<sxid>\d{{1,5}})(?=,|$)"
    r",?\s*(?P<rest>.*)$"
)
_WORD = re.compile(r"(?P<word>Fatal|Non-?fatal)\b,?\s*")
# The driver's second and third lines of an SXid (_nvswitch_dump_error_entry).
_SEVERITY = re.compile(r"Severity (?P<severity>\d+) Engine instance\b")
_DATA = re.compile(r"Data \{(?P<data>[^}]*)\}?")
# After "26006, SOE HALTED" the driver dumps the SOE's trace, one line per entry.
_SOE_TRACE = re.compile(r"SOE HALT data\[\d+\] =")
_OFF_BUS = re.compile(rf"NVRM:.*?GPU (?:at )?{_PCI_ANY}\b.*fallen off the bus", re.IGNORECASE)
_OFF_BUS_NO_PCI = re.compile(r"NVRM:.*fallen off the bus", re.IGNORECASE)
# The first line of the driver's "The NVIDIA GPU …\nNVRM: (PCI ID: …) installed in
# this system has\nNVRM: fallen off the bus and is not responding to commands."
_OFF_BUS_OPENER = re.compile(rf"NVRM: The NVIDIA GPU {_PCI}")
_GPU_AT = re.compile(rf"NVRM: GPU at {_PCI}: (?P<uuid>GPU-[0-9a-fA-F-]{{8,}})")
# Xid 154: the label's wording changed across drivers ("GPU Reset Required" / "PF FLR");
# the hex code is NVML's recovery-action enum and is what counts.
_RECOVERY = re.compile(r"recovery action changed from .*? to 0x(?P<code>[0-9a-fA-F]{1,8})\b")
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_PID = re.compile(r"pid='?(?P<pid><unknown>|\d+)'?")
_NAME = re.compile(r"name=(?P<name>[^,]*)")
_DICTIONARY = re.compile(r" [A-Z0-9_]+=")
DETAIL_MAX = 512


def normalize_pci(address: str) -> str:
    """`PCI:0000:3b:00.0`, `00000000:3B:00.0`, `0000:3b:00`, `3b:00.0` -> `0000:3b:00`
    (domain:bus:device; the function is dropped: one GPU per device)."""
    text = address.removeprefix("PCI:").lower()
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]  # no domain: the first one, as lspci shows it
    if len(parts) != 3:
        return text
    domain, bus, device = parts
    device = device.split(".")[0]
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"
    except ValueError:
        return text


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str
    text: str
    pid: str = ""
    process: str = ""
    recovery_action: int | None = None  # Xid 154: the NVML recovery action it changed to
    detail: str = ""  # the text after the code, for classify (Xids 74, 144-150, 154)


@dataclass(frozen=True)
class SxidEvent:
    sxid: int
    switch: str
    pci: str
    fatal: bool | None  # the line's word (or severity number); None: it has neither
    text: str
    detail: str = ""  # after the code and the word: "Link 30 LTSSM Fault Up"
    data: str = ""  # a Data line's payload: "0x50610002, 0x10100030"
    continuation: bool = False  # a Severity or Data line: the rest of an SXid


@dataclass(frozen=True)
class OffTheBus:
    """'fallen off the bus' without an Xid number."""

    pci: str  # "" when the line names no address
    text: str


@dataclass(frozen=True)
class GpuAt:
    """The driver's PCI address -> UUID line."""

    pci: str
    uuid: str


KernelEvent = XidEvent | SxidEvent | OffTheBus | GpuAt


def message_text(message: str) -> str:
    """A record's message as one line: /dev/kmsg's escapes (`\\x0a` in a print that
    spans lines) and real newlines become spaces, runs of whitespace one space."""
    line = _ESCAPE.sub(lambda m: " " if m.group(1) in ("0a", "0d", "09") else "", message)
    return " ".join(line.split())


def _xid(match: re.Match[str], line: str) -> XidEvent:
    # After "79, " or "154 (": the separator goes, the "(" stays (it opens the text).
    detail = line[match.end() :].lstrip(", ")[:DETAIL_MAX]
    pid = _PID.search(detail)
    name = _NAME.search(detail)
    action = _RECOVERY.search(detail)
    return XidEvent(
        xid=int(match.group("xid")),
        pci=normalize_pci(match.group("pci")),
        text=line[:512],
        pid=pid.group("pid") if pid else "",
        process=name.group("name").strip() if name else "",
        recovery_action=int(action.group("code"), 16) if action else None,
        detail=detail,
    )


def _sxid(match: re.Match[str], line: str) -> SxidEvent:
    rest = match.group("rest")
    fatal: bool | None = None
    word = _WORD.match(rest)
    severity = _SEVERITY.match(rest)
    data = _DATA.match(rest)
    if word:
        fatal = word.group("word").lower() == "fatal"
        rest = rest[word.end() :]
    elif severity and severity.group("severity") in ("0", "1"):
        fatal = severity.group("severity") == "1"
    return SxidEvent(
        sxid=int(match.group("sxid")),
        switch=match.group("switch"),
        pci=normalize_pci(match.group("pci")),
        fatal=fatal,
        text=line[:512],
        detail=rest[:DETAIL_MAX],
        data=data.group("data").strip() if data else "",
        continuation=bool(severity or data or _SOE_TRACE.match(rest)),
    )


def parse_message(message: str) -> KernelEvent | None:  # noqa: PLR0911 -- one return per shape
    """One kernel message -> an event, or None for anything else (never raises)."""
    line = message_text(message)
    if "NVRM" not in line and "SXid" not in line:
        return None
    if match := _XID.search(line):
        return _xid(match, line)
    if match := _SXID.search(line):
        return _sxid(match, line)
    if match := _GPU_AT.search(line):
        return GpuAt(pci=normalize_pci(match.group("pci")), uuid=match.group("uuid"))
    if match := _OFF_BUS.search(line):
        return OffTheBus(pci=normalize_pci(match.group("pci")), text=line[:512])
    if "Xid" not in line and _OFF_BUS_NO_PCI.search(line):
        return OffTheBus(pci="", text=line[:512])
    return None


def off_bus_opener(message: str) -> str | None:
    """The address of "NVRM: The NVIDIA GPU 0000:b3:00.0" when the record stops before
    "fallen off the bus" (the rest came as records of their own), else None."""
    if "The NVIDIA GPU" not in message:
        return None  # most records: not worth normalising twice
    line = message_text(message)
    match = _OFF_BUS_OPENER.search(line)
    if match is None or "fallen off the bus" in line.lower():
        return None
    return normalize_pci(match.group("pci"))


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
        self._thread = threading.Thread(target=self._run, name="kmsg", daemon=True)

    @property
    def sxid_continuations(self) -> int:
        """SXid Severity and Data lines attached to their SXid (no event of their own)."""
        return self.continuations.attached

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
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
