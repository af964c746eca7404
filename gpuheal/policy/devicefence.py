"""Which device fences a node's device faults want: one DeviceTaintRule
(policy/fence.py) per open fault of a DRA GPU, none for any other.

Level-triggered, like the rest of the device plan: the rules wanted are derived
from the node's records as they stand after this pass, and compared with the
rules there (the controller's cache of its own, labelled rules). So a controller
killed between a record and its rule, or between a release and the rule's removal,
finds the difference on its next pass and closes it; the rule's name is the
record's, so there is never a second.

- Open device record of a `gpuDrivers` driver's device: its rule, of the configured
  effect; once the rule is seen, a `fence` entry on the record names it (once).
- Closed (released, resolved, failed) or deleted record, or `deviceHealth.fence:
  off`: the rule goes.
- DeviceTaintRules not served (Kubernetes before 1.36, or 1.36 without
  resource.k8s.io/v1beta2): nothing; the device's annotation is its only mark.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from gpuheal.clock import iso, parse_time
from gpuheal.model import OPEN_PHASES, ActionEntry, DeviceKey, FaultRecord, FenceView, Phase
from gpuheal.policy.actions import UpdateRecord
from gpuheal.policy.dra import device_key
from gpuheal.policy.fence import rule_name
from gpuheal.vocabulary import Entry

OFF = "off"


@dataclass(frozen=True)
class Fences:
    """What the plan knows of the node's device fences."""

    rules: Mapping[str, FenceView] = field(default_factory=dict)  # the node's, by name
    # resource.k8s.io's version that serves them (v1, v1beta2); "": none does (or our
    # cache of them has not synced yet), so no device can be fenced.
    api_version: str = ""

    @property
    def available(self) -> bool:
        return bool(self.api_version)


@dataclass(frozen=True)
class FenceDevice:
    """Create the rule fencing `device` for the fault `record` holds."""

    node: str
    record: str
    fault_id: str
    reason: str
    device: DeviceKey
    effect: str
    expires: dt.datetime | None = None
    api_version: str = "v1beta2"


@dataclass(frozen=True)
class Unfence:
    """Delete the rule `name` (the fault it fenced for is over)."""

    node: str
    name: str
    record: str
    api_version: str = "v1beta2"


FenceAction = FenceDevice | Unfence | UpdateRecord


def fenced_device(record: FaultRecord, drivers: Collection[str]) -> DeviceKey | None:
    """The DRA device a device record is about, when it is a GPU driver's."""
    if not record.device_scope or record.resource not in drivers:
        return None
    key = device_key(record.device)
    return key if key is not None and key.driver == record.resource else None


def plan_fences(
    node: str,
    records: Iterable[FaultRecord],
    fences: Fences,
    *,
    effect: str,
    drivers: Collection[str],
    phases: Mapping[str, Phase],
    now: dt.datetime,
) -> list[FenceAction]:
    """The rules to create and delete, and the `fence` entries to write, for the
    node's records as this pass leaves them (`phases`: the phase it moves each to)."""
    if not fences.available:
        return []
    actions: list[FenceAction] = []
    wanted: set[str] = set()
    for record in records:
        device = fenced_device(record, drivers)
        phase = phases.get(record.name, record.phase)
        if device is None or phase not in OPEN_PHASES or effect == OFF:
            continue
        name = rule_name(record.name)
        wanted.add(name)
        rule = fences.rules.get(name)
        if rule is None:
            expires = parse_time(record.expiry)
            actions.append(
                FenceDevice(
                    node,
                    record.name,
                    record.fault_id,
                    record.reason,
                    device,
                    effect,
                    expires,
                    fences.api_version,
                )
            )
        elif not any(a.action == Entry.FENCE for a in record.actions):
            entry = ActionEntry(iso(now), Entry.FENCE, "ok", f"{name} ({rule.effect})")
            actions.append(UpdateRecord(record.name, phase, entry))
    actions += [
        Unfence(node, name, rule.record, fences.api_version)
        for name, rule in sorted(fences.rules.items())
        if name not in wanted
    ]
    return actions
