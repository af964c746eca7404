"""NVIDIA's conditional workflows: Xids whose action depends on what came with them.

- Xid 154: the recovery action it names, by NVML's `nvmlDeviceGpuRecoveryAction_t`.
- Xids 144-150 (NVLink5): the kernel line's IntrInfo and Error Status fields, by the
  catalogue's "Xid 144-150 Decode" sheet (the IntrInfo layout changed at R575).
- Xid 74 (WORKFLOW_NVLINK_ERR): the seven registers of the line, by the bits
  NVIDIA's workflow names.
- Xid 48 (WORKFLOW_XID_48): alone, or with a row-remapping Xid 63/64.
- Xid 45 (WORKFLOW_XID_45): alone, or following another Xid.
- Xids 171/172: details of an Xid 48.

`Context` carries what the decision may look at; everything here is pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from gpuheal.model import Severity
from gpuheal.xid.nvidia import NVIDIA, NvidiaXid, Nvlink5Rule
from gpuheal.xid.policy import ACTIONS, UNLISTED, Treatment, row
from gpuheal.xid.row import Action, Kind, XidRow

P0, P1, P2 = Severity.P0, Severity.P1, Severity.P2


@dataclass(frozen=True)
class Context:
    # The kernel line after "NVRM: Xid (PCI:…): <code>, "; "" from NVML events, DCGM, alerts.
    detail: str = ""
    # Other Xids on the same GPU shortly before this one (the agent's context window).
    recent: Collection[int] = ()
    driver: str = ""  # the driver version, "575.57.08"; "" when not known
    recovery_action: int | None = None  # Xid 154's code, when the caller parsed it


# -- Xid 154 -------------------------------------------------------------------

_RECOVERY = re.compile(r"recovery action changed from .*? to 0x(?P<code>[0-9a-fA-F]{1,8})\b")

# NVML's names -> gpuheal. DRAIN_P2P and RECOVER_IMEX_DOMAIN ask for work to move
# (peer-to-peer traffic, the IMEX domain) with no repair of this node: watched.
RECOVERY: dict[str, tuple[str, Treatment]] = {
    "NONE": ("RecoveryActionNone154", Treatment(P2, Action.NONE, Kind.INFORMATIONAL)),
    "GPU_RESET": ("GpuResetRequired154", Treatment(P0, Action.RESET_GPU)),
    "NODE_REBOOT": ("NodeRebootRequired154", Treatment(P0, Action.REBOOT)),
    "DRAIN_P2P": ("DrainP2P154", Treatment(P1, Action.NONE)),
    "DRAIN_AND_RESET": ("DrainAndReset154", Treatment(P0, Action.RESET_GPU)),
    "RECOVER_IMEX_DOMAIN": ("RecoverImexDomain154", Treatment(P1, Action.NONE)),
    "BUS_RESET": ("BusResetRequired154", Treatment(P0, Action.RESET_GPU)),
    "SYSTEM_REBOOT": ("SystemRebootRequired154", Treatment(P0, Action.REBOOT)),
}


def recovery_code(detail: str) -> int | None:
    """The code an Xid 154 line changed the recovery action to ("… to 0x2 (Node Reboot
    Required)"). The wording of the label changed across drivers; the code did not."""
    match = _RECOVERY.search(detail)
    return int(match.group("code"), 16) if match else None


def recovery_action(code: int | None) -> XidRow:
    name = NVIDIA.recovery_actions.get(code) if code is not None else None
    if name is not None and name in RECOVERY:
        reason, chosen = RECOVERY[name]
        return XidRow(
            reason,
            chosen.severity,
            chosen.action,
            f"GPU recovery action {name} ({code})",
            nvidia=f"XID_154: {name}",
            kind=chosen.kind,
        )
    shown = "none named" if code is None else f"0x{code:x}, not in NVML's enum"
    return XidRow(
        "RecoveryActionUnknown154",
        P1,
        Action.CONTACT_SUPPORT,
        f"GPU recovery action changed ({shown}; {NVIDIA.recovery_source})",
        nvidia="XID_154: not decoded",
    )


# -- Xids 144-150: NVLink5 -----------------------------------------------------

_NVLINK5 = re.compile(
    r"(?P<subcode>[A-Z][A-Z0-9_]*)\s+(?P<word>Fatal|Nonfatal|Non-fatal)\s+XC\d+\s+i\d+\s+"
    r"Link\s+-?\d+\s*\((?P<fields>[^)]*)\)"
)
_HEX = re.compile(r"0x[0-9a-fA-F]{1,8}")


