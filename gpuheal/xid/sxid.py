"""NVSwitch SXids as NVIDIA's Fabric Manager guide defines them.

The guide (NVIDIA Fabric Manager User Guide, DU-09883-001_v1.3, October 2023,
appendix D "NVSwitch SXid Errors"; GPUd carries the same table with its sources)
sorts SXids into non-fatal, fatal, always fatal and other notable ones, and says
for each what it does to the GPUs behind the switch. gpuheal acts on the guide's
section, not on the Fatal/Non-fatal word of the kernel line, where the guide says
more: a "Non-fatal" 11004 or 12028 stalls NVLink traffic and "subsequent GPU access
will hang", and 19084 is "usually accompanied by a fatal SXid". An SXid the table
does not know falls back to the line's own word.

SXid lines come in pairs: the first names the error and the word, a second
("…: 20034, Data {0x50610002, 0x10100030}") carries its data. The kernel-log
parser attaches the second to the first; one that arrives alone is classified
by its code, with no word.
"""

from __future__ import annotations

from enum import StrEnum

from gpuheal.model import Severity
from gpuheal.xid.row import Action, Kind, XidRow

SOURCE = "NVIDIA Fabric Manager User Guide DU-09883-001_v1.3 (October 2023), appendix D"


class Section(StrEnum):
    NON_FATAL = "non-fatal"
    FATAL = "fatal"  # "Fatal NVSwitch SXid Errors": propagated to the GPUs as Xid 74
    ALWAYS_FATAL = "always fatal"  # "Restart the host to reset the entire fabric/system"
    NOTABLE = "other notable"
    LINK = "link error"  # not in the guide: the driver's own non-fatal link counters


NON_FATAL, FATAL, ALWAYS_FATAL = Section.NON_FATAL, Section.FATAL, Section.ALWAYS_FATAL
NOTABLE, LINK = Section.NOTABLE, Section.LINK

