"""Webhook URLs in the config: validated, and shown without their secrets."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any


def url_origin(url: str) -> str:
    """A URL as it may be logged: scheme and host (and port) only.

    Webhook URLs carry their secret anywhere but in the host: a Slack webhook in
    its path (`/services/T.../B.../<secret>`), others in the query or as
    `user:password@`."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:  # a port that is not a number, a bad IPv6 literal
        return "<unparsable URL>"
    if not parts.scheme or not host:
        return "<unparsable URL>"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def without_url_secrets(text: str, url: str) -> str:
    """`text` (an HTTP client's error message, say) with every part of `url` that
    may be secret taken out: any URL on the same host, however the client wrote
    it, becomes the origin; the path, query, fragment and user info, alone (as
    given or percent-encoded either way), become `<redacted>`."""
    origin = url_origin(url)
    parts = urllib.parse.urlsplit(url)
    if parts.hostname:
        on_host = re.compile(
            rf"[a-z][a-z0-9+.-]*://[^\s'\"<>]*?{re.escape(parts.hostname)}[^\s'\"<>)]*",
            re.IGNORECASE,
        )
        text = on_host.sub(origin, text)
    secrets = {parts.path if parts.path != "/" else "", parts.query, parts.fragment}
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at:
        secrets |= {userinfo, *userinfo.split(":", 1)}
    for secret in list(secrets):
        secrets |= {urllib.parse.unquote(secret), urllib.parse.quote(secret, safe="/")}
    for secret in sorted((s for s in secrets if len(s) > 1), key=len, reverse=True):
        text = text.replace(secret, "<redacted>")
    return text


def url(value: Any) -> str:
    """A config key's parser: an http(s) URL with a host."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be an http(s) URL, got {type(value).__name__}")
    # The value is not echoed: a webhook URL is a secret (a typo'd one too).
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"must be an http(s) URL, got {len(value)} characters without http(s)://")
    if url_origin(value) == "<unparsable URL>":
        raise ValueError(f"must be an http(s) URL with a host, got {len(value)} characters")
    return value