@dataclass(frozen=True)
class Nvlink5Line:
    subcode: str
    fatal: bool
    intr_info: int
    error_status: str  # 0x%08x


def nvlink5_line(detail: str) -> Nvlink5Line | None:
    match = _NVLINK5.search(detail)
    if match is None:
        return None
    fields = _HEX.findall(match.group("fields"))
    if len(fields) < 2:
        return None
    return Nvlink5Line(
        match.group("subcode"),
        match.group("word") == "Fatal",
        int(fields[0], 16),
        f"0x{int(fields[1], 16):08x}",
    )


def r575(driver: str) -> bool | None:
    """Is the driver R575 or newer (NVIDIA's V2 IntrInfo layout)? None: not known."""
    major = driver.split(".", 1)[0]
    return int(major) >= 575 if major.isdigit() else None


def matches(mask: str, value: int) -> bool:
    """A 32-character mask, most significant bit first, "-" for any bit."""
    if len(mask) != 32:
        return False
    return all(c == "-" or int(c) == (value >> (31 - i)) & 1 for i, c in enumerate(mask))


def _rule_action(rule: Nvlink5Rule, intr_info: int, v2: bool) -> str:
    promote = rule.action2_intr_info_v2 if v2 else rule.action2_intr_info_v1
    if rule.action2 and promote and matches(promote, intr_info):
        return rule.action2
    return rule.action


def nvlink5_rule(xid: int, line: Nvlink5Line, driver: str) -> tuple[Nvlink5Rule, str] | None:
    """The decode sheet's row for this line and its action (action 2 where promoted)."""
    newer = r575(driver)
    layouts = (True,) if newer else (False,) if newer is False else (True, False)
    for v2 in layouts:
        for rule in NVIDIA.nvlink5:
            if rule.xid != xid:
                continue
            mask = rule.intr_info_v2 if v2 else rule.intr_info_v1
            if not matches(mask, line.intr_info):
                continue
            if rule.error_status and line.error_status not in rule.error_status:
                continue
            return rule, _rule_action(rule, line.intr_info, v2)
    return None


# XID_154_EVAL: "If an XID 154 is seen along with this error, take that action. If no
# XID 154 present, RESTART_APP" (the Xid 154 is classified on its own).
_NVLINK5_ACTIONS = {**ACTIONS, "XID_154_EVAL": ACTIONS["RESTART_APP"]}


def nvlink5(xid: NvidiaXid, context: Context) -> XidRow:
    line = nvlink5_line(context.detail)
    if line is None:
        # NVIDIA: "These errors need decoding". Without the line's fields (NVML's
        # event, a metric) nobody can: watched, for a person or the kernel log.
        return row(
            xid,
            Treatment(P1, Action.CONTACT_SUPPORT),
            "not decoded (no IntrInfo/Error Status: the kernel line has them)",
        )
    found = nvlink5_rule(xid.code, line, context.driver)
    if found is None:
        # No row of the sheet: the line's own word is all there is.
        chosen = ACTIONS["RESET_GPU"] if line.fatal else Treatment(P1, Action.CONTACT_SUPPORT)
        word = "Fatal" if line.fatal else "Nonfatal"
        return row(
            xid, chosen, f"{line.subcode} {line.error_status}: no decode row, line says {word}"
        )
    rule, action = found
    chosen = _NVLINK5_ACTIONS.get(action, Treatment(P1, Action.CONTACT_SUPPORT))
    then = f"{rule.severity}; then {rule.investigatory}"
    return row(xid, chosen, f"{rule.subcode} {line.error_status}: {action} ({then})")


# -- Xid 74: WORKFLOW_NVLINK_ERR -----------------------------------------------

_REGISTERS = re.compile(r"link\s+\d+\s*\((?P<fields>[^)]*)\)", re.IGNORECASE)

# The bits NVIDIA's workflow says need no action: "can be safely ignored" (first
# register) and "a threshold of ECC errors being exceeded … Continue operation" (fifth).
IGNORABLE = {0: frozenset({0, 23, 30}), 4: frozenset({20, 23, 26, 29})}
# "Generally sympathetic or secondary errors … follow the resolution for those" (first
# and fourth registers; the fourth's bit 18 also needs a fabric reset, so is not here).
SYMPATHETIC = {0: frozenset({1, 20}), 3: frozenset({16, 17})}


