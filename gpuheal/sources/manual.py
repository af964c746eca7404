"""A person's request as a fault source. A pushed source: its route, POST
/api/v1/process (gpuheal.api.server), decodes the request and hands its values
here. Pure functions.

A request may name an Xid (and the kernel line's text after it, `detail`) instead
of a reason and severity: it is classified by NVIDIA's catalogue like every other
source's Xid (the config's `xid` rows first), and one that is no node fault is an
`Observed`, counted, never a quarantine.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

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
from gpuheal.sources.xids import XID_MAX, XID_RULE, Observed
from gpuheal.xid import XidRow, classify

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


def checked_xid(
    *,
    node: str,
    action: str,
    fault_id: str,
    xid: int,
    detail: str | None,
    given: frozenset[str],
    overrides: Mapping[int, XidRow] | None = None,
) -> XidRow:
    """The row of a request naming an Xid, once its values are ones the record can
    carry (ValueError, the field named). `given`: the other fields the request set;
    the catalogue decides reason and severity, so a request may not set them too."""
    for field in ("reason", "severity"):
        if field in given:
            raise ValueError(f"$.{field}: not with xid (NVIDIA's Xid catalogue decides it)")
    checked(node=node, action=action, reason="Xid", severity="P0", fault_id=fault_id)
    if action != QUARANTINE:
        raise ValueError(f"$.xid: only with action quarantine, got {action!r}")
    if isinstance(xid, bool) or not 0 < xid <= XID_MAX:
        raise ValueError(f"$.xid: want {XID_RULE}, got {xid!r}")
    if detail is not None and not is_text(detail):
        raise ValueError(f"$.detail: want {TEXT_RULE}, got {shown(detail)}")
    return classify(xid, overrides, detail=detail or "")


def observed(*, node: str, xid: int, row: XidRow) -> Observed:
    return Observed(SOURCE, node, xid, row)


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
