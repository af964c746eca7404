"""The API's bearer tokens: read from a file, re-read when it changes.

The file is a mounted Secret. The kubelet updates one in place: it writes the
new content to a new directory and swaps the `..data` symlink to it, so the
file's path stays and what it resolves to (inode, mtime) changes. `refresh`
compares that stamp and reads again when it moved: rotation needs no restart.

The file holds one token per line (usually one); any of them is accepted, so a
rotation can overlap: old and new for as long as the senders need to switch.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# How often the controller looks at the token file. The kubelet's own delay to
# propagate a Secret update (its sync period, about a minute) dominates.
POLL_S = 2.0

Stamp = tuple[int, int, float, int]  # device, inode, mtime, size


@dataclass(frozen=True)
class _Accepted:
    token: bytes
    # Names the token in rate limits: a digest, never logged (a weak token's
    # digest could be brute-forced).
    ident: str


class ApiTokens:
    """The tokens currently accepted. None accepted refuses every request that needs one."""

    def __init__(self, path: Path | None, key: str = "apiTokenFile", noun: str = "API") -> None:
        self.path = path
        # For the log: the config key naming the file, and what its tokens are.
        self.key, self.noun = key, noun
        self._accepted: tuple[_Accepted, ...] = ()
        self._stamp: Stamp | None = None  # of the content read last
        self._failing = False
        self._told = False  # what is accepted was logged

    @property
    def count(self) -> int:
        return len(self._accepted)

    def use(self, path: Path | None) -> None:
        """Read from another file from now on (a config reload named one)."""
        if path == self.path:
            return
        self.path, self._stamp, self._failing, self._told = path, None, False, False
        self.refresh()

    def refresh(self) -> bool:
        """Read the file if it changed since the last read; True if the tokens did."""
        if self.path is None:
            return self._set((), f"{self.key} unset")
        try:
            info = self.path.stat()  # follows the symlinks: the content's own inode
            stamp = (info.st_dev, info.st_ino, info.st_mtime, info.st_size)
            if stamp == self._stamp:
                self._failing = False
                return False
            content = self.path.read_bytes()
        except OSError as err:
            if not self._failing:
                # Once per streak. The tokens read last stay: the kubelet never
                # leaves a mounted Secret half written, so this is a mount or
                # permission problem, not a rotation.
                log.error(
                    f"{self.key} unreadable; keeping the tokens read last",
                    extra={"path": str(self.path), "error": err.strerror, "tokens": self.count},
                )
                self._failing = True
            return False
        self._failing = False
        self._stamp = stamp
        lines = (line.strip() for line in content.splitlines())
        return self._set(tuple(dict.fromkeys(t for t in lines if t)), f"{self.key} empty")

    def _set(self, tokens: tuple[bytes, ...], why_none: str) -> bool:
        if tokens == tuple(a.token for a in self._accepted) and self._told:
            return False
        self._told = True
        self._accepted = tuple(_Accepted(t, _ident(t)) for t in tokens)
        if tokens:
            log.info(
                f"{self.noun} tokens read", extra={"path": str(self.path), "tokens": len(tokens)}
            )
        else:
            log.warning(
                f"no {self.noun} token: every request that needs one is refused",
                extra={"path": str(self.path) if self.path else None, "why": why_none},
            )
        return True

    def identify(self, presented: bytes) -> str | None:
        """The identity of the accepted token that `presented` is, or None.

        Every accepted token is compared, each in constant time: how long this
        takes says nothing of which one (or how much of one) matched."""
        found = None
        for accepted in self._accepted:
            if hmac.compare_digest(presented, accepted.token):
                found = accepted.ident
        return found

    def idents(self) -> tuple[str, ...]:
        """The accepted tokens' identities, in the order of `keys`."""
        return tuple(a.ident for a in self._accepted)

    def keys(self, purpose: bytes) -> tuple[bytes, ...]:
        """A key per accepted token for `purpose` (the console signs its sessions
        with them): every replica reading the same file derives the same keys, and
        a token removed from the file takes its keys, and what they signed, with it."""
        return tuple(hmac.digest(a.token, purpose, "sha256") for a in self._accepted)


def _ident(token: bytes) -> str:
    return hashlib.sha256(token).hexdigest()


def refresh(api: ApiTokens, view: ApiTokens) -> None:
    """Re-read the API's token file, and the console view's when one is set."""
    api.refresh()
    if view.path is not None:
        view.refresh()


async def watch(api: ApiTokens, view: ApiTokens) -> None:
    """Re-read the token files when they change: a Secret update swaps them in place."""
    while True:
        await asyncio.sleep(POLL_S)
        refresh(api, view)
