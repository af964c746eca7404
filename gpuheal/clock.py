"""Times as the API carries them: RFC 3339 strings in, aware UTC datetimes out."""

from __future__ import annotations

import datetime as dt
from typing import Literal

Precision = Literal["seconds", "milliseconds", "microseconds"]


def iso(moment: dt.datetime, precision: Precision = "milliseconds") -> str:
    """RFC 3339 in UTC, "Z"-suffixed: the one writer of times gpuheal puts in the API
    and shows people. Milliseconds by default (windows of a few seconds must not lose
    one); whole seconds where people read them (annotations, gate reasons, kubelet
    heartbeats); microseconds for the API's MicroTime fields (Lease, Event)."""
    return moment.astimezone(dt.UTC).isoformat(timespec=precision).replace("+00:00", "Z")


def parse_time(value: str | None) -> dt.datetime | None:
    """RFC 3339 in UTC, or None; a bad timestamp is treated as absent, never as now.
    The one parser of times read from the API (records, annotations, the CLI)."""
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        # In UTC, so that comparing and printing it cannot overflow later.
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
    except (ValueError, OverflowError):
        return None


def duration(seconds: float) -> str:
    """A short human duration: 45s, 12m, 3h12m, 2d4h."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if minutes < 60:
        return f"{minutes}m"
    if hours < 24:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    rest = hours % 24
    return f"{days}d{rest}h" if rest else f"{days}d"
