"""Decide what to do about the devices of one node: observed health + records + config + now.

Device health comes from Pod status allocatedResourcesStatus: the kubelet's copy of
what the device plugin or DRA driver says about each device it gave a pod. The rules
(docs/controller.md, "Device-level health"):

- Unhealthy: a device-scoped GPUFault (its name is the lock and idempotency key:
  node, resource, resourceID, episode), then only the pods holding the device are
  evicted (a partial drain). The node is tainted only on escalation (below).
- Unknown, or a Healthy report older than the heartbeat limit: an Event while within
  the tolerance window, then the device is suspect (marked on the node). Never a
  fault by itself: Unknown is not Unhealthy.
- A node that is not Ready or is unreachable: nothing new is decided for its devices;
  a lost node is not N device faults.
- Healthy again, or the quarantine expired without a fresh Unhealthy report: a canary
  pod on the node, then an observation window, then release. A failed canary
  extends the quarantine.
- Escalation to a node quarantine (a signal for the node plan): K device faults
  within a window, fewer healthy devices than a fraction, a whole-node reason in the
  health message, or a device failing again soon after its release.

Like the node plan (policy/plan/), level-triggered: each decision derives from what
is observed, so running it again after a crash continues where the world is.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpuheal.clock import iso, parse_time
from gpuheal.config import Config, DeviceHealthConfig
from gpuheal.model import (
    QUARANTINED_DEVICES,
    SUSPECT_DEVICES,
    UNKNOWN_DEVICES,
    ActionEntry,
    CanaryView,
    DeviceHealth,
    DeviceReport,
    DraDevice,
    FaultRecord,
    Mode,
    NodeView,
    Phase,
    PodView,
    Severity,
    fault_record_name,
)
from gpuheal.policy import dra
from gpuheal.policy.actions import Emit, Evict, UpdateRecord
from gpuheal.policy.devicefence import FenceDevice, Fences, Unfence, fenced_device, plan_fences
from gpuheal.policy.drivertaints import DriverReport
from gpuheal.policy.history import opened_at
from gpuheal.policy.nodes import opted_out
from gpuheal.policy.offenders import offence
from gpuheal.policy.sharing import GPU, physical_gpus
from gpuheal.vocabulary import Entry, Reason

SOURCE = "pod-status"
REASON = "DeviceUnhealthy"

# The node lifecycle controller's taints for a node it cannot hear from.
UNREACHABLE_TAINTS = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})

_QUARANTINE_PHASES = frozenset(
    {Phase.DETECTED, Phase.HELD, Phase.QUARANTINED, Phase.DRAINING, Phase.DRAINED}
)
_WORST = {DeviceHealth.UNHEALTHY: 0, DeviceHealth.UNKNOWN: 1, DeviceHealth.HEALTHY: 2}


@dataclass(frozen=True)
class DeviceEntry:
    """One pod's report of one device, with when the controller saw it."""

    pod: PodView
    report: DeviceReport
    since: dt.datetime  # when this health was first seen (its last change)
    seen: dt.datetime  # the latest report carrying it (the report's age starts here)


@dataclass(frozen=True)
class Device:
    """All reports of one device on a node, merged: the worst health wins."""

    resource: str
    device_id: str
    health: DeviceHealth  # effective: a stale Healthy is Unknown
    since: dt.datetime  # the effective health holds since
    seen: dt.datetime
    message: str = ""
    holders: tuple[PodView, ...] = ()
    node_wide: str = ""  # why its fault is its node's (a DRA driver's taint says so)

    @property
    def key(self) -> tuple[str, str]:
        return (self.resource, self.device_id)


@dataclass(frozen=True)
class DeviceState:
    node: NodeView
    entries: tuple[DeviceEntry, ...] = ()
    # Every GPUFault record of the node, any scope and phase (history counts).
    records: tuple[FaultRecord, ...] = ()
    canaries: Mapping[str, CanaryView] = field(default_factory=dict)
    # Evictions the node's rate limit allows now.
    evictions_allowed: int = 1 << 30
    # The node's device fences (DeviceTaintRules) and whether there can be any.
    fences: Fences = field(default_factory=Fences)
    # What a DRA driver's taints on the node's devices say (policy/drivertaints.py).
    driver: tuple[DriverReport, ...] = ()


# -- actions (plus UpdateRecord, Evict and Emit, as the node plan uses) -------------------


