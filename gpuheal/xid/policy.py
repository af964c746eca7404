"""What gpuheal does with each of NVIDIA's immediate actions: the one table.

NVIDIA's catalogue (`gpuheal/xid/nvidia.py`) gives each Xid an immediate action.
`ACTIONS` maps the plain ones to a severity and a repair; the conditional ones
(`WORKFLOWS`) are decoded from the Xid's context in `gpuheal/xid/decode.py`; the
codes NVIDIA lists with no action at all are `UNLISTED`, each with the reason for
its row. docs/agent.md prints the result for every data-centre Xid.

Severity is what the controller acts on: P0 now, P1 after it was watched for
`p1EscalationSeconds`, P2 never (not a node fault).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuheal.model import Severity
from gpuheal.xid.nvidia import NVIDIA, NvidiaXid
from gpuheal.xid.row import Action, Kind, XidRow

P0, P1, P2 = Severity.P0, Severity.P1, Severity.P2


@dataclass(frozen=True)
class Treatment:
    severity: Severity
    action: Action
    kind: Kind = Kind.NODE
    why: str = ""  # where gpuheal reads NVIDIA's words its own way


ACTIONS: dict[str, Treatment] = {
    "IGNORE": Treatment(P2, Action.NONE, Kind.INFORMATIONAL),
    "RESTART_APP": Treatment(P2, Action.NONE, Kind.APPLICATION),
    "RESET_GPU": Treatment(P0, Action.RESET_GPU),
    "RESTART_BM": Treatment(P0, Action.REBOOT),
    # A VM node's reboot is the VM's restart.
    "RESTART_VM": Treatment(P0, Action.REBOOT),
    "CONTACT_SUPPORT": Treatment(P0, Action.CONTACT_SUPPORT),
    # The GPU works (at reduced clocks): watched, and a person checks the seating and power.
    "CHECK_MECHANICALS": Treatment(P1, Action.CONTACT_SUPPORT),
    # A person updates the driver or firmware; nothing on the node repairs it.
    "UPDATE_SWFW": Treatment(P1, Action.NONE),
    # "If UVM/vGPU is being utilized, RESET_GPU; otherwise IGNORE": every CUDA workload
    # uses the UVM driver (nvidia-uvm), so on a Kubernetes GPU node it is the UVM case.
    "CHECK_UVM": Treatment(
        P0, Action.RESET_GPU, why="CUDA workloads use UVM (nvidia-uvm): NVIDIA's UVM branch"
    ),
}

# Immediate actions that depend on the Xid's context; decode.py reads them.
WORKFLOWS = frozenset(
    {"WORKFLOW_XID_45", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "XID_154"}
)

# Codes the catalogue lists with no immediate action (the power-smoothing, confidential
# computing and newest Xids): gpuheal's row for each, and the catalogue text it follows.
UNLISTED: dict[int, Treatment] = {
    162: Treatment(P2, Action.NONE, Kind.INFORMATIONAL, "power smoothing re-engaged"),
    163: Treatment(P2, Action.NONE, Kind.INFORMATIONAL, "NVIDIA: no GPU reset required"),
    164: Treatment(
        P2, Action.NONE, Kind.INFORMATIONAL, "NVIDIA: monitor power swings, plan replacement"
    ),
    165: Treatment(
        P2,
        Action.NONE,
        Kind.INFORMATIONAL,
        "NVIDIA: power smoothing disabled; replace only if power swings are not acceptable",
    ),
    166: Treatment(P1, Action.CONTACT_SUPPORT, why="no action listed (confidential computing)"),
    # A fatal timeout of the GPU's PCIe link: as Xid 158 (GPU_FATAL_TIMEOUT), RESET_GPU,
    # and the repair ladder goes on to a reboot if the reset does not bring it back.
    167: Treatment(P0, Action.RESET_GPU, why="as Xid 158, a fatal timeout"),
    168: Treatment(
        P1, Action.CONTACT_SUPPORT, why="NVIDIA: enable ECC or boot again with a shifted WPR"
    ),
    # The same description as Xid 62 ("Internal micro-controller halt"): as 62, RESET_GPU.
    169: Treatment(P0, Action.RESET_GPU, why="as Xid 62, the same micro-controller halt"),
    170: Treatment(P1, Action.CONTACT_SUPPORT, why="no action listed (confidential computing)"),
    # 171 and 172 are details of an Xid 48 (decode.py: with a 48 they follow it).
    171: Treatment(P0, Action.RESET_GPU, why="a detail of Xid 48: WORKFLOW_XID_48"),
    172: Treatment(P0, Action.RESET_GPU, why="a detail of Xid 48: WORKFLOW_XID_48"),
}

# gpuheal's names for the Xids it named before it read the whole catalogue: configs
# (repair.actionByReason) and dashboards key on them. Every other reason is made
# from NVIDIA's mnemonic (`reason`).
REASONS: dict[int, str] = {
    8: "XidGpuStoppedProcessing8",
    13: "XidApplication13",
    31: "XidApplication31",
    32: "XidApplication32",
    38: "XidDriverFirmware38",
    43: "XidApplication43",
    45: "XidApplication45",
    48: "EccDoubleBit48",
    61: "XidMicrocontroller61",
    62: "XidMicrocontroller62",
    63: "RowRemapEvent63",
    64: "RowRemapFailure64",
    68: "XidApplication68",
    69: "XidApplication69",
    74: "NvlinkError74",
    79: "XidCritical79",
    92: "EccSingleBitRate92",
    94: "EccContained94",
    95: "EccUncontained95",
    109: "XidContextSwitchTimeout109",
    119: "GspTimeout119",
    120: "GspError120",
    121: "C2cLinkError121",
    140: "EccUnrecovered140",
    143: "GpuInitFailure143",
}

_PREFIXES = ("ROBUST_CHANNEL_", "NVLINK_", "INFOROM_")


def reason(xid: NvidiaXid) -> str:
    """The fault reason of a catalogued Xid: gpuheal's name, else NVIDIA's mnemonic in
    CamelCase with the code: ROBUST_CHANNEL_GPU_TIMEOUT_ERROR (46) -> GpuTimeoutError46."""
    if xid.code in REASONS:
        return REASONS[xid.code]
    mnemonic = re.split(r"\s*/\s*", xid.mnemonic)[0]
    for prefix in _PREFIXES:
        mnemonic = mnemonic.removeprefix(prefix)
    words = [w for w in re.split(r"[^A-Za-z0-9]+", mnemonic) if w]
    name = "".join(w[:1].upper() + w[1:].lower() for w in words) or "Xid"
    if not name[0].isalpha():
        name = "Xid" + name
    return f"{name}{xid.code}"


def description(xid: NvidiaXid) -> str:
    text = xid.description if xid.description != "Unused" else xid.mnemonic
    return f"{text} (NVIDIA: {xid.immediate or 'no action listed'})"


def treatment(xid: NvidiaXid) -> Treatment | None:
    """The plain treatment of a catalogued Xid; None when a workflow decides (decode.py)."""
    if xid.code in UNLISTED:
        return UNLISTED[xid.code]
    if xid.immediate in WORKFLOWS:
        return None
    found = ACTIONS.get(xid.immediate)
    if found is None:
        # A bucket this table does not know (a newer workbook): unknown is not harmless.
        return Treatment(P1, Action.CONTACT_SUPPORT, why=f"unmapped action {xid.immediate}")
    return found


def row(xid: NvidiaXid, chosen: Treatment, branch: str = "") -> XidRow:
    nvidia = xid.immediate or "no action listed"
    if branch or chosen.why:
        nvidia = f"{nvidia}: {branch or chosen.why}"
    return XidRow(
        reason=reason(xid),
        severity=chosen.severity,
        action=chosen.action,
        description=description(xid),
        nvidia=nvidia,
        kind=chosen.kind,
    )


def plain_rows() -> dict[int, XidRow]:
    """Rows of every Xid NVIDIA gives a plain action (or none): the ones that need no context."""
    rows = {}
    for xid in NVIDIA.xids.values():
        chosen = treatment(xid)
        if chosen is not None:
            rows[xid.code] = row(xid, chosen)
    return rows
