"""What gpuheal makes of one Xid (or SXid): the row every source acts on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpuheal.model import Severity


class Action(StrEnum):
    """The repair a fault calls for (`repair` in docs/controller.md)."""

    NONE = "none"  # nothing to repair on the node: the application restarts, or a person acts
    RESET_GPU = "reset-gpu"
    REBOOT = "reboot"
    CONTACT_SUPPORT = "contact-support"  # likely RMA


class Kind(StrEnum):
    """Whose problem an Xid is, which decides whether it can quarantine a node."""

    NODE = "node"  # the GPU, its driver or its links: a node fault (P0 or P1)
    # NVIDIA: restart the application. Never a node fault by itself; counted per GPU,
    # and only a configured rate of them on one GPU is (docs/agent.md).
    APPLICATION = "application"
    INFORMATIONAL = "informational"  # NVIDIA: ignore (or a detail of another Xid): counted


@dataclass(frozen=True)
class XidRow:
    reason: str  # the fault reason: CamelCase, ends with the code (XidCritical79)
    severity: Severity
    action: Action
    description: str
    # NVIDIA's immediate action this row follows, as the catalogue names it, with the
    # branch of a workflow taken ("WORKFLOW_XID_48: with 63/64"); "" for config rows.
    nvidia: str = ""
    kind: Kind = Kind.NODE
    catalogued: bool = True  # False: NVIDIA's catalogue (the loaded version) has no such code

    def __post_init__(self) -> None:
        # One meaning for "node fault": a node kind at P0/P1, anything else at P2.
        if (self.kind is Kind.NODE) != (self.severity is not Severity.P2):
            raise ValueError(f"{self.reason}: a {self.kind} Xid cannot be {self.severity}")

    @property
    def node_fault(self) -> bool:
        return self.severity is not Severity.P2

    @property
    def application(self) -> bool:
        return self.kind is Kind.APPLICATION