@dataclass(frozen=True)
class CreateDeviceRecord:
    record: FaultRecord  # the record as it will be: name, ids, phase, first actions
    message: str = ""  # the device's health message, if any


@dataclass(frozen=True)
class MarkDevices:
    """The node's device annotations (resourceIDs), written when they differ."""

    node: str
    quarantined: tuple[str, ...]
    suspect: tuple[str, ...]
    unknown: tuple[str, ...]


@dataclass(frozen=True)
class CreateCanary:
    name: str
    node: str
    resource: str
    record: str
    # A DRA device: the canary claims it (by UUID, through the DeviceClass of its
    # kind); None for a device plugin's GPU, or a DRA device no slice publishes now.
    device: DraDevice | None = None
    dra: bool = False  # the record is about a DRA device


@dataclass(frozen=True)
class DeleteCanary:
    name: str
    dra: bool = False  # its claim goes too


@dataclass(frozen=True)
class DeviceReleased:
    """Counts only: a released device, and whether its quarantine was a false one."""

    record: str
    false_quarantine: bool


DeviceAction = (
    CreateDeviceRecord
    | UpdateRecord
    | Evict
    | MarkDevices
    | CreateCanary
    | DeleteCanary
    | DeviceReleased
    | Emit
    | FenceDevice
    | Unfence
)


@dataclass(frozen=True)
class DeviceSummary:
    """For the metrics: what the plan saw."""

    unknown: int = 0
    suspect: int = 0
    quarantined: int = 0
    report_ages: tuple[float, ...] = ()
    unknown_for: tuple[float, ...] = ()


@dataclass(frozen=True)
class DevicePlan:
    actions: tuple[DeviceAction, ...] = ()
    requeue_after: float | None = None
    suppressed: str | None = None
    summary: DeviceSummary = field(default_factory=DeviceSummary)
    fault_id: str = ""  # for the executor's logs

    @property
    def evictions(self) -> int:
        return sum(isinstance(a, Evict) for a in self.actions)


# -- observation -----------------------------------------------------------------


def node_reachable(node: NodeView) -> bool:
    """False when the node is NotReady/Unknown or carries an unreachable taint: its
    devices' reports cannot be trusted. Not model.ready: a node without a Ready
    condition yet counts as reachable here."""
    ready = node.condition("Ready")
    if ready is not None and ready.status != "True":
        return False
    return not any(t.key in UNREACHABLE_TAINTS for t in node.taints)


def effective(entry: DeviceEntry, config: DeviceHealthConfig, now: dt.datetime) -> DeviceEntry:
    """A Healthy report older than the heartbeat limit counts as Unknown from then on."""
    limit = config.heartbeat_seconds
    if entry.report.health is DeviceHealth.HEALTHY and limit > 0:
        stale_at = entry.seen + dt.timedelta(seconds=limit)
        if now >= stale_at:
            report = DeviceReport(
                entry.report.resource, entry.report.device_id, DeviceHealth.UNKNOWN, "stale"
            )
            return DeviceEntry(entry.pod, report, since=stale_at, seen=entry.seen)
    return entry


def devices_of(
    entries: Iterable[DeviceEntry], config: DeviceHealthConfig, now: dt.datetime
) -> dict[tuple[str, str], Device]:
    grouped: dict[tuple[str, str], list[DeviceEntry]] = {}
    for entry in entries:
        key = (entry.report.resource, entry.report.device_id)
        grouped.setdefault(key, []).append(effective(entry, config, now))
    devices = {}
    for key, group in grouped.items():
        health = min((e.report.health for e in group), key=_WORST.__getitem__)
        worst = [e for e in group if e.report.health is health]
        holders = {e.pod.key: e.pod for e in group}
        devices[key] = Device(
            resource=key[0],
            device_id=key[1],
            health=health,
            since=min(e.since for e in worst),
            seen=max(e.seen for e in group),
            message=next((e.report.message for e in worst if e.report.message), ""),
            holders=tuple(holders[k] for k in sorted(holders)),
        )
    return devices


