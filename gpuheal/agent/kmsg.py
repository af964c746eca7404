"""The kernel log: /dev/kmsg records and the NVIDIA driver lines in them.

Parsing is pure (`parse_record`, `parse_message`): any line, however broken,
yields an event or None, never an exception. `KmsgFollower` reads a kmsg
device (one record per read) or, for tests and replays, a file or FIFO (one
record per line), and persists (boot id, last sequence number) so a restarted
agent never reports the same line twice.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from gpuheal.agent.statefile import load_state

log = logging.getLogger(__name__)

_PCI = r"(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
# MIG adds " GPU-I:nn" and " GPU-CI:nn" inside the parentheses.
_MIG = r"(?:\s+GPU-I:\d+)?(?:\s+GPU-CI:\d+)?"
_XID = re.compile(rf"NVRM: Xid \({_PCI}{_MIG}\): (?P<xid>\d{{1,5}})(?:,\s*(?P<rest>.*))?$")
_SXID = re.compile(
    rf"(?P<switch>nvidia-nvswitch\d+): SXid \({_PCI}\): (?P<sxid>\d+),\s*"
    r"(?P<kind>Fatal|Non-fatal)\b,?\s*(?P<rest>.*)$"
)
_OFF_BUS = re.compile(rf"NVRM:.*?GPU (?:at )?{_PCI}\b.*fallen off the bus", re.IGNORECASE)
_OFF_BUS_NO_PCI = re.compile(r"NVRM:.*fallen off the bus", re.IGNORECASE)
_GPU_AT = re.compile(rf"NVRM: GPU at {_PCI}: (?P<uuid>GPU-[0-9a-fA-F-]{{8,}})")
# Xid 154: the label's wording changed across drivers ("GPU Reset Required" / "PF FLR");
# the hex code is NVML's recovery-action enum and is what counts.
_RECOVERY = re.compile(r"recovery action changed from .*? to 0x(?P<code>[0-9a-fA-F]{1,8})\b")
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_PID = re.compile(r"pid='?(?P<pid><unknown>|\d+)'?")
_NAME = re.compile(r"name=(?P<name>[^,]*)")


def normalize_pci(address: str) -> str:
    """`PCI:0000:3b:00.0`, `00000000:3B:00.0`, `0000:3b:00` -> `0000:3b:00`
    (domain:bus:device; the function is dropped: one GPU per device)."""
    text = address.removeprefix("PCI:").lower()
    parts = text.split(":")
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


@dataclass(frozen=True)
class SxidEvent:
    sxid: int
    switch: str
    pci: str
    fatal: bool
    text: str


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


def parse_message(message: str) -> KernelEvent | None:  # noqa: PLR0911 -- one return per shape
    """One kernel message -> an event, or None for anything else (never raises)."""
    # /dev/kmsg escapes control characters (\x0a in multi-line prints): one record, one message.
    line = _ESCAPE.sub(lambda m: " " if m.group(1) in ("0a", "0d", "09") else "", message)
    line = " ".join(line.split())
    if "NVRM" not in line and "SXid" not in line:
        return None
    if match := _XID.search(line):
        rest = match.group("rest") or ""
        pid = _PID.search(rest)
        name = _NAME.search(rest)
        action = _RECOVERY.search(rest)
        return XidEvent(
            xid=int(match.group("xid")),
            pci=normalize_pci(match.group("pci")),
            text=line[:512],
            pid=pid.group("pid") if pid else "",
            process=name.group("name").strip() if name else "",
            recovery_action=int(action.group("code"), 16) if action else None,
        )
    if match := _SXID.search(line):
        return SxidEvent(
            sxid=int(match.group("sxid")),
            switch=match.group("switch"),
            pci=normalize_pci(match.group("pci")),
            fatal=match.group("kind") == "Fatal",
            text=line[:512],
        )
    if match := _GPU_AT.search(line):
        return GpuAt(pci=normalize_pci(match.group("pci")), uuid=match.group("uuid"))
    if match := _OFF_BUS.search(line):
        return OffTheBus(pci=normalize_pci(match.group("pci")), text=line[:512])
    if "Xid" not in line and _OFF_BUS_NO_PCI.search(line):
        return OffTheBus(pci="", text=line[:512])
    return None


@dataclass(frozen=True)
class KmsgRecord:
    facility: int  # 0 = the kernel; anything else was written by user space
    priority: int
    seq: int
    usec: int
    message: str


def parse_record(raw: str) -> KmsgRecord | None:
    """`prio,seq,usec,flags[,...];message` (continuation lines ignored) or None."""
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
    # Continuation lines (" KEY=value") follow the first newline.
    return KmsgRecord(priority >> 3, priority & 7, seq, usec, message.split("\n", 1)[0])


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
        # Exported by the agent (AgentMetrics.follow_kmsg): a follower that stalls
        # or cannot read must show.
        self.lines = 0  # records read (new ones: past the saved cursor)
        self.errors = 0  # failed opens and reads of the source
        self.parse_errors = 0  # records that are not `prio,seq,usec,...;message`
        self.started_at = time.time()
        self.last_record_at: float | None = None  # wall-clock time of the newest record read
        self._saved_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kmsg", daemon=True)

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
        event = parse_message(record.message) if record.facility == 0 else None
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
            while not self._stop.is_set():
                line = stream.readline()
                if not line:
                    time.sleep(0.1)
                    continue
                self._handle(line.rstrip("\n"))
