"""Blast-radius breaker: how many GPU nodes may be quarantined at once. Where the
controller applies it, atomically across workers: docs/architecture.md#the-breaker."""

from __future__ import annotations

import math

from gpuheal.config import Config


def quarantine_capacity(gpu_nodes: int, config: Config) -> int:
    """The smaller of the absolute cap and the percentage of GPU nodes.

    At least one node may always be quarantined when the absolute cap allows
    any: on a small cluster a percentage rounds down to zero, and refusing to
    fence the only broken node would make the outage worse, not better.
    """
    by_percent = math.floor(gpu_nodes * config.breaker_max_percent / 100)
    if config.breaker_max_nodes == 0:
        return 0
    return max(1, min(config.breaker_max_nodes, by_percent))


def breaker_allows(quarantined: int, gpu_nodes: int, config: Config) -> bool:
    """May one more node be quarantined, given `quarantined` already are?"""
    return quarantined + 1 <= quarantine_capacity(gpu_nodes, config)


def repair_capacity(gpu_nodes: int, config: Config) -> int:
    """Repairs in flight at once: `repair.maxConcurrent`, and never more than the
    breaker lets be quarantined (a repair runs only on a quarantined node, so the
    two budgets are counted together: a repair never frees quarantine room)."""
    return min(config.repair.max_concurrent, quarantine_capacity(gpu_nodes, config))