def with_driver(
    devices: Mapping[tuple[str, str], Device], driver: Iterable[DriverReport], now: dt.datetime
) -> dict[tuple[str, str], Device]:
    """The devices as the kubelet reports them, and as a DRA driver's taints do: one
    device whichever says it (the key is the driver and its "driver/pool/device"), its
    worst health standing, its holders every pod that reports or holds it."""
    merged = dict(devices)
    for report in driver:
        key = report.device.key
        device_id = f"{key.driver}/{key.pool}/{key.device}"
        since = parse_time(report.since) or now
        said = Device(
            key.driver, device_id, report.health, since, now, report.message, report.holders,
            report.node_wide,
        )  # fmt: skip
        known = merged.get((key.driver, device_id))
        if known is not None:
            worse, other = (
                (known, said) if _WORST[known.health] <= _WORST[said.health] else (said, known)
            )
            holders = {p.key: p for p in (*worse.holders, *other.holders)}
            said = replace(
                worse,
                holders=tuple(holders[k] for k in sorted(holders)),
                node_wide=worse.node_wide or other.node_wide,
            )
        merged[(key.driver, device_id)] = said
    return merged


def canary_name(record: str, attempt: int) -> str:
    """Deterministic per record and attempt: a restarted controller finds its canary.
    A record name ends in a 12-hex digest of its identity (model.fault_record_name)."""
    return f"gpuheal-canary-{record[-12:]}-{attempt}"


def _last(record: FaultRecord, action: str) -> ActionEntry | None:
    return next((a for a in reversed(record.actions) if a.action == action), None)


# -- the plan ---------------------------------------------------------------------


class _Soonest:
    def __init__(self) -> None:
        self.value: float | None = None

    def at(self, seconds: float) -> None:
        seconds = max(seconds, 0.1)
        self.value = seconds if self.value is None else min(self.value, seconds)


@dataclass
class _Pass:
    """One planning pass: what is known and what it decided so far."""

    state: DeviceState
    config: Config
    now: dt.datetime
    actions: list[DeviceAction] = field(default_factory=list)
    requeue: _Soonest = field(default_factory=_Soonest)
    budget: int = 0
    created: list[FaultRecord] = field(default_factory=list)
    released: set[str] = field(default_factory=set)

    @property
    def cfg(self) -> DeviceHealthConfig:
        return self.config.device_health

    def entry(self, action: str, result: str = "ok", detail: str = "") -> ActionEntry:
        return ActionEntry(time=iso(self.now), action=action, result=result, detail=detail)

    def later(self, seconds: float) -> str:
        return iso(self.now + dt.timedelta(seconds=seconds))

    def emit(self, reason: str, note: str, record: str = "", *, warning: bool = False) -> None:
        self.actions.append(Emit(reason, note, self.state.node.name, record, warning=warning))


def plan_devices(state: DeviceState, config: Config, now: dt.datetime) -> DevicePlan:
    cfg = config.device_health
    node = state.node
    if not cfg.enabled:
        return DevicePlan(suppressed="disabled")
    if opted_out(node.labels):
        return DevicePlan(suppressed="opt-out")
    devices = with_driver(devices_of(state.entries, cfg, now), state.driver, now)
    summary = _summary(devices, state, now)
    if not node_reachable(node):
        # Every device of a lost node reads Unknown or stale: not N device faults.
        return DevicePlan(suppressed="node-not-ready", summary=summary)
    work = _Pass(state, config, now, budget=max(0, state.evictions_allowed))
    records = [r for r in state.records if r.device_scope]
    open_by_key = {(r.resource, r.device): r for r in records if r.open}
    for key in sorted(devices):
        device = devices[key]
        if device.health is DeviceHealth.UNHEALTHY and key not in open_by_key:
            open_by_key[key] = _open_fault(work, device)
    for key in sorted(open_by_key):
        _advance(work, open_by_key[key], devices.get(key))
    quarantined = {k for k, r in open_by_key.items() if r.name not in work.released}
    marked = _mark(work, devices, quarantined)
    _fence(work, marked[1])
    # The gauges follow what this pass decides, not the marks it read: the node's own
    # echo of our write does not come back as another reconcile to update them.
    summary = replace(summary, suspect=len(marked[1]), quarantined=len(quarantined))
    return DevicePlan(
        actions=tuple(work.actions),
        requeue_after=work.requeue.value,
        summary=summary,
        fault_id=",".join(r.fault_id for r in work.created),
    )


