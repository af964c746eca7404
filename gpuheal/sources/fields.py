"""What a value pushed by a source (an API request, an alert) must be for
gpuheal to carry it as is.

The API refuses (400, the field named) what the API server would later refuse
or what cannot be read back, instead of accepting a request that can never
take effect. The limits are the GPUFault record's (gpuheal.values); the rules
are stated the same way in openapi.yaml and docs/api.md. Pure functions.
"""

from __future__ import annotations

import datetime as dt
import re
import unicodedata

from gpuheal import values
from gpuheal.clock import parse_time

# RFC 3339 date-time (section 5.6): a full date, a time, an offset. Go's
# time.Time, so Alertmanager, writes exactly this. ASCII digits only.
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})",
    re.ASCII,
)
# Letters, marks, numbers, punctuation, symbols: what prints as itself. Not
# separators (spaces), controls, format characters (zero-width ones), surrogates,
# private-use or unassigned code points.
_VISIBLE = frozenset("LMNPS")

IDENTIFIER_RULE = (
    f"1 to {values.FIELD_MAX} characters, each a letter, mark, number, punctuation or symbol"
    " (no whitespace, control or format characters)"
)
TEXT_RULE = (
    f"1 to {values.FIELD_MAX} characters without control characters"
    " or leading and trailing whitespace"
)
NODE_RULE = f"a node name (a DNS-1123 subdomain of at most {values.NAME_MAX} characters)"
TIME_RULE = f"an RFC 3339 date-time (with an offset) of at most {values.TIME_MAX} characters"


def shown(value: str, limit: int = 64) -> str:
    """A value as an error message quotes it: escaped, and cut when long."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value)} characters)"


def is_identifier(value: str) -> bool:
    """A fault id as a person gives it: IDENTIFIER_RULE."""
    return 0 < len(value) <= values.FIELD_MAX and all(
        unicodedata.category(ch)[0] in _VISIBLE for ch in value
    )


def is_text(value: str) -> bool:
    """A reason: TEXT_RULE (values.text() would change nothing)."""
    return 0 < len(value) <= values.FIELD_MAX and values.clean(value) == value


def rfc3339(value: str) -> dt.datetime | None:
    """TIME_RULE's time in UTC, or None."""
    if len(value) > values.TIME_MAX or not _RFC3339.fullmatch(value):
        return None
    return parse_time(value.upper())
