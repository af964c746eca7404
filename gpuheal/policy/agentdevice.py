"""The agent's finding on one GPU of a DRA node, handled as that card's fault.

The agent reports its node's fault in the node-annotation contract
(sources/annotations.py) with the GPUs it concerns, by UUID. On a device-plugin node
the only fence is the node's taint. On a node whose GPUs are DRA devices, with the
DeviceTaintRule API served, one card can be fenced alone (policy/devicefence.py),
so a finding that stays on one GPU goes to the device plan instead of the node's:

- its reason is an Xid's (the catalogue row's reason for the code it ends with)
  whose scope is the device (policy/drivertaints.scope_of: an error of the GPU's
  own memory, engines or firmware, whose remedy NVIDIA gives as a GPU reset or
  support; not a reboot, not a link of the NVLink fabric, which on an NVSwitch
  system every GPU's collectives cross);
- it names exactly one GPU, published as a whole device (`type: gpu`) in the node's
  slices of the configured drivers;
- no node-level record of this fault exists (a fault the node's plan began, on an
  older controller or before the fence was served, stays the node's to the end).

Anything else is the node's, as before: two GPUs in one report (the debounced
report gathers them), a finding no Xid names (NVML's level probe, a lost or missing
GPU), a GPU partitioned into MIG devices (the card itself is not one device to
fence), a node without DRA devices, or no DeviceTaintRule API.

The card then stays fenced while the agent reports the fault: the agent keeps an
Xid until the GPU is reset or the node boots again (agent/app.py, StickyEvents).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gpuheal.model import DeviceHealth, DraDevice, FaultSignal, PodView
from gpuheal.policy.drivertaints import DriverReport, Scope, scope_of
from gpuheal.sources.annotations import SOURCE, decode
from gpuheal.sources.base import Seen
from gpuheal.xid import XidRow, classify

_CODE = re.compile(r"(\d+)$")


def own_finding(seen: Seen) -> FaultSignal | None:
    """The agent's report on the node, when it is one GPU's for the device plan."""
    signal = decode(seen.node.name, seen.node.annotations)
    if signal is None or card_of(seen, signal) is None:
        return None
    return signal


def diverted(seen: Seen, signal: FaultSignal) -> bool:
    """`signal` is the device plan's, not the node plan's."""
    return signal.source == SOURCE and card_of(seen, signal) is not None


def card_of(seen: Seen, signal: FaultSignal) -> DraDevice | None:
    """The one DRA card `signal` stays on, or None when the fault is the node's."""
    config = seen.config
    if not (seen.device_fence and config.device_health.enabled):
        return None
    if config.device_health.fence == "off" or len(signal.devices) != 1:
        return None
    if not _device_scope(signal.reason, config.xid_overrides):
        return None
    if any(r.fault_id == signal.fault_id and not r.device_scope for r in seen.records):
        return None
    (uuid,) = signal.devices
    return next((d for d in seen.node.devices if d.kind == "gpu" and d.uuid == uuid), None)


def _device_scope(reason: str, overrides: Mapping[int, XidRow]) -> bool:
    code = _CODE.search(reason)
    if code is None:
        return False
    row = classify(int(code.group(1)), overrides)
    return row.reason == reason and scope_of(row) is Scope.DEVICE


def reports(seen: Seen, pods: Iterable[PodView]) -> tuple[DriverReport, ...]:
    """The agent's finding as a report on its card, with the pods holding it; () when
    the finding is the node's (or there is none)."""
    signal = own_finding(seen)
    card = card_of(seen, signal) if signal is not None else None
    if signal is None or card is None:
        return ()
    return (
        DriverReport(
            card,
            DeviceHealth.UNHEALTHY,
            f"agent: {signal.reason} on {card.uuid}",
            "",
            signal.detected_at,
            tuple(p for p in pods if any(d.key == card.key for d in p.held)),
        ),
    )
