"""A token bucket with time as a parameter (no clock reads)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class TokenBucket:
    rate: float  # tokens per second
    burst: int
    tokens: float
    updated: float  # monotonic seconds of the last refill

    @classmethod
    def full(cls, rate: float, burst: int, now: float) -> TokenBucket:
        return cls(rate=rate, burst=burst, tokens=float(burst), updated=now)

    def refill(self, now: float) -> TokenBucket:
        elapsed = max(0.0, now - self.updated)
        return replace(self, tokens=min(self.burst, self.tokens + elapsed * self.rate), updated=now)

    def take(self, now: float) -> tuple[TokenBucket, float]:
        """Take one token. Returns the new bucket and 0.0, or the unchanged
        (refilled) bucket and the seconds to wait before a token is there."""
        bucket = self.refill(now)
        if bucket.tokens >= 1.0:
            return replace(bucket, tokens=bucket.tokens - 1.0), 0.0
        return bucket, (1.0 - bucket.tokens) / bucket.rate
