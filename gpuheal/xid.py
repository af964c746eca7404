"""The Xid catalogue as data: Xid -> reason, severity, recommended action.

Rows follow NVIDIA's public Xid catalogue. Application Xids (a user program's
fault, the GPU is fine) are P2 and not node faults; hardware, driver-firmware
and interconnect Xids are. Config can override any row or add new ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from gpuheal.model import Severity


class Action(StrEnum):
    NONE = "none"  # the application restarts; the GPU is fine
    RESET_GPU = "reset-gpu"
    REBOOT = "reboot"
    CONTACT_SUPPORT = "contact-support"  # likely RMA


@dataclass(frozen=True)
class XidRow:
    reason: str
    severity: Severity
    action: Action
    description: str

    @property
    def node_fault(self) -> bool:
        return self.severity is not Severity.P2


P0, P1, P2 = Severity.P0, Severity.P1, Severity.P2
A = Action

CATALOGUE: dict[int, XidRow] = {
    8: XidRow(
        "XidGpuStoppedProcessing8", P1, A.RESET_GPU, "GPU stopped processing (driver/firmware)"
    ),
    13: XidRow(
        "XidApplication13", P2, A.NONE, "graphics engine exception, usually the application"
    ),
    31: XidRow("XidApplication31", P2, A.NONE, "GPU memory page fault, usually the application"),
    32: XidRow("XidApplication32", P2, A.NONE, "invalid or corrupted push buffer stream"),
    38: XidRow("XidDriverFirmware38", P1, A.RESET_GPU, "driver firmware error"),
    43: XidRow(
        "XidApplication43", P2, A.NONE, "GPU stopped processing a channel, usually the application"
    ),
    45: XidRow("XidApplication45", P2, A.NONE, "preemptive cleanup after a previous error"),
    48: XidRow("EccDoubleBit48", P0, A.RESET_GPU, "double-bit ECC error (DBE)"),
    61: XidRow(
        "XidMicrocontroller61", P1, A.RESET_GPU, "internal micro-controller breakpoint/warning"
    ),
    62: XidRow("XidMicrocontroller62", P0, A.RESET_GPU, "internal micro-controller halt"),
    63: XidRow(
        "RowRemapPending63",
        P1,
        A.RESET_GPU,
        "ECC page retirement / row remapping recorded; reset to apply",
    ),
    64: XidRow(
        "RowRemapFailure64", P0, A.CONTACT_SUPPORT, "ECC page retirement / row remapping failed"
    ),
    68: XidRow("XidApplication68", P2, A.NONE, "video decoder exception, usually the application"),
    69: XidRow("XidApplication69", P2, A.NONE, "graphics engine class error"),
    74: XidRow("NvlinkError74", P0, A.RESET_GPU, "NVLink error"),
    79: XidRow("XidCritical79", P0, A.REBOOT, "GPU has fallen off the bus"),
    92: XidRow("EccSingleBitRate92", P1, A.RESET_GPU, "high single-bit ECC error rate"),
    94: XidRow(
        "EccContained94",
        P1,
        A.RESET_GPU,
        "contained ECC error; the affected application was stopped",
    ),
    95: XidRow(
        "EccUncontained95",
        P0,
        A.RESET_GPU,
        "uncontained ECC error; all applications on the GPU affected",
    ),
    109: XidRow(
        "XidContextSwitchTimeout109", P2, A.NONE, "context switch timeout, often the application"
    ),
    119: XidRow("GspTimeout119", P0, A.RESET_GPU, "GSP RPC timeout"),
    120: XidRow("GspError120", P0, A.RESET_GPU, "GSP error"),
    121: XidRow("C2cLinkError121", P1, A.RESET_GPU, "C2C link error"),
    140: XidRow("EccUnrecovered140", P0, A.RESET_GPU, "unrecovered ECC error"),
    143: XidRow("GpuInitFailure143", P0, A.REBOOT, "GPU initialisation failure"),
}

# Xid 154 names the recovery action the driver wants, as NVML's enum
# (nvmlDeviceGpuRecoveryAction_t); the row is chosen by that code.
RECOVERY_ACTIONS: dict[int, XidRow] = {
    0: XidRow("RecoveryActionNone154", P2, A.NONE, "GPU recovery action cleared"),
    1: XidRow("GpuResetRequired154", P0, A.RESET_GPU, "GPU reset required"),
    2: XidRow("NodeRebootRequired154", P0, A.REBOOT, "node reboot required"),
    3: XidRow("DrainP2P154", P1, A.RESET_GPU, "drain peer-to-peer traffic"),
    4: XidRow("DrainAndReset154", P1, A.RESET_GPU, "drain, then reset the GPU"),
    5: XidRow("RecoverImexDomain154", P1, A.RESET_GPU, "recover the IMEX domain"),
    6: XidRow("BusResetRequired154", P0, A.RESET_GPU, "bus reset required"),
    7: XidRow("SystemRebootRequired154", P0, A.REBOOT, "system reboot required"),
}

UNKNOWN_XID = XidRow("XidUnknown", P1, A.CONTACT_SUPPORT, "Xid not in the catalogue")


def classify(
    xid: int,
    overrides: Mapping[int, XidRow] | None = None,
    recovery_action: int | None = None,
) -> XidRow:
    """The row for an Xid (overrides first). An unknown Xid is a P1 node fault:
    new Xids appear with new drivers and hardware, and unknown is not harmless."""
    if overrides and xid in overrides:
        return overrides[xid]
    if xid == 154 and recovery_action is not None:
        row = RECOVERY_ACTIONS.get(recovery_action)
        if row is not None:
            return row
    row = CATALOGUE.get(xid)
    if row is None:
        return replace(UNKNOWN_XID, reason=f"XidUnknown{xid}")
    return row
