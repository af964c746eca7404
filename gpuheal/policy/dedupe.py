"""An in-memory TTL set: the second dedupe layer (after the persisted records)."""

from __future__ import annotations


class TtlSet:
    """Keys remembered for `ttl` seconds; time is passed in, never read."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._expiry: dict[str, float] = {}

    def add(self, key: str, now: float) -> None:
        self._expiry[key] = now + self.ttl

    def contains(self, key: str, now: float) -> bool:
        expiry = self._expiry.get(key)
        if expiry is None:
            return False
        if expiry <= now:
            del self._expiry[key]
            return False
        return True

    def prune(self, now: float) -> None:
        for key in [k for k, expiry in self._expiry.items() if expiry <= now]:
            del self._expiry[key]

    def __len__(self) -> int:
        return len(self._expiry)