def registers(detail: str) -> tuple[int, ...] | None:
    match = _REGISTERS.search(detail)
    if match is None:
        return None
    fields = _HEX.findall(match.group("fields"))
    return tuple(int(f, 16) for f in fields) if fields else None


def _bits(value: int) -> set[int]:
    return {bit for bit in range(32) if value >> bit & 1}


def nvlink74(xid: NvidiaXid, context: Context) -> XidRow:
    found = registers(context.detail)
    reset = ACTIONS["RESET_GPU"]
    if found is None:
        # The catalogue: "A GPU reset or node reboot is needed to clear this error."
        return row(xid, reset, "no registers on the line: reset, as the catalogue says")
    set_bits = {i: _bits(v) for i, v in enumerate(found)}
    rest = {i: bits - IGNORABLE.get(i, frozenset()) for i, bits in set_bits.items()}
    if not any(rest.values()):
        informational = Treatment(P2, Action.NONE, Kind.INFORMATIONAL)
        return row(xid, informational, "only bits NVIDIA says to ignore or continue on")
    beyond = {i: bits - SYMPATHETIC.get(i, frozenset()) for i, bits in rest.items()}
    if not any(beyond.values()):
        sympathetic = Treatment(P2, Action.NONE, Kind.INFORMATIONAL)
        return row(xid, sympathetic, "sympathetic bits only: follow the other Xid/SXid")
    named = ", ".join(f"reg{i + 1}:{sorted(b)}" for i, b in beyond.items() if b)
    return row(xid, reset, f"link error bits {named}")


# -- Xids 45, 48, 171, 172: by their company -------------------------------------

ROW_REMAP_XIDS = frozenset({63, 64})


def xid48(xid: NvidiaXid, context: Context) -> XidRow:
    reset = ACTIONS["RESET_GPU"]
    if ROW_REMAP_XIDS & set(context.recent):
        return row(xid, reset, "with 63/64: DRAIN_AND_RESET")
    return row(xid, reset, "solo: RESET_GPU")


def xid45(xid: NvidiaXid, context: Context) -> XidRow:
    others = sorted(set(context.recent) - {45})
    if others:
        follows = ", ".join(map(str, others))
        return row(
            xid,
            Treatment(P2, Action.NONE, Kind.INFORMATIONAL),
            f"not solo (after Xid {follows}): IGNORE, follow the other Xid",
        )
    # Solo, NVIDIA says restart Fabric Manager; the catalogue's own trigger text says a
    # solo 45 is also every application killed by Ctrl-C or SIGKILL. gpuheal counts it
    # like an application Xid: only a rate of them on one GPU is a node fault.
    return row(
        xid,
        Treatment(P2, Action.NONE, Kind.APPLICATION),
        "solo: RESTART_FM; counted as an application Xid (the rate rule)",
    )


def detail_of_48(xid: NvidiaXid, context: Context) -> XidRow:
    if 48 in context.recent:
        return row(xid, Treatment(P2, Action.NONE, Kind.INFORMATIONAL), "with Xid 48: follows it")
    return row(xid, UNLISTED[xid.code], "no Xid 48 seen: as Xid 48, RESET_GPU")


def xid154(xid: NvidiaXid, context: Context) -> XidRow:
    code = context.recovery_action
    return recovery_action(code if code is not None else recovery_code(context.detail))


Decoder = Callable[[NvidiaXid, Context], XidRow]

# By NVIDIA's immediate action, and by code for the two details of Xid 48.
DECODERS: dict[str, Decoder] = {
    "WORKFLOW_NVLINK5_ERR": nvlink5,
    "WORKFLOW_NVLINK_ERR": nvlink74,
    "WORKFLOW_XID_48": xid48,
    "WORKFLOW_XID_45": xid45,
    "XID_154": xid154,
}
DECODERS_BY_CODE: dict[int, Decoder] = {171: detail_of_48, 172: detail_of_48}


def workflow(xid: NvidiaXid, context: Context) -> XidRow | None:
    """The row of a context-dependent Xid, or None when the Xid has no workflow."""
    decode = DECODERS_BY_CODE.get(xid.code) or DECODERS.get(xid.immediate)
    return decode(xid, context) if decode is not None else None
