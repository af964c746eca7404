"""A person's request as a fault source. A pushed source: its route, POST
/api/v1/process (gpuheal.api.server), decodes the request and hands its values
here. Pure functions.
"""

from __future__ import annotations

import datetime as dt

from gpuheal import values
from gpuheal.clock import iso
from gpuheal.model import FaultSignal, Severity
from gpuheal.sources.base import Seen, claimed
from gpuheal.sources.fields import (
    IDENTIFIER_RULE,
    NODE_RULE,
    TEXT_RULE,
    is_identifier,
    is_text,
    shown,
)

SOURCE = "manual"
OWN = False

QUARANTINE = "quarantine"
CLEAR = "clear"


def signals(seen: Seen) -> tuple[FaultSignal, ...]:
    return claimed(SOURCE, seen)


def checked(*, node: str, action: str, reason: str, severity: str, fault_id: str) -> Severity:
    """The request's severity, once its values are ones the record can carry: what
    it cannot is refused here (ValueError, the field named), not by the API server
    later."""
    if not values.is_subdomain(node):
        raise ValueError(f"$.node: want {NODE_RULE}, got {shown(node)}")
    if fault_id and not is_identifier(fault_id):
        raise ValueError(f"$.faultID: want {IDENTIFIER_RULE}, got {shown(fault_id)}")
    if not is_text(reason):
        raise ValueError(f"$.reason: want {TEXT_RULE}, got {shown(reason)}")
    if action not in (QUARANTINE, CLEAR):
        raise ValueError(f"$.action: want quarantine or clear, got {action!r}")
    try:
        return Severity(severity)
    except ValueError:
        raise ValueError(f"$.severity: want P0, P1 or P2, got {severity!r}") from None


def signal(
    *, node: str, reason: str, severity: Severity, fault_id: str, now: dt.datetime
) -> FaultSignal:
    """The fault a checked quarantine request asks for; without a fault id, one named
    by the request's time (fault ids are per node: the node's name, up to 253
    characters, is not in it)."""
    return FaultSignal(
        node=node,
        fault_id=fault_id or f"manual-{now:%Y%m%dT%H%M%SZ}",
        reason=reason,
        source=SOURCE,
        severity=severity,
        detected_at=iso(now, "seconds"),
    )