# SXid -> (the guide's name, its section).
TABLE: dict[int, tuple[str, Section]] = {
    10001: ("Host_priv_error", NOTABLE),
    10002: ("Host_priv_timeout", NOTABLE),
    10003: ("Host_unhandled_interrupt", NOTABLE),
    10004: ("Host_thermal_event_start", NOTABLE),
    10005: ("Host_thermal_event_end", NOTABLE),
    11001: ("ingress invalid command", FATAL),
    11004: ("Ingress invalid ACL", NON_FATAL),
    11009: ("ingress invalid VCSet", FATAL),
    11012: ("Single bit ECC errors", NON_FATAL),
    11013: ("ingress header DBE", FATAL),
    11018: ("ingress RID DBE", FATAL),
    11019: ("ingress RLAN DBE", FATAL),
    11020: ("ingress control parity", FATAL),
    11021: ("Single bit ECC errors", NON_FATAL),
    11022: ("Single bit ECC errors", NON_FATAL),
    11023: ("Single bit ECC errors", NON_FATAL),
    12001: ("egress crossbar overflow", FATAL),
    12002: ("egress packet route", FATAL),
    12020: ("egress sequence ID error", ALWAYS_FATAL),
    12021: ("Single bit ECC errors", NON_FATAL),
    12022: ("egress input ECC DBE error", FATAL),
    12023: ("Single bit ECC errors", NON_FATAL),
    12024: ("egress output ECC DBE error", FATAL),
    12025: ("egress credit overflow", FATAL),
    12026: ("egress destination request ID error", FATAL),
    12027: ("egress destination response ID error", FATAL),
    12028: ("egress nonposted PRIV error", NON_FATAL),
    12030: ("egress control parity error", FATAL),
    12031: ("egress credit parity error", FATAL),
    12032: ("egress flit type mismatch", FATAL),
    14017: ("TS ATO timeout", FATAL),
    15001: ("route buffer over/underflow", FATAL),
    15006: ("route transdone over/underflow", FATAL),
    15008: ("Single bit ECC errors", NON_FATAL),
    15009: ("route GLT DBE", FATAL),
    15010: ("route parity", FATAL),
    15011: ("Single bit ECC errors", NON_FATAL),
    15012: ("route incoming DBE", FATAL),
    15013: ("route credit parity", FATAL),
    19047: ("NCISOC HDR ECC DBE Error", FATAL),
    19048: ("NCISOC DAT ECC DBE Error", FATAL),
    19049: ("Single bit ECC errors", NON_FATAL),
    19054: ("HDR RAM ECC DBE Error", FATAL),
    19055: ("Single bit ECC errors", NON_FATAL),
    19056: ("DAT0 RAM ECC DBE Error", FATAL),
    19057: ("Single bit ECC errors", NON_FATAL),
    19058: ("DAT1 RAM ECC DBE Error", FATAL),
    19059: ("Single bit ECC errors", NON_FATAL),
    19060: ("CREQ RAM HDR ECC DBE Error", FATAL),
    19061: ("CREQ RAM DAT ECC DBE Error", FATAL),
    19062: ("Single bit ECC errors", NON_FATAL),
    19063: ("Response RAM HDR ECC DBE Error", FATAL),
    19064: ("Response RAM DAT ECC DBE Error", FATAL),
    19065: ("Single bit ECC errors", NON_FATAL),
    19066: ("COM RAM HDR ECC DBE Error", FATAL),
    19067: ("COM RAM DAT ECC DBE Error", FATAL),
    19068: ("Single bit ECC errors", NON_FATAL),
    19069: ("RSP1 RAM HDR ECC DBE Error", FATAL),
    19070: ("RSP1 RAM DAT ECC DBE Error", FATAL),
    19071: ("Single bit ECC errors", NON_FATAL),
    19084: ("AN1 Heartbeat Timeout Error", NON_FATAL),
    20001: ("TX Replay Error", NON_FATAL),
    20009: ("RX Short Error Rate", LINK),
    20012: ("Broken/inconsistent connection", NON_FATAL),
    20034: ("LTSSM Fault Up", FATAL),
    22003: ("Minion Halt", ALWAYS_FATAL),
    22011: ("Minion exterror", ALWAYS_FATAL),
    22012: ("Minion Link NA interrupt", FATAL),
    22013: ("Minion Link DLREQ interrupt", NON_FATAL),
    23001: ("ingress SRC-VC buffer overflow", ALWAYS_FATAL),
    23002: ("ingress SRC-VC buffer underflow", ALWAYS_FATAL),
    23003: ("egress DST-VC credit overflow", ALWAYS_FATAL),
    23004: ("egress DST-VC credit underflow", ALWAYS_FATAL),
    23005: ("ingress packet burst error", ALWAYS_FATAL),
    23006: ("ingress packet sticky error", ALWAYS_FATAL),
    23007: ("possible bubbles at ingress", ALWAYS_FATAL),
    23008: ("ingress packet invalid dst error", ALWAYS_FATAL),
    23009: ("ingress packet parity error", ALWAYS_FATAL),
    23010: ("ingress SRC-VC buffer overflow", ALWAYS_FATAL),
    23011: ("ingress SRC-VC buffer underflow", ALWAYS_FATAL),
    23012: ("egress DST-VC credit overflow", ALWAYS_FATAL),
    23013: ("egress DST-VC credit underflow", ALWAYS_FATAL),
    23014: ("ingress packet burst error", ALWAYS_FATAL),
    23015: ("ingress packet sticky error", ALWAYS_FATAL),
    23016: ("possible bubbles at ingress", ALWAYS_FATAL),
    23017: ("ingress credit parity error", ALWAYS_FATAL),
    24001: ("Single bit ECC errors", NON_FATAL),
    24002: ("Single bit ECC errors", NON_FATAL),
    24003: ("Single bit ECC errors", NON_FATAL),
    24004: ("sourcetrack TCEN0 crubmstore DBE", FATAL),
    24005: ("sourcetrack TCEN0 TD crubmstore DBE", FATAL),
    24006: ("sourcetrack TCEN1 crubmstore DBE", FATAL),
    24007: ("sourcetrack timeout error", FATAL),
}

# Listed as non-fatal, but the guide's impact is a hung GPU (11004, 12028) or a fatal
# SXid that follows (19084); "Host_unhandled_interrupt" (10003) "is fatal to the
# fabric/system" if it occurs.
FATAL_IMPACT = frozenset({11004, 12028, 19084, 10003})


def _fatal(sxid: int, name: str, why: str) -> XidRow:
    # Fatal SXids need the switch and its GPUs reset: on a node, a reboot.
    return XidRow(
        f"NvswitchFatal{sxid}",
        Severity.P0,
        Action.REBOOT,
        f"NVSwitch SXid {sxid}: {name} ({why})",
        nvidia=why,
    )


def _counted(sxid: int, name: str, why: str) -> XidRow:
    return XidRow(
        f"NvswitchNonFatal{sxid}",
        Severity.P2,
        Action.NONE,
        f"NVSwitch SXid {sxid}: {name} ({why})",
        nvidia=why,
        kind=Kind.INFORMATIONAL,
    )


def classify_sxid(sxid: int, fatal: bool | None) -> XidRow:
    """The row for an SXid; `fatal` is the line's own word (None: the line has none)."""
    known = TABLE.get(sxid)
    if known is None:
        if fatal:
            return _fatal(sxid, "not in the guide", "the line says Fatal")
        said = "the line says Non-fatal" if fatal is False else "no Fatal/Non-fatal word"
        return _counted(sxid, "not in the guide", said)
    name, section = known
    if sxid in FATAL_IMPACT:
        return _fatal(sxid, name, f"guide: {section}, but GPU access hangs or a fatal SXid follows")
    if section in (FATAL, ALWAYS_FATAL):
        return _fatal(sxid, name, f"guide: {section}")
    return _counted(sxid, name, f"guide: {section}")
