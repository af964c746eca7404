"""Which nodes are gpuheal's, and which a person has taken out of service.

One rule each, read by the controller and by every command (`status`, `audit`,
`doctor`, `maintenance`, `gate`), so that what a command shows is what the
controller does.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuheal.config import Config
from gpuheal.model import STATE_LABEL, STATE_MAINTENANCE


def gpu_node(labels: Mapping[str, str], gpu_capacity: int, config: Config) -> bool:
    """Managed by gpuheal: its labels match the controller's nodeSelector or, when
    that is empty, it has GPU capacity (`gpu_capacity`, as the caller's projection
    counts it)."""
    if config.node_selector:
        return all(labels.get(k) == v for k, v in config.node_selector.items())
    return gpu_capacity > 0


def in_maintenance(labels: Mapping[str, str]) -> bool:
    """Taken out of service by a person (`gpuheal maintenance start`): the state label.
    The controller pauses for it; the maintenance taint and the cordon are what
    maintenance does to the node, not the mark that it is in maintenance."""
    return labels.get(STATE_LABEL) == STATE_MAINTENANCE
