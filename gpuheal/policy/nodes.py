"""Which nodes are gpuheal's, and which a person has taken out of service.

One rule each, read by the controller and by every command (`status`, `audit`,
`doctor`, `maintenance`, `gate`), so that what a command shows is what the
controller does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpuheal.config import Config
from gpuheal.model import (
    MANAGED_LABEL,
    QUARANTINED_DEVICES,
    STATE_LABEL,
    STATE_MAINTENANCE,
    STATUS,
    STATUS_FAULTY,
    SUSPECT_DEVICES,
    UNKNOWN_DEVICES,
    FaultRecord,
    NodeView,
    Phase,
)
from gpuheal.policy import dra

# A node's state as people are shown it (`gpuheal status`, the console), in the
# order of the states table: from fine to needs-a-look.
HEALTHY = "healthy"
SUSPECT = "suspect"
QUARANTINED = "quarantined"
DRAINING = "draining"
HELD = "held"
MAINTENANCE = "maintenance"
NOT_READY = "not-ready"
NODE_STATES = (HEALTHY, SUSPECT, QUARANTINED, DRAINING, HELD, MAINTENANCE, NOT_READY)


def gpus(node: NodeView, config: Config) -> int:
    """The node's GPUs: its GPU extended resources' capacity and its DRA devices.
    Every count the controller and the console show is this one."""
    return config.gpu_count(node.capacity) + dra.gpu_count(node.devices)


def usable_gpus(node: NodeView, config: Config) -> int:
    """Of those, what new pods may be given: allocatable extended resources, and DRA
    devices no taint keeps new claims off."""
    return config.gpu_count(node.allocatable) + dra.usable_count(node.devices)


_QUARANTINE_PHASES = frozenset({Phase.QUARANTINED, Phase.DRAINED, Phase.RECOVERING})


def gpu_node(labels: Mapping[str, str], gpu_capacity: int, config: Config) -> bool:
    """Managed by gpuheal: its labels match the controller's nodeSelector or, when
    that is empty, it has GPU capacity (`gpu_capacity`, as the caller's projection
    counts it)."""
    if config.node_selector:
        return all(labels.get(k) == v for k, v in config.node_selector.items())
    return gpu_capacity > 0


def opted_out(labels: Mapping[str, str]) -> bool:
    """A person said gpuheal must leave the node alone (gpuheal.io/managed=false)."""
    return labels.get(MANAGED_LABEL) == "false"


def managed(labels: Mapping[str, str], gpu_capacity: int, config: Config) -> bool:
    """gpuheal acts on the node: a GPU node (`gpu_node`) not opted out. The one rule
    for faults, maintenance requests and roll-outs alike, so that an identity that may
    only ask (a maintenance request) reaches no node the controller would not touch
    for a fault. A node whose GPUs only a DRA driver publishes (a ResourceSlice) has
    no GPU capacity: such a node is managed through a label the nodeSelector names
    (gpuheal counts its GPUs from the slices, but does not take a node on that alone)."""
    return gpu_node(labels, gpu_capacity, config) and not opted_out(labels)


def why_unmanaged(labels: Mapping[str, str], gpu_capacity: int, config: Config) -> str | None:
    """Why gpuheal does not act on the node, in words a person can act on; None when
    it does (`managed`)."""
    if opted_out(labels):
        return f"it is opted out ({MANAGED_LABEL}=false)"
    if gpu_node(labels, gpu_capacity, config):
        return None
    if config.node_selector:
        lacks = " ".join(
            f"{k}={v}" for k, v in sorted(config.node_selector.items()) if labels.get(k) != v
        )
        return f"the controller's nodeSelector does not match it (it lacks {lacks})"
    resources = ", ".join(config.gpu_resources)
    return f"it has no GPU capacity ({resources}) and the controller's nodeSelector is empty"


def in_maintenance(labels: Mapping[str, str]) -> bool:
    """Taken out of service by a person (`gpuheal maintenance start`): the state label.
    The controller pauses for it; the maintenance taint and the cordon are what
    maintenance does to the node, not the mark that it is in maintenance."""
    return labels.get(STATE_LABEL) == STATE_MAINTENANCE


def node_state(node: NodeView, faults: Sequence[FaultRecord]) -> str:
    """The node's state, the first that applies: not-ready > maintenance > held >
    draining > quarantined > suspect > healthy. `faults` are the node's open records;
    only whole-node ones make it held, draining or quarantined."""
    whole_node = {f.phase for f in faults if f.scope == "node"}
    rules: tuple[tuple[str, Callable[[], bool]], ...] = (
        (NOT_READY, lambda: node.ready is not True),
        (MAINTENANCE, lambda: in_maintenance(node.labels)),
        (HELD, lambda: Phase.HELD in whole_node),
        (DRAINING, lambda: Phase.DRAINING in whole_node),
        (QUARANTINED, lambda: node.taint() is not None or bool(whole_node & _QUARANTINE_PHASES)),
        (SUSPECT, lambda: _suspect(node, faults)),
    )
    return next((state for state, applies in rules if applies()), HEALTHY)


def _suspect(node: NodeView, faults: Sequence[FaultRecord]) -> bool:
    annotations = node.annotations
    return bool(
        faults  # reported, not acted on yet (a P1 being watched), or a device-level record
        or annotations.get(STATUS) == STATUS_FAULTY
        or any(annotations.get(k) for k in (SUSPECT_DEVICES, UNKNOWN_DEVICES, QUARANTINED_DEVICES))
    )
