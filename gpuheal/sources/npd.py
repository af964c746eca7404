"""node-problem-detector's system log monitor config for NVIDIA's kernel lines, made
from gpuheal's Xid catalogue and SXid table (tools/npd_config.py writes it to
deploy/npd/nvidia-monitor.json and the chart's copy; a unit test checks both).

NPD keeps a permanent condition's message from the line that first set it: the
condition changes only when its status or reason does, and goes False only when
NPD restarts. So a rule that matched every Xid line would be set for good by the
first application Xid (13, 31, 43: the common ones), and a later Xid 79 would never
reach its message. The permanent rules therefore match only the lines the agent's
classification makes node faults, and the controller classifies each line again
(`message: kernelLog`, gpuheal/sources/conditions.py), the config's `xid` rows first:

- `NVIDIAXid`: an Xid whose row is a node fault by its number alone (the catalogue's
  node faults but the ones NVIDIA decodes from the line, and every number the
  catalogue does not know, a P1 there), and "fallen off the bus" without an Xid;
- `NVIDIAXidDecoded`: the Xids whose row NVIDIA decodes from the line's fields (74,
  144-150, 154): one such line may be no node fault (Xid 154 to recovery action
  None), and on a condition of their own it cannot hold back the ones above;
- `NVSwitchSXid`: an SXid the Fabric Manager guide's table makes fatal, on any of its
  lines, and one the table does not know whose line says Fatal (or Severity 1).

Two temporary rules make an Event of every Xid and SXid line, node fault or not.

The patterns are RE2 (NPD is Go): character classes, alternation, `?`, `{m,n}`, no
lookaround; NPD appends `\\z` and matches against its buffer of the last lines
joined by newlines, so every pattern keeps to the last line (no `.`, `\\s` or negated
class that could cross a newline) but the multi-line "fallen off the bus".

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuheal.config import MESSAGE_KERNEL_LOG
from gpuheal.xid import CATALOGUE, VERSION, needs_line
from gpuheal.xid.sxid import ALWAYS_FATAL, FATAL, FATAL_IMPACT, TABLE

XID_CONDITION = "NVIDIAXid"
XID_DECODED_CONDITION = "NVIDIAXidDecoded"
SXID_CONDITION = "NVSwitchSXid"
CONDITIONS = (XID_CONDITION, XID_DECODED_CONDITION, SXID_CONDITION)
SOURCE = "gpuheal-nvidia-monitor"

# The codes the parser reads: 1 to 5 digits (the driver prints them with %d).
CODE_MAX = 99999

_HEX = "[0-9a-fA-F]"
# gpuheal.xid.lines' PCI address and MIG tags, without capture groups.
PCI = f"(?:PCI:)?{_HEX}{{4,8}}:{_HEX}{{2}}:{_HEX}{{2}}(?:\\.[0-7])?"
_PCI_ANY = f"(?:PCI:)?(?:{_HEX}{{4,8}}:)?{_HEX}{{2}}:{_HEX}{{2}}(?:\\.[0-7])?"
_MIG = "(?:[ \\t]+GPU-I:[0-9]+)?(?:[ \\t]+GPU-CI:[0-9]+)?"
_REST = "[^\\n]*"
# After an Xid's code: ", …", " (…" or the end of the line.
_XID_END = f"(?:,{_REST}|[ \\t]*\\({_REST}|[ \\t]*)"
# After an SXid's code: ", …" or the end of the line.
_SXID_END = f"(?:,{_REST}|[ \\t]*)"
_SWITCH = "nvidia-nvswitch[0-9]+"
# The lines an SXid's fatal word (or the driver's severity number) opens its text with.
_SAYS_FATAL = "(?:Fatal\\b|Severity 1 Engine instance\\b)"


def _digits(digits: Iterable[str]) -> str:
    """A character class of digits, runs as ranges: [0-9], [1-35], 7."""
    codes = sorted({int(d) for d in digits})
    runs: list[tuple[int, int]] = []
    for code in codes:
        if runs and runs[-1][1] == code - 1:
            runs[-1] = (runs[-1][0], code)
        else:
            runs.append((code, code))
    if len(runs) == 1 and runs[0][0] == runs[0][1]:
        return str(runs[0][0])
    parts = [f"{a}" if a == b else f"{a}{b}" if b == a + 1 else f"{a}-{b}" for a, b in runs]
    return f"[{''.join(parts)}]"


def _trie(numbers: Iterable[int]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for number in numbers:
        node = root
        for digit in str(number):
            node = node.setdefault(digit, {})
        node[""] = {}
    return root


def _pattern(node: dict[str, Any]) -> str:
    """The regex of a trie node's suffixes (the node's own end included as `?`)."""
    by_suffix: dict[str, list[str]] = {}
    for digit, child in node.items():
        if digit:
            by_suffix.setdefault(_pattern(child), []).append(digit)
    alternatives = [_digits(digits) + suffix for suffix, digits in sorted(by_suffix.items())]
    if not alternatives:
        return ""
    body = "|".join(alternatives)
    single = len(alternatives) == 1
    if "" in node:
        one_class = single and (len(body) == 1 or (body[0] == "[" and body.endswith("]")))
        return f"{body}?" if one_class and body.count("[") <= 1 else f"(?:{body})?"
    return body if single else f"(?:{body})"


def number_pattern(numbers: Iterable[int]) -> str:
    """A regex (RE2 and Python's) that matches exactly the decimal numbers of the set,
    written without leading zeros, as one group."""
    chosen = sorted(set(numbers))
    if not chosen or chosen[0] < 1 or chosen[-1] > CODE_MAX:
        raise ValueError(f"numbers must be 1 to {CODE_MAX}")
    return f"(?:{_pattern(_trie(chosen))})"


def fixed_node_fault_xids() -> list[int]:
    """Xids the catalogue makes node faults by their number: the catalogue's node
    faults that NVIDIA does not decode from the line, and every uncatalogued code."""
    known = [code for code, row in CATALOGUE.items() if row.node_fault and not needs_line(code)]
    return sorted({*known, *range(max(CATALOGUE) + 1, CODE_MAX + 1)})


def decoded_xids() -> list[int]:
    """Xids whose row NVIDIA decodes from the kernel line's fields."""
    return sorted(code for code in CATALOGUE if needs_line(code))


def fatal_sxids() -> list[int]:
    """SXids the guide's table makes fatal whatever their line's word says."""
    return sorted(
        code
        for code, (_, section) in TABLE.items()
        if code in FATAL_IMPACT or section in (FATAL, ALWAYS_FATAL)
    )


def unknown_sxids() -> list[int]:
    """SXid codes the table does not list: fatal only when their line says so."""
    return sorted(set(range(1, CODE_MAX + 1)) - set(TABLE))


def xid_line(codes: Iterable[int]) -> str:
    return f"NVRM: Xid \\({PCI}{_MIG}\\): {number_pattern(codes)}{_XID_END}"


def sxid_line(codes: Iterable[int]) -> str:
    return f"{_SWITCH}: SXid \\({PCI}\\): {number_pattern(codes)}{_SXID_END}"


def sxid_said_fatal(codes: Iterable[int]) -> str:
    return f"{_SWITCH}: SXid \\({PCI}\\): {number_pattern(codes)},[ \\t]*{_SAYS_FATAL}{_REST}"


# Text of one line without "Xid" in it (the agent reads a "fallen off the bus" that
# names no GPU only from a line without "Xid"): RE2 has no lookahead, so the automaton
# of "no X-i-d" written out.
NO_XID = "(?:[^X\\n]|X(?:X|iX)*(?:[^Xi\\n]|i[^Xd\\n]))*(?:X(?:X|iX)*i?)?"
# "fallen off the bus", as the agent reads it (any case): naming its GPU, "NVRM: GPU
# 0000:3b:00.0: GPU has fallen off the bus." and the like; or not, on a line without
# "Xid" (the last of the driver's three-line message, "NVRM: fallen off the bus and is
# not responding to commands.").
_FALLEN = "fallen off the bus"
OFF_THE_BUS_GPU = f"(?i:NVRM:{_REST}GPU (?:at )?{_PCI_ANY}\\b{_REST}{_FALLEN}){_REST}"
_OFF_THE_BUS_LINE = f"{NO_XID}(?i:NVRM:){NO_XID}(?i:{_FALLEN}){NO_XID}"
OFF_THE_BUS = f"(?m:^){_OFF_THE_BUS_LINE}"
# The driver's three-line message with each line a record of its own, whose first line
# names the GPU ("NVRM: The NVIDIA GPU 0000:b3:00.0"), up to 8 lines (of NPD's 10-line
# buffer) before its "fallen off the bus": the message is all of them, the address
# the first's.
OFF_THE_BUS_RECORDS = (
    f"NVRM: The NVIDIA GPU {_PCI_ANY}{_REST}(?:\\n{_REST}){{0,8}}\\n{_OFF_THE_BUS_LINE}"
)
ANY_XID = f"NVRM: Xid \\({PCI}{_MIG}\\): [0-9]{{1,5}}{_XID_END}"
ANY_SXID = f"{_SWITCH}: SXid \\({PCI}\\): [0-9]{{1,5}}{_SXID_END}"


def _permanent(condition: str, reason: str, pattern: str) -> dict[str, str]:
    return {"type": "permanent", "condition": condition, "reason": reason, "pattern": pattern}


def monitor_config() -> dict[str, Any]:
    """The system log monitor config: /dev/kmsg (NPD's kmsg watcher), the three
    conditions and their rules. The multi-line rule comes before the one-line one
    for the same message: the first rule to set a condition gives its message."""
    xid_fault = "NVIDIAXidNodeFault"
    return {
        "plugin": "kmsg",
        "logPath": "/dev/kmsg",
        "lookback": "5m",
        "bufferSize": 10,
        "source": SOURCE,
        "metricsReporting": True,
        "conditions": [
            {
                "type": XID_CONDITION,
                "reason": "NoNVIDIAXidNodeFault",
                "message": f"no NVIDIA Xid that is a node fault (gpuheal, catalogue {VERSION})",
            },
            {
                "type": XID_DECODED_CONDITION,
                "reason": "NoNVIDIAXidDecoded",
                "message": "no NVIDIA Xid 74, 144-150 or 154 (decoded from the line by gpuheal)",
            },
            {
                "type": SXID_CONDITION,
                "reason": "NoNVSwitchFatalSXid",
                "message": "no fatal NVSwitch SXid",
            },
        ],
        "rules": [
            {"type": "temporary", "reason": "NVIDIAXidError", "pattern": ANY_XID},
            {"type": "temporary", "reason": "NVSwitchSXidError", "pattern": ANY_SXID},
            _permanent(XID_CONDITION, xid_fault, xid_line(fixed_node_fault_xids())),
            _permanent(XID_CONDITION, xid_fault, OFF_THE_BUS_RECORDS),
            _permanent(XID_CONDITION, xid_fault, OFF_THE_BUS_GPU),
            _permanent(XID_CONDITION, xid_fault, OFF_THE_BUS),
            _permanent(XID_DECODED_CONDITION, "NVIDIAXidToDecode", xid_line(decoded_xids())),
            _permanent(SXID_CONDITION, "NVSwitchFatalSXid", sxid_line(fatal_sxids())),
            _permanent(SXID_CONDITION, "NVSwitchFatalSXid", sxid_said_fatal(unknown_sxids())),
        ],
    }


def condition_rules() -> list[dict[str, str]]:
    """The controller's `conditions:` rules for the monitor's conditions."""
    return [{"type": c, "status": "True", "message": MESSAGE_KERNEL_LOG} for c in CONDITIONS]
