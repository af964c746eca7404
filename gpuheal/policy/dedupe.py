"""An in-memory TTL set: the second dedupe layer (after the persisted records)."""

from __future__ import annotations

# Below this many keys the set is never pruned: a scan would cost more than it frees.
PRUNE_FLOOR = 64


class TtlSet:
    """Keys remembered for `ttl` seconds; time is passed in, never read.

    Expired keys are dropped when looked up, and all at once whenever the set has
    doubled since the last prune: a key that is never looked up again (a node
    that left the fleet, a fault that never repeats) does not stay forever, and
    the prunes cost O(1) per add, amortized."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._expiry: dict[str, float] = {}
        self._prune_at = PRUNE_FLOOR

    def add(self, key: str, now: float) -> None:
        self._expiry[key] = now + self.ttl
        if len(self._expiry) >= self._prune_at:
            self.prune(now)

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
        self._prune_at = max(PRUNE_FLOOR, 2 * len(self._expiry))

    def __len__(self) -> int:
        return len(self._expiry)


class BoundedSet:
    """Keys seen, at most `size` of them (the oldest forgotten first): for things
    said once, where saying one again after many others is no harm."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: dict[str, None] = {}

    def add(self, key: str) -> bool:
        """True if `key` is new."""
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self.size:
            del self._keys[next(iter(self._keys))]
        return True

    def __len__(self) -> int:
        return len(self._keys)
