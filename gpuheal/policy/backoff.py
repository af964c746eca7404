"""Exponential backoff."""

from __future__ import annotations


def backoff_delay(failures: int, base: float, cap: float) -> float:
    """base * 2**(failures-1), capped; 0 failures waits 0."""
    if failures <= 0:
        return 0.0
    return float(min(cap, base * 2.0 ** min(failures - 1, 32)))