def _fence(work: _Pass, suspect: tuple[str, ...]) -> None:
    """The node's device fences as its records and suspect devices stand after this
    pass."""
    fencing = plan_fences(
        work.state.node.name,
        (*work.state.records, *work.created),
        work.state.fences,
        effect=work.cfg.fence,
        probation_s=work.cfg.probation_seconds,
        drivers=work.config.gpu_drivers,
        phases={a.name: a.phase for a in work.actions if isinstance(a, UpdateRecord)},
        now=work.now,
        suspect=suspect,
    )
    new = [a for a in fencing.actions if isinstance(a, FenceDevice)]
    if new:
        # The record names its rule once the rule is seen (our own write's echo
        # queues no pass): look again soon.
        work.requeue.at(work.config.eviction_retry_base_seconds)
    if fencing.wake_after is not None:
        work.requeue.at(fencing.wake_after)  # a probation ends: its rule goes
    # A new fence right after the records (the lock) and before any eviction: the
    # card is out of allocation before its pods leave, and a pass killed after the
    # evictions (whose record news is written at its end) has fenced already.
    # Removals go last, after the release that closes their record.
    made = [i for i, a in enumerate(work.actions) if isinstance(a, CreateDeviceRecord)]
    at = made[-1] + 1 if made else 0
    work.actions[at:at] = new
    work.actions += [a for a in fencing.actions if not isinstance(a, FenceDevice)]


def _summary(
    devices: Mapping[tuple[str, str], Device], state: DeviceState, now: dt.datetime
) -> DeviceSummary:
    unknown = [d for d in devices.values() if d.health is DeviceHealth.UNKNOWN]
    return DeviceSummary(
        unknown=len(unknown),
        suspect=len(_ids(state.node, SUSPECT_DEVICES)),
        quarantined=sum(1 for r in state.records if r.device_scope and r.open),
        report_ages=tuple(max(0.0, (now - d.seen).total_seconds()) for d in devices.values()),
        unknown_for=tuple(max(0.0, (now - d.since).total_seconds()) for d in unknown),
    )


def _open_fault(work: _Pass, device: Device) -> FaultRecord:
    """A new device fault: its record (the lock) and Events; escalation is decided here,
    when a new fault is what pushes the node over a limit."""
    state, cfg, now = work.state, work.cfg, work.now
    node = state.node
    history = [r for r in (*state.records, *work.created) if r.device_scope]
    earlier = [r for r in history if (r.resource, r.device) == device.key]
    # After the highest episode seen, not the count: retention deletes the oldest
    # records, and a count would name an episode whose record still exists.
    episode = 1 + max(len(earlier), *(_episode(r) for r in earlier), 0)
    fault_id = f"{device.device_id}#{episode}"
    name = fault_record_name(node.name, fault_id, device.resource)
    why = _escalation(work, device, history)
    # The repeat-offender rule, the node path's (policy/offenders.py): the device
    # fault is flagged and told; its node is held only by its node fault's record.
    offender = offence((*state.records, *work.created), name, work.config, now)
    contact = offender is not None
    entries = [work.entry(Entry.DETECT, detail=device.message or SOURCE)]
    if why:
        entries.append(work.entry(Entry.ESCALATE, detail=why))
    if offender:
        entries.append(work.entry(Entry.REPEAT_OFFENDER, detail=offender))
    record = FaultRecord(
        name=name,
        node=node.name,
        fault_id=fault_id,
        phase=Phase.QUARANTINED,
        reason=REASON,
        severity=Severity.P0,
        source=SOURCE,
        detected_at=iso(device.since),
        actions=tuple(entries),
        created_at=iso(now),
        scope="device",
        resource=device.resource,
        device=device.device_id,
        expiry=work.later(cfg.quarantine_seconds),
        contact_support=contact,
    )
    work.actions.append(CreateDeviceRecord(record, device.message))
    work.created.append(record)
    holders = len(device.holders)
    work.emit(
        Reason.DETECTED,
        f"{device.resource} {device.device_id} Unhealthy"
        + (f" ({device.message})" if device.message else "")
        + f"; device quarantined, {holders} pod(s) holding it to move",
        name,
        warning=True,
    )
    if why:
        work.emit(Reason.DEVICE_ESCALATED, f"node quarantine: {why}", name, warning=True)
    if offender:
        work.emit(Reason.CONTACT_SUPPORT, offender, name, warning=True)
    return record


