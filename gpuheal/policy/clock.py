"""Times as the API carries them: RFC 3339 strings in, aware UTC datetimes out."""

from __future__ import annotations

import datetime as dt


def iso(moment: dt.datetime) -> str:
    """RFC 3339 in UTC with milliseconds: windows of a few seconds must not lose one."""
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
