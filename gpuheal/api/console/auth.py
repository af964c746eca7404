"""The console's sessions: a token exchanged for a signed cookie, and the CSRF
token each form carries (docs/console.md#authentication-and-roles).

A session cookie is `role|expiry|nonce|user` and an HMAC-SHA256 of it, keyed by
a key derived from the token that opened it (`ApiTokens.keys`). So no replica
keeps session state, every replica that reads the same token file accepts the
same sessions, and removing a token from its file ends its sessions. A view
session is checked against the view tokens' keys only: a view token can never
sign an act session.
"""

from __future__ import annotations

import base64
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

SESSION_PURPOSE = b"gpuheal-console-session-v1"
SESSION_SECONDS = 12 * 3600  # one on-call shift
# Who a person says they are at login: shown in the page and written as the
# approver ("console:<name>"), so only characters a record and an Event carry as is.
USER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,62}")


class Role(StrEnum):
    VIEW = "view"  # sees everything, acts on nothing
    ACT = "act"  # may also approve and reject


@dataclass(frozen=True)
class Session:
    role: Role
    user: str
    expires: int  # Unix seconds
    nonce: str
    key: bytes  # the key that signed it: the CSRF token derives from it too

    @property
    def may_act(self) -> bool:
        return self.role is Role.ACT

    @property
    def by(self) -> str:
        """Who an action is from, as records and Events say it."""
        return f"console:{self.user}"

    def csrf(self) -> str:
        """The synchronizer token of this session's forms."""
        return hmac.digest(self.key, f"csrf|{self.nonce}".encode(), "sha256").hex()

    def csrf_ok(self, presented: str) -> bool:
        return hmac.compare_digest(presented.encode(), self.csrf().encode())


def valid_user(name: str) -> bool:
    return USER_PATTERN.fullmatch(name) is not None


def issue(role: Role, user: str, key: bytes, now: float) -> tuple[str, Session]:
    """A new session and its cookie value."""
    if not valid_user(user):
        raise ValueError(f"user name must match {USER_PATTERN.pattern}")
    session = Session(role, user, int(now) + SESSION_SECONDS, secrets.token_hex(16), key)
    payload = f"{role.value}|{session.expires}|{session.nonce}|{user}"
    return f"{_b64(payload.encode())}.{_b64(_sign(key, payload))}", session


def verify(cookie: str, keys: Mapping[Role, tuple[bytes, ...]], now: float) -> Session | None:
    """The session a cookie carries, or None: malformed, forged, for a token no
    longer accepted, or expired. Every key of its role is tried, each in constant time."""
    encoded, _, signature = cookie.partition(".")
    try:
        payload = _unb64(encoded).decode()
        sig = _unb64(signature)
        role_name, expires, nonce, user = payload.split("|")
        role, expiry = Role(role_name), int(expires)
    except ValueError:  # bad base64 or UTF-8 (both ValueErrors), fields, role or number
        return None
    found = None
    for key in keys.get(role, ()):
        if hmac.compare_digest(sig, _sign(key, payload)):
            found = key
    if found is None or expiry <= now or not valid_user(user):
        return None
    return Session(role, user, expiry, nonce, found)


def _sign(key: bytes, payload: str) -> bytes:
    return hmac.digest(key, payload.encode(), "sha256")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