def _episode(record: FaultRecord) -> int:
    """The episode number of a device record's fault id (`<resourceID>#<n>`), or 0."""
    _, sep, number = record.fault_id.rpartition("#")
    return int(number) if sep and number.isdigit() else 0


def _escalation(work: _Pass, device: Device, history: list[FaultRecord]) -> str:
    """Why a new fault of `device` escalates to the whole node, or ''."""
    cfg, now, node = work.cfg, work.now, work.state.node
    if device.node_wide:
        return device.node_wide
    message = device.message.lower()
    whole = next((r for r in cfg.whole_node_reasons if r in message), None)
    if whole:
        return f"whole-node reason {whole!r} in the health message"
    for record in history:
        release = (
            _last(record, Entry.RELEASE) if (record.resource, record.device) == device.key else None
        )
        released = parse_time(release.time) if release else None
        if released and (now - released).total_seconds() <= cfg.repeat_window_seconds:
            after = (now - released).total_seconds()
            return f"{device.device_id} failed again {after:.0f}s after its release"
    window = [
        r
        for r in history
        if (t := opened_at(r)) is not None
        and (now - t).total_seconds() <= cfg.escalation_window_seconds
    ]
    if len(window) + 1 >= cfg.escalate_after_faults:
        return (
            f"{len(window) + 1} device faults within {cfg.escalation_window_seconds:g}s "
            f"(limit {cfg.escalate_after_faults})"
        )
    # Devices are GPUs (replica IDs are folded into their GPU): a shared GPU's
    # nvidia.com/gpu capacity counts its replicas, so count the GPUs behind it.
    gpus = physical_gpus(GPU, node.gpus, node.labels) + dra.gpu_count(node.devices)
    if gpus > 0:
        bad = {r.device for r in history if r.open} | {device.device_id}
        healthy = gpus - len(bad)
        if healthy < cfg.min_healthy_fraction * gpus:
            return f"{healthy} of {gpus} devices healthy (below {cfg.min_healthy_fraction:g})"
    return ""


def _advance(work: _Pass, record: FaultRecord, device: Device | None) -> None:
    health = device.health if device else None
    if record.phase is Phase.CANARY:
        _canary_step(work, record, health)
        return
    _leftover_canary(work, record)
    if record.phase is Phase.RECOVERING:
        _observe_step(work, record, health)
    elif record.phase in _QUARANTINE_PHASES and not _drain_step(work, record, device):
        _release_trigger(work, record, health)


def _drain_step(work: _Pass, record: FaultRecord, device: Device | None) -> bool:
    """Evict the pods holding the bad device, within the node's rate limit. True while
    pods are left to move."""
    if work.config.mode_for(record.reason) is not Mode.FULL:
        return False
    holders = (
        [p for p in device.holders if not p.daemonset and not p.terminal and not p.canary]
        if device is not None and device.health is not DeviceHealth.HEALTHY
        else []
    )
    if not holders:
        if record.phase is Phase.DRAINING:
            work.actions.append(UpdateRecord(record.name, Phase.DRAINED, work.entry(Entry.DRAIN)))
        return False
    to_evict = [p for p in holders if not p.deleting]
    allowed = to_evict[: work.budget]
    work.budget -= len(allowed)
    evictions = [Evict(p, record.fault_id, device=record.device) for p in allowed]
    work.actions += evictions
    if evictions or record.phase is not Phase.DRAINING:
        detail = f"{len(evictions)} of {len(holders)} pod(s) holding {record.device}"
        work.actions.append(
            UpdateRecord(
                record.name,
                Phase.DRAINING,
                work.entry(Entry.EVICT, detail=detail),
                record_evictions=True,
            )
        )
    if len(allowed) < len(to_evict):
        work.requeue.at(60.0 / work.cfg.evictions_per_minute)
    else:
        work.requeue.at(work.config.eviction_retry_base_seconds)
    return True


