"""The `xid` key, shared by the agent's and the controller's configs: overrides of
NVIDIA's Xid catalogue (gpuheal.xid), row by row. Both programs classify every Xid
through `gpuheal.xid.classify` with these rows first, so one override means the same
on the node (the kernel log, NVML) and in the controller (DCGM, Alertmanager, the
manual API)."""

from __future__ import annotations

from typing import Any

from gpuheal.config.keys import boolean, enum_of, string
from gpuheal.model import Severity
from gpuheal.xid import Action, Kind, XidRow


def xid_rows(value: Any) -> dict[int, XidRow]:
    if not isinstance(value, dict):
        raise ValueError(f"must be a map of Xid number to row, got {type(value).__name__}")
    rows: dict[int, XidRow] = {}
    for key, row in value.items():
        try:
            if isinstance(key, bool) or not isinstance(key, int | str):
                raise TypeError(key)
            xid = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"key {key!r} is not an Xid number") from None
        if not isinstance(row, dict) or not {"reason", "severity"} <= row.keys():
            raise ValueError(f"[{key}] needs reason and severity")
        severity = enum_of(Severity)(row["severity"])
        # P2: not a node fault; `application: true` counts it toward the per-GPU rate.
        application = boolean(row.get("application", False))
        kind = Kind.NODE if severity is not Severity.P2 else Kind.INFORMATIONAL
        if application:
            if severity is not Severity.P2:
                raise ValueError(f"[{key}] application: true needs severity P2")
            kind = Kind.APPLICATION
        rows[xid] = XidRow(
            reason=string(row["reason"]),
            severity=severity,
            action=Action(row.get("action", "none")),
            description=str(row.get("description", "set by config")),
            nvidia="overridden by config",
            kind=kind,
        )
    return rows
