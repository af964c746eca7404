"""Xids as NVIDIA defines them, one classification for every source.

`classify` is the only way any source (the agent's kernel log and NVML events, the
DCGM poll, Alertmanager, the manual API) turns an Xid into what gpuheal acts on:
config overrides first, then NVIDIA's catalogue (`nvidia.py`, generated from
NVIDIA's workbook) read through gpuheal's table of NVIDIA's actions
(`policy.py`) and NVIDIA's conditional workflows (`decode.py`). An Xid the
loaded catalogue does not know is a P1 node fault, marked `catalogued=False`
so its caller counts it and says which catalogue version is loaded.

NVSwitch SXids have their own table (`sxid.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gpuheal.model import Severity
from gpuheal.xid.decode import Context, recovery_action, workflow
from gpuheal.xid.nvidia import NVIDIA, VERSION
from gpuheal.xid.policy import Treatment, plain_rows, row
from gpuheal.xid.row import Action, Kind, XidRow

__all__ = [
    "CATALOGUE",
    "RECOVERY_ACTIONS",
    "VERSION",
    "Action",
    "Context",
    "Kind",
    "XidRow",
    "classify",
    "needs_line",
    "unknown",
]

_PLAIN = plain_rows()
_UNMAPPED = Treatment(Severity.P1, Action.CONTACT_SUPPORT)

# Every catalogued Xid's row as it reads without context (no kernel line, nothing
# before it): what a bare number from DCGM or an alert gets, and docs/agent.md's table.
CATALOGUE: dict[int, XidRow] = {
    code: workflow(xid, Context()) or _PLAIN.get(code) or row(xid, _UNMAPPED)
    for code, xid in sorted(NVIDIA.xids.items())
}

# Xid 154's row per NVML recovery-action value.
RECOVERY_ACTIONS: dict[int, XidRow] = {
    code: recovery_action(code) for code in sorted(NVIDIA.recovery_actions)
}


def unknown(xid: int) -> XidRow:
    return XidRow(
        f"XidUnknown{xid}",
        Severity.P1,
        Action.CONTACT_SUPPORT,
        f"Xid {xid} is not in NVIDIA's Xid catalogue {VERSION} (newer driver or hardware?)",
        nvidia="not catalogued",
        catalogued=False,
    )


def classify(
    xid: int,
    overrides: Mapping[int, XidRow] | None = None,
    recovery_action: int | None = None,
    *,
    detail: str = "",
    recent: Collection[int] = (),
    driver: str = "",
) -> XidRow:
    """The row for an Xid. `detail` is the kernel line after the code, `recent` the
    other Xids seen on the same GPU just before, `driver` the driver version: the
    workflows that need them read them, and a bare number gets `CATALOGUE`'s row."""
    if overrides and xid in overrides:
        return overrides[xid]
    found = NVIDIA.xids.get(xid)
    if found is None:
        return unknown(xid)
    context = Context(detail, recent, driver, recovery_action)
    return workflow(found, context) or CATALOGUE[xid]


# NVIDIA decodes these from the kernel line's fields (registers, IntrInfo, the code).
_FROM_THE_LINE = frozenset({"WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "XID_154"})


def needs_line(xid: int) -> bool:
    """Does NVIDIA's workflow for this Xid read the kernel line's fields?"""
    found = NVIDIA.xids.get(xid)
    return found is not None and found.immediate in _FROM_THE_LINE
