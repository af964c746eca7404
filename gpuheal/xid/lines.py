"""The NVIDIA driver's kernel-log lines: what one message says (an Xid, an SXid, a GPU
fallen off the bus, a PCI address -> UUID line), parsed by `parse_message`.

Pure: any line, however broken, yields an event or None, never an exception. Every
reader of kernel lines parses them here, so that a line means the same wherever it
is read: the agent's kernel-log follower (gpuheal/agent/kmsg.py, which also joins
the records that continue one another) and the controller's node-condition source,
for the lines node-problem-detector puts in a condition's message
(gpuheal/sources/conditions.py).

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

A /dev/kmsg record escapes control characters in the message, so a driver print
that spans lines ("fallen off the bus") is one record with `\\x0a` in it;
`parse_message` reads the lines of a message as one text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuheal.model import Severity
from gpuheal.xid.nic import NicEvent, parse_nic

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


# What a GPU fallen off the bus without an Xid number is, wherever its line is read.
OFF_THE_BUS_REASON = "GpuFellOffBus"
OFF_THE_BUS_SEVERITY = Severity.P0


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


KernelEvent = XidEvent | SxidEvent | OffTheBus | GpuAt | NicEvent


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
    if "mlx5_core" in line or "NETDEV WATCHDOG" in line:
        return parse_nic(line)
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