def _release_trigger(work: _Pass, record: FaultRecord, health: DeviceHealth | None) -> None:
    """No pod left on the bad device: start the way out when it reports Healthy again,
    or when the quarantine expired without a fresh Unhealthy report."""
    expiry = parse_time(record.expiry) or work.now
    remaining = (expiry - work.now).total_seconds()
    if health is DeviceHealth.UNHEALTHY:
        if remaining <= 0:  # still reported bad: the quarantine goes on
            work.actions.append(
                UpdateRecord(
                    record.name,
                    record.phase,
                    work.entry(Entry.EXTEND, detail="still reported Unhealthy"),
                    expiry=work.later(work.cfg.quarantine_seconds),
                )
            )
            work.requeue.at(work.cfg.quarantine_seconds)
        else:
            work.requeue.at(remaining)
        return
    # After a failed canary only the (extended) expiry opens the way out again:
    # a Healthy report alone would start the next canary at once.
    healthy_counts = health is DeviceHealth.HEALTHY and _last(record, Entry.CANARY_FAILED) is None
    if not healthy_counts and remaining > 0:
        work.requeue.at(remaining)
        return
    why = "reported Healthy" if health is DeviceHealth.HEALTHY else "quarantine expired"
    if work.config.mode_for(record.reason) is Mode.OBSERVE:
        # Observe-only: no pod is created; the observation window alone decides.
        work.actions.append(
            UpdateRecord(
                record.name,
                Phase.RECOVERING,
                work.entry(Entry.RECOVERING, detail=why),
                recovering_since=iso(work.now),
            )
        )
        work.requeue.at(work.cfg.observation_seconds)
        return
    _start_canary(work, record, why)


def _canary(work: _Pass, name: str, record: FaultRecord) -> CreateCanary:
    """The canary of `record`'s device: for a DRA device, the very device as its
    slice publishes it now (None when none does: the canary cannot be placed)."""
    key = fenced_device(record, work.config.gpu_drivers)
    device = next((d for d in work.state.node.devices if d.key == key), None) if key else None
    node = work.state.node.name
    return CreateCanary(name, node, record.resource, record.name, device, dra=key is not None)


def _dra(work: _Pass, record: FaultRecord) -> bool:
    return fenced_device(record, work.config.gpu_drivers) is not None


def _attempt(record: FaultRecord) -> int:
    return sum(1 for a in record.actions if a.action == Entry.CANARY_START)


def _start_canary(work: _Pass, record: FaultRecord, why: str) -> None:
    name = canary_name(record.name, _attempt(record) + 1)
    work.actions += [
        _canary(work, name, record),
        UpdateRecord(record.name, Phase.CANARY, work.entry(Entry.CANARY_START, detail=name)),
    ]
    work.emit(
        Reason.DEVICE_CANARY, f"{record.device} {why}: canary pod {name} started", record.name
    )
    if name in work.state.canaries:
        # Made by a controller killed before it wrote the start: it may have run
        # already, and its end was an event before this process watched. Read it now.
        work.requeue.at(0)
    else:
        work.requeue.at(work.cfg.canary_timeout_seconds)


def _leftover_canary(work: _Pass, record: FaultRecord) -> None:
    """The canary of a record past its canary phase goes, in a pass after the one
    that wrote its result: the record's news is written when a pass ends, so a
    canary deleted in the pass that read it could be run again by a controller
    killed in between (its record still says Canary, its pod gone)."""
    attempt = _attempt(record)
    name = canary_name(record.name, attempt)
    if attempt and name in work.state.canaries:
        work.actions.append(DeleteCanary(name, _dra(work, record)))


def _canary_step(work: _Pass, record: FaultRecord, health: DeviceHealth | None) -> None:
    """The canary's result, written on the record; the canary itself goes in the
    next pass (_leftover_canary), which comes at once."""
    cfg = work.cfg
    name = canary_name(record.name, max(_attempt(record), 1))
    start = _last(record, Entry.CANARY_START)
    started = (parse_time(start.time) if start else None) or work.now
    if health is DeviceHealth.UNHEALTHY:
        _back_to_quarantine(work, record, Entry.FAULT_RETURNED, "Unhealthy again during the canary")
        work.requeue.at(0)
        return
    pod = work.state.canaries.get(name)
    elapsed = (work.now - started).total_seconds()
    if pod is None:
        # Gone before we read its result (deleted by hand, or never made): run it again.
        work.actions.append(_canary(work, name, record))
        work.requeue.at(cfg.canary_timeout_seconds - elapsed)
    elif pod.phase == "Succeeded":
        work.actions.append(
            UpdateRecord(
                record.name,
                Phase.RECOVERING,
                work.entry(Entry.CANARY_PASSED, detail=name),
                recovering_since=iso(work.now),
            ),
        )
        work.requeue.at(0)
    elif pod.phase == "Failed" or elapsed >= cfg.canary_timeout_seconds:
        why = "failed" if pod.phase == "Failed" else f"timed out after {elapsed:.0f}s"
        _back_to_quarantine(work, record, Entry.CANARY_FAILED, f"canary {name} {why}")
        work.requeue.at(0)
        work.emit(
            Reason.GATE_FAILED,
            f"{record.device}: canary {name} {why}; quarantine extended by "
            f"{cfg.quarantine_seconds:g}s",
            record.name,
            warning=True,
        )
    else:
        work.requeue.at(cfg.canary_timeout_seconds - elapsed)


