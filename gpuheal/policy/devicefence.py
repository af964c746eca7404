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
from gpuheal.policy.fence import (
    FENCE,
    PROBATION,
    SUSPECT,
    SUSPECT_VALUE,
    probation_name,
    rule_name,
    suspect_name,
)
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
    # Which rule (policy/fence.py): FENCE; PROBATION, a released device's (only
    # workloads that tolerate it get the card, until `expires`); SUSPECT, a device
    # Unknown too long (`record` is the rule's name).
    kind: str = FENCE


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


@dataclass(frozen=True)
class FencePlan:
    actions: tuple[FenceAction, ...] = ()
    wake_after: float | None = None  # seconds until a probation ends (its rule goes)


def plan_fences(
    node: str,
    records: Iterable[FaultRecord],
    fences: Fences,
    *,
    effect: str,
    probation_s: float,
    drivers: Collection[str],
    phases: Mapping[str, Phase],
    now: dt.datetime,
    suspect: Collection[str] = (),
) -> FencePlan:
    """The rules to create and delete, and the `fence` entries to write, for the
    node's records as this pass leaves them (`phases`: the phase it moves each to)
    and its `suspect` devices (device ids)."""
    if not fences.available:
        return FencePlan()
    records = tuple(records)
    faulty = {
        fenced_device(r, drivers) for r in records if phases.get(r.name, r.phase) in OPEN_PHASES
    }
    actions: list[FenceAction] = []
    wanted: set[str] = set()
    ends: list[dt.datetime] = []
    for record in records:
        device = fenced_device(record, drivers)
        phase = phases.get(record.name, record.phase)
        if device is None or effect == OFF:
            continue
        if phase in OPEN_PHASES:
            wanted.add(rule_name(record.name))
            made = FenceDevice(
                node, record.name, record.fault_id, record.reason, device, effect,
                parse_time(record.expiry), fences.api_version,
            )  # fmt: skip
            actions += _fence(made, record, phase, fences, now)
            continue
        end = _probation_end(record, phase, probation_s, now)
        if end is None or end <= now or device in faulty:
            continue  # over, or a new fault of the card took it back to quarantine
        wanted.add(probation_name(record.name))
        ends.append(end)
        if probation_name(record.name) not in fences.rules:
            actions.append(
                FenceDevice(
                    node, record.name, record.fault_id, record.reason, device, "NoSchedule",
                    end, fences.api_version, kind=PROBATION,
                )
            )  # fmt: skip
    if effect != OFF:
        actions += _suspects(node, suspect, fences, drivers, wanted)
    actions += [
        Unfence(node, name, rule.record, fences.api_version)
        for name, rule in sorted(fences.rules.items())
        if name not in wanted
    ]
    wake = min(ends, default=None)
    return FencePlan(tuple(actions), (wake - now).total_seconds() if wake else None)


def _fence(
    made: FenceDevice, record: FaultRecord, phase: Phase, fences: Fences, now: dt.datetime
) -> list[FenceAction]:
    """An open fault's fence: `made`, or named on its record once seen."""
    name = rule_name(record.name)
    rule = fences.rules.get(name)
    if rule is None:
        return [made]
    if any(a.action == Entry.FENCE for a in record.actions):
        return []
    entry = ActionEntry(iso(now), Entry.FENCE, "ok", f"{name} ({rule.effect})")
    return [UpdateRecord(record.name, phase, entry)]


def _suspects(
    node: str, suspect: Collection[str], fences: Fences, drivers: Collection[str], wanted: set[str]
) -> list[FenceAction]:
    """A suspect DRA device's rule (NoSchedule): allocation restricted once Unknown
    has lasted past the tolerance; its pods stay (suspect is no fault)."""
    made: list[FenceAction] = []
    for device_id in sorted(suspect):
        key = device_key(device_id)
        if key is None or key.driver not in drivers:
            continue
        name = suspect_name(node, device_id)
        wanted.add(name)
        if name not in fences.rules:
            made.append(
                FenceDevice(
                    node, name, SUSPECT_VALUE, "DeviceSuspect", key, "NoSchedule",
                    api_version=fences.api_version, kind=SUSPECT,
                )
            )  # fmt: skip
    return made


def _probation_end(
    record: FaultRecord, phase: Phase, probation_s: float, now: dt.datetime
) -> dt.datetime | None:
    """When the probation of a released device ends; None: it had none."""
    if probation_s <= 0 or phase is not Phase.RESOLVED:
        return None
    release = next((a for a in reversed(record.actions) if a.action == Entry.RELEASE), None)
    if release is None:
        # Released in this very pass (its entry is written at the pass's end).
        released = now if record.phase is not Phase.RESOLVED else None
    else:
        released = parse_time(release.time)
    return released + dt.timedelta(seconds=probation_s) if released else None


def fence_problem(dra_gpus: int, served: str, looked: bool, effect: str) -> str | None:
    """What /readyz says of the device fence where DRA GPUs need one and it is not
    there (said, never a reason to be unready: node faults are handled without it)."""
    if not dra_gpus or not looked:
        return None
    if effect == OFF:
        return (
            f"device fence off (deviceHealth.fence: off): a bad one of the {dra_gpus} DRA "
            "GPUs is marked on its node and its pods moved, but new claims may be given it"
        )
    if served:
        return None
    return (
        f"device fence unavailable: the API server serves no DeviceTaintRules (resource.k8s.io/v1 "
        "from Kubernetes 1.37; v1beta2 in 1.36 with --runtime-config=resource.k8s.io/v1beta2="
        f"true and the DRADeviceTaintRules gate): a bad one of the {dra_gpus} DRA GPUs is "
        "marked on its node and its pods moved, but new claims may be given it"
    )
