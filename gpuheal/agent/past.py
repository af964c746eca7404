"""One thing's recent past, for signals judged over time (a GPU's degradation, a
network port's state): since when a state has held, how much of a window it held, how
much a counter grew within a window. Pure: the caller gives the time."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class Past:
    """Counter samples, and since when (and how much of a window) each state held."""

    samples: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)
    states: dict[str, deque[tuple[float, bool]]] = field(default_factory=dict)

    def share(self, key: str, active: bool, now: float, window_s: float) -> float | None:
        """The share of the last `window_s` that `key` was active (each round's state
        counted from the round before it); None until the window has been watched."""
        seen = self.states.setdefault(key, deque())
        seen.append((now, active))
        while len(seen) > 1 and seen[1][0] <= now - window_s:
            seen.popleft()
        if now - seen[0][0] < window_s:
            return None
        on = sum(b[0] - a[0] for a, b in zip(seen, list(seen)[1:], strict=False) if b[1])
        return on / (now - seen[0][0])

    def held(self, key: str, active: bool, now: float) -> float | None:
        """How long `key` has been active without a break (None: it is not)."""
        if not active:
            self.since.pop(key, None)
            return None
        return now - self.since.setdefault(key, now)

    def increase(self, key: str, total: int, now: float, window_s: float) -> tuple[int, float]:
        """How much the counter grew within the window, and over how long. A counter
        that went down was reset (a GPU reset, a driver reload): counting starts over."""
        seen = self.samples.setdefault(key, deque())
        if seen and total < seen[-1][1]:
            seen.clear()
        seen.append((now, total))
        # Keep the newest sample at or before the window's start as its baseline.
        while len(seen) > 1 and seen[1][0] <= now - window_s:
            seen.popleft()
        start_at, start = seen[0]
        return total - start, now - start_at