def _back_to_quarantine(work: _Pass, record: FaultRecord, action: str, detail: str) -> None:
    work.actions.append(
        UpdateRecord(
            record.name,
            Phase.QUARANTINED,
            work.entry(action, result="failed", detail=detail),
            recovering_since="",
            expiry=work.later(work.cfg.quarantine_seconds),
        )
    )
    work.requeue.at(work.config.eviction_retry_base_seconds)


def _observe_step(work: _Pass, record: FaultRecord, health: DeviceHealth | None) -> None:
    cfg = work.cfg
    if health is DeviceHealth.UNHEALTHY:
        _back_to_quarantine(work, record, Entry.FAULT_RETURNED, "Unhealthy again while observed")
        return
    since = parse_time(record.recovering_since) or work.now
    remaining = (since - work.now).total_seconds() + cfg.observation_seconds
    if remaining > 0:
        work.requeue.at(remaining)
        return
    opened = opened_at(record) or work.now
    false_quarantine = (
        _last(record, Entry.CANARY_FAILED) is None
        and (work.now - opened).total_seconds() <= cfg.false_quarantine_seconds
    )
    work.actions += [
        UpdateRecord(record.name, Phase.RESOLVED, work.entry(Entry.RELEASE)),
        DeviceReleased(record.name, false_quarantine),
    ]
    work.emit(
        Reason.RECOVERED,
        f"{record.device} passed its canary and {cfg.observation_seconds:g}s of observation: "
        "released",
        record.name,
    )
    work.released.add(record.name)


def _ids(node: NodeView, annotation: str) -> tuple[str, ...]:
    return tuple(sorted({d for d in node.annotations.get(annotation, "").split(",") if d}))


def _mark(
    work: _Pass, devices: Mapping[tuple[str, str], Device], quarantined: set[tuple[str, str]]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """Unknown within the tolerance: an Event; longer: suspect. Both and the quarantined
    devices are written on the node (the device plugin path cannot fence one device)."""
    cfg, now, node = work.cfg, work.now, work.state.node
    unknown: set[str] = set()
    suspect: set[str] = set()
    for key, device in devices.items():
        if key in quarantined:
            continue
        if device.health is DeviceHealth.UNKNOWN:
            waited = (now - device.since).total_seconds()
            if waited >= cfg.unknown_tolerance_seconds:
                suspect.add(device.device_id)
            else:
                unknown.add(device.device_id)
                work.requeue.at(cfg.unknown_tolerance_seconds - waited)
        elif device.health is DeviceHealth.HEALTHY and cfg.heartbeat_seconds > 0:
            work.requeue.at((device.seen - now).total_seconds() + cfg.heartbeat_seconds)
    wanted = (
        tuple(sorted({d for _, d in quarantined})),
        tuple(sorted(suspect)),
        tuple(sorted(unknown)),
    )
    current = tuple(_ids(node, a) for a in (QUARANTINED_DEVICES, SUSPECT_DEVICES, UNKNOWN_DEVICES))
    if wanted == current:
        return wanted
    work.actions.append(MarkDevices(node.name, *wanted))
    for device_id in sorted(set(wanted[2]) - set(current[2])):
        work.emit(
            Reason.DEVICE_UNKNOWN,
            f"{device_id} health Unknown; suspect after {cfg.unknown_tolerance_seconds:g}s",
        )
    for device_id in sorted(set(wanted[1]) - set(current[1])):
        work.emit(
            Reason.DEVICE_SUSPECT,
            f"{device_id} Unknown for over {cfg.unknown_tolerance_seconds:g}s: suspect, "
            "marked on the node (not a fault)",
            warning=True,
        )
    return wanted
