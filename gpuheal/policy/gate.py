"""The health gate: may this node go back into service? Facts + config + time -> checks.

Both `gpuheal maintenance finish` and the controller's recovery ask it before
they give a node back, so a node is returned by the same rules whoever returns
it. Each check passes, fails or is skipped (nothing to check against) with one
sentence saying why; a failed gate exits 64 + the failing checks' bits.

Every fact comes from annotations and labels that others write (the agent, a
diagnostics job, GPU feature discovery): a malformed value fails its check with
a sentence naming the annotation, and never raises.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.model import (
    COUNTERS_SINCE,
    DIAGNOSTICS,
    DRIVER_UPGRADE_STATE,
    ECC_ERRORS,
    ENVIRONMENT_FACTS,
    LAST_GPU_ERROR,
    MAINTENANCE_BASELINE,
    MIG_LAYOUT,
    NODE_ENVIRONMENT,
    XID_ERRORS,
    DraDevice,
    NodeView,
    PodView,
)
from gpuheal.policy import dra, environment
from gpuheal.policy.operator import UPGRADE_FAILED, driver_upgrade
from gpuheal.policy.pools import (
    NO_POOL,
    driver_version,
    expected_driver,
    expected_gpus,
    pool_config,
    pool_of,
)
from gpuheal.policy.rollout import RolloutDriver, expected_during_rollout
from gpuheal.policy.sharing import expected_offers, mig_layout_problem, sharing

READY = "ready"
GPU_COUNT = "gpu-count"
DRIVER = "driver"
DRIVER_UPGRADE = "driver-upgrade"
GPU_ERRORS = "gpu-errors"
DIAGNOSTICS_CHECK = "diagnostics"
DEVICE_PLUGIN = "device-plugin"
ENVIRONMENT = "environment"
VALIDATION = "validation"

# One bit per check, in the order they run: a failed gate exits 64 | these. Exit
# codes from 128 up mean a signal, so six bits are all there is: the start-order facts
# share the device plugin's (both say "the node's GPU software is not up"), the
# validation Job diagnostics' (both say "the GPUs were tested and failed"), gpu-operator's
# driver upgrade the driver's.
CHECK_BITS: Mapping[str, int] = {
    READY: 1,
    GPU_COUNT: 2,
    DRIVER: 4,
    DRIVER_UPGRADE: 4,
    GPU_ERRORS: 8,
    DIAGNOSTICS_CHECK: 16,
    DEVICE_PLUGIN: 32,
    ENVIRONMENT: 32,
    VALIDATION: 16,
}


class CheckResult(StrEnum):
    """One check's result (the gate's as a whole: GateResult.passed)."""

    PASS = "pass"  # noqa: S105 -- a check's result, not a password
    FAIL = "fail"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Check:
    name: str
    result: CheckResult
    reason: str

    @property
    def bit(self) -> int:
        return CHECK_BITS[self.name]


@dataclass(frozen=True)
class GateResult:
    node: str
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return not self.failing

    @property
    def failing(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.result is CheckResult.FAIL)

    @property
    def bits(self) -> int:
        return bits_of(c.name for c in self.failing)

    def summary(self) -> str:
        """One line naming each failing check and why (for Events and records)."""
        if self.passed:
            return "all checks pass"
        return "; ".join(f"{c.name}: {c.reason}" for c in self.failing)


def bits_of(names: Iterable[str]) -> int:
    total = 0
    for name in names:
        total |= CHECK_BITS[name]
    return total


def checks_of(bits: int) -> tuple[str, ...]:
    """The checks an exit code's low bits name (exit code minus 64); a shared bit names
    each check that has it, one of which failed."""
    return tuple(name for name, bit in CHECK_BITS.items() if bits & bit)


@dataclass(frozen=True)
class DevicePluginPod:
    name: str
    ready: bool


@dataclass(frozen=True)
class Validated:
    """The validation Job's verdict on the node (policy/validation.py)."""

    passed: bool
    reason: str


@dataclass(frozen=True)
class GateFacts:
    """What the gate looks at, gathered by the CLI (from the API) or the controller
    (from its caches)."""

    node: str
    ready: bool | None  # the Ready condition: None when Unknown or absent
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, int] = field(default_factory=dict)
    # Its GPUs offered through DRA (the ResourceSlices of the configured drivers).
    devices: tuple[DraDevice, ...] = ()
    # Driver versions of the other nodes of this node's pool: version -> nodes.
    pool_drivers: Mapping[str, int] = field(default_factory=dict)
    # Pods on the node matching healthGate.devicePluginSelector (and namespaces).
    device_plugin_pods: tuple[DevicePluginPod, ...] = ()
    # A driver roll-out of the node's pool (policy/rollout.py): it, not the pool's
    # majority, says which version the node must run.
    rollout: RolloutDriver | None = None
    # The verdict of this recovery's validation Job; None: none was run.
    validation: Validated | None = None


def facts_from_views(
    node: NodeView,
    pods: Sequence[PodView],
    pool_drivers: Mapping[str, int],
    rollout: RolloutDriver | None = None,
) -> GateFacts:
    """The controller's facts: its cached projections of the node, its pods and its
    pool's roll-out."""
    return GateFacts(
        node=node.name,
        ready=node.ready,
        labels=node.labels,
        annotations=node.annotations,
        allocatable=dict(node.allocatable),
        devices=node.devices,
        pool_drivers=dict(pool_drivers),
        device_plugin_pods=tuple(
            DevicePluginPod(p.key, p.ready) for p in pods if p.device_plugin and not p.terminal
        ),
        rollout=rollout,
    )


def evaluate(
    facts: GateFacts, config: Config, now: dt.datetime, since: dt.datetime | None
) -> GateResult:
    """Every check, in order. `since`: when maintenance (or recovery) began; errors and
    diagnostics older than it say nothing about the node now."""
    return GateResult(
        node=facts.node,
        checks=(
            _ready(facts),
            _gpu_count(facts, config),
            _driver(facts, config),
            _driver_upgrade(facts),
            _gpu_errors(facts, since),
            _diagnostics(facts, config, now, since),
            _device_plugin(facts, config),
            _environment(facts, config),
            _validation(facts, config),
        ),
    )


def _ready(facts: GateFacts) -> Check:
    if facts.ready is True:
        return Check(READY, CheckResult.PASS, "the node is Ready")
    if facts.ready is False:
        return Check(READY, CheckResult.FAIL, "the node's Ready condition is False")
    return Check(READY, CheckResult.FAIL, "the node's Ready condition is Unknown or missing")


def _gpu_count(facts: GateFacts, config: Config) -> Check:
    """The GPUs offered as the node should offer them: the expected count, times the
    replicas of a shared GPU (time-slicing, MPS), each MIG profile of the `mixed`
    strategy as GFD counts it, and the MIG layout the MIG manager was asked for."""
    pool = pool_of(facts.labels, config)
    resource = pool_config(pool, config).resource
    expected = expected_gpus(facts.labels, config)
    if expected is None:
        return Check(
            GPU_COUNT,
            CheckResult.SKIPPED,
            f"no expected GPU count: set pools.byName.<pool>.gpusPerNode or the node label "
            f"{config.pools.expected_gpus_label}",
        )
    if facts.devices and not facts.allocatable.get(resource, 0):
        return _dra_count(facts.devices, expected)
    problem = mig_layout_problem(facts.labels, facts.annotations.get(MIG_LAYOUT, ""))
    if problem:
        return Check(GPU_COUNT, CheckResult.FAIL, problem)
    offers = expected_offers(expected, resource, facts.labels, facts.allocatable)
    wrong = [
        f"{facts.allocatable.get(name, 0)} {name} allocatable, expected {want}"
        for name, want in offers.items()
        if facts.allocatable.get(name, 0) != want
    ]
    if wrong:
        return Check(GPU_COUNT, CheckResult.FAIL, "; ".join(wrong))
    how = sharing(facts.labels)
    shown = ", ".join(f"{want} {name}" for name, want in offers.items())
    if how.shared:
        shown += f" ({expected} GPUs x {how.replicas} {how.strategy} replicas)"
    return Check(GPU_COUNT, CheckResult.PASS, f"{shown} allocatable, as expected")


def _dra_count(devices: Sequence[DraDevice], expected: int) -> Check:
    """A DRA node offers its GPUs as devices: the expected count must be there and
    usable (no taint keeping new claims off, the driver's or a DeviceTaintRule's)."""
    if any(d.kind == "mig" for d in devices):
        return _dra_gpus(devices, expected)
    usable, total = dra.usable_count(devices), dra.gpu_count(devices)
    if usable == expected:
        return Check(GPU_COUNT, CheckResult.PASS, f"{usable} DRA GPU devices usable, as expected")
    why = _tainted(devices)
    return Check(
        GPU_COUNT,
        CheckResult.FAIL,
        f"{usable} of {total} DRA GPU devices usable, expected {expected}{why}",
    )


def _dra_gpus(devices: Sequence[DraDevice], expected: int) -> Check:
    """A node with GPUs in MIG mode: the expected count is of physical GPUs
    (gpusPerNode, GFD's gpu.count), so its devices are counted by the GPU they are
    carved from; a GPU is usable when none of its devices is kept from new claims."""
    by_gpu: dict[str, list[DraDevice]] = {}
    for device in devices:
        by_gpu.setdefault(device.gpu_uuid, []).append(device)
    usable = sum(1 for carved in by_gpu.values() if all(d.usable for d in carved))
    partitioned = sum(1 for carved in by_gpu.values() if any(d.kind == "mig" for d in carved))
    how = f"{partitioned} in MIG mode"
    if usable == expected:
        return Check(GPU_COUNT, CheckResult.PASS, f"{usable} DRA GPUs usable ({how}), as expected")
    why = _tainted(devices)
    return Check(
        GPU_COUNT,
        CheckResult.FAIL,
        f"{usable} of {len(by_gpu)} DRA GPUs usable ({how}), expected {expected}{why}",
    )


def _tainted(devices: Sequence[DraDevice]) -> str:
    """ "; tainted: gpu-3 (gpuheal.io/gpu-fault)": the devices kept from new claims and
    by which taints; "" for none."""
    tainted = [f"{d.key.device} ({', '.join(d.fencing)})" for d in devices if d.fencing]
    return f"; tainted: {', '.join(tainted)}" if tainted else ""


def _driver(facts: GateFacts, config: Config) -> Check:
    pool = pool_of(facts.labels, config)
    expected = expected_driver(pool, Counter(facts.pool_drivers).elements(), config)
    have = driver_version(facts.labels, facts.annotations)
    where = "unpooled nodes" if pool == NO_POOL else f"pool {pool}"
    if facts.rollout is not None:
        during = expected_during_rollout(facts.rollout, facts.pool_drivers)
        # A rolled node runs the target; the others, a configured version if any.
        expected = (
            during if facts.rollout.rolled else pool_config(pool, config).driver_version or during
        )
        rolled = "rolled to" if facts.rollout.rolled else "not rolled yet to"
        where = f"{where} ({rolled} {facts.rollout.target})"
    if not expected:
        if have:
            return Check(
                DRIVER,
                CheckResult.SKIPPED,
                f"driver {have}; no version known for {where} to compare",
            )
        return Check(
            DRIVER, CheckResult.SKIPPED, "no driver version known for the node or its pool"
        )
    if not have:
        return Check(
            DRIVER,
            CheckResult.FAIL,
            f"the node reports no driver version; {where} runs {expected}",
        )
    if have != expected:
        return Check(DRIVER, CheckResult.FAIL, f"driver {have}, but {where} runs {expected}")
    return Check(DRIVER, CheckResult.PASS, f"driver {have}, as {where}")


# -- gpu-errors -----------------------------------------------------------------------


def _driver_upgrade(facts: GateFacts) -> Check:
    """gpu-operator's driver upgrade of the node, done (policy/operator.py)."""
    if not facts.labels.get(DRIVER_UPGRADE_STATE):
        return Check(DRIVER_UPGRADE, CheckResult.SKIPPED, "gpu-operator upgrades no driver here")
    state = driver_upgrade(facts.labels)
    if state is None:
        return Check(DRIVER_UPGRADE, CheckResult.PASS, "gpu-operator's driver upgrade is done")
    said = f"{DRIVER_UPGRADE_STATE}={state}"
    if state == UPGRADE_FAILED:
        return Check(
            DRIVER_UPGRADE,
            CheckResult.FAIL,
            f"gpu-operator's driver upgrade of the node failed ({said}): see the driver pod",
        )
    return Check(
        DRIVER_UPGRADE,
        CheckResult.FAIL,
        f"gpu-operator is upgrading the node's driver ({said}): it returns once upgrade-done",
    )


class MalformedError(ValueError):
    """An agent or operator annotation the gate cannot read; its check fails."""


def _time(value: str, key: str) -> dt.datetime:
    parsed = parse_time(value)
    if parsed is None:
        raise MalformedError(f"{key} is not an RFC 3339 time: {value[:64]!r}")
    return parsed


def _count(value: str, key: str) -> int:
    try:
        count = int(value.strip())
    except ValueError:
        raise MalformedError(f"{key} is not a count: {value[:64]!r}") from None
    if count < 0:
        raise MalformedError(f"{key} is negative: {value[:64]!r}")
    return count


@dataclass(frozen=True)
class Baseline:
    xid: int
    ecc: int
    since: str


def _json_object(key: str, value: str) -> dict[str, Any]:
    """An annotation's JSON object; MalformedError naming the annotation otherwise."""
    try:
        raw = json.loads(value)
    except ValueError:
        raise MalformedError(f"{key} is not JSON: {value[:64]!r}") from None
    if not isinstance(raw, dict):
        raise MalformedError(f"{key} is not a JSON object")
    return raw


def parse_baseline(value: str) -> Baseline:
    """MAINTENANCE_BASELINE's JSON {"xid", "ecc", "since"}; MalformedError (a ValueError)."""
    raw = _json_object(MAINTENANCE_BASELINE, value)
    xid, ecc, since = raw.get("xid", 0), raw.get("ecc", 0), raw.get("since", "")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (xid, ecc)):
        raise MalformedError(f"{MAINTENANCE_BASELINE} has no whole xid/ecc counts: {value[:64]!r}")
    if not isinstance(since, str):
        raise MalformedError(f"{MAINTENANCE_BASELINE} has a non-string since")
    return Baseline(xid=xid, ecc=ecc, since=since)


def _gpu_errors(facts: GateFacts, since: dt.datetime | None) -> Check:
    annotations = facts.annotations
    if not any(k in annotations for k in (XID_ERRORS, ECC_ERRORS, COUNTERS_SINCE, LAST_GPU_ERROR)):
        return Check(
            GPU_ERRORS, CheckResult.SKIPPED, "the agent reports no error counters on this node"
        )
    try:
        trouble = _new_errors(annotations, since)
    except MalformedError as err:
        return Check(GPU_ERRORS, CheckResult.FAIL, f"cannot tell: {err}")
    if trouble:
        return Check(GPU_ERRORS, CheckResult.FAIL, trouble)
    after = f" since {iso(since, 'seconds')}" if since is not None else ""
    return Check(GPU_ERRORS, CheckResult.PASS, f"no Xid or uncorrectable ECC error{after}")


def _new_errors(annotations: Mapping[str, str], since: dt.datetime | None) -> str:
    """Why the agent's reports show an error after `since` ("" when they do not)."""
    last_raw = annotations.get(LAST_GPU_ERROR, "")
    last = _time(last_raw, LAST_GPU_ERROR) if last_raw.strip() else None
    xid = _count(annotations.get(XID_ERRORS, "0"), XID_ERRORS)
    ecc = _count(annotations.get(ECC_ERRORS, "0"), ECC_ERRORS)
    counted_raw = annotations.get(COUNTERS_SINCE, "")
    counted = _time(counted_raw, COUNTERS_SINCE) if counted_raw.strip() else None
    counts = f"{xid} Xid and {ecc} uncorrectable ECC errors"
    if since is None:
        # No start to tell new errors from old: only a clean count passes.
        return f"{counts} reported and no start time to tell new from old" if xid or ecc else ""
    when = iso(since, "seconds")
    if last is not None and last > since:
        return f"a GPU error at {iso(last, 'seconds')}, after {when}"
    if counted is None or counted > since:
        # No start of counting, or the counters restarted (agent restart, reboot)
        # after `since`: everything they count may be new.
        span = (
            f"since {iso(counted, 'seconds')}, after {when}"
            if counted
            else f"without {COUNTERS_SINCE}"
        )
        return f"{counts} reported {span}" if xid or ecc else ""
    if MAINTENANCE_BASELINE not in annotations:
        return ""  # counters from before `since`, no baseline: the last error's time decides
    base = parse_baseline(annotations[MAINTENANCE_BASELINE])
    new_xid, new_ecc = max(xid - base.xid, 0), max(ecc - base.ecc, 0)
    if new_xid or new_ecc:
        return (
            f"{new_xid} new Xid and {new_ecc} new uncorrectable ECC errors since {when} "
            f"(counters {xid}/{ecc}, {base.xid}/{base.ecc} at the start)"
        )
    return ""


# -- diagnostics ----------------------------------------------------------------------


def _diagnostics(
    facts: GateFacts, config: Config, now: dt.datetime, since: dt.datetime | None
) -> Check:
    gate = config.health_gate
    value = facts.annotations.get(DIAGNOSTICS)
    required = "healthGate.diagnosticsRequired" if gate.diagnostics_required else "not required"
    if value is None:
        result = CheckResult.FAIL if gate.diagnostics_required else CheckResult.SKIPPED
        return Check(DIAGNOSTICS_CHECK, result, f"no diagnostics result recorded; {required}")
    try:
        outcome, at, tool = parse_diagnostics(value)
    except MalformedError as err:
        return Check(DIAGNOSTICS_CHECK, CheckResult.FAIL, str(err))
    what = f"{tool or 'diagnostics'} {outcome} at {iso(at, 'seconds')}"
    if outcome != "pass":
        return Check(DIAGNOSTICS_CHECK, CheckResult.FAIL, f"{what}: not passing")
    stale = ""
    if (now - at).total_seconds() > gate.diagnostics_max_age_seconds:
        stale = f"older than {gate.diagnostics_max_age_seconds:g}s"
    elif since is not None and at < since:
        stale = f"from before {iso(since, 'seconds')}"
    if not stale:
        return Check(DIAGNOSTICS_CHECK, CheckResult.PASS, what)
    # An old result says nothing about the node now: it counts only when required.
    result = CheckResult.FAIL if gate.diagnostics_required else CheckResult.SKIPPED
    return Check(DIAGNOSTICS_CHECK, result, f"{what}: {stale}; {required}")


def parse_diagnostics(value: str) -> tuple[str, dt.datetime, str]:
    """DIAGNOSTICS's JSON {"result", "time", "tool"}; MalformedError (a ValueError)."""
    raw = _json_object(DIAGNOSTICS, value)
    result, at, tool = raw.get("result"), raw.get("time"), raw.get("tool", "")
    if not isinstance(result, str) or not result:
        raise MalformedError(f"{DIAGNOSTICS} has no result")
    if not isinstance(at, str):
        raise MalformedError(f"{DIAGNOSTICS} has no time")
    return result[:64], _time(at, f"{DIAGNOSTICS} time"), tool[:64] if isinstance(tool, str) else ""


def _device_plugin(facts: GateFacts, config: Config) -> Check:
    pods = facts.device_plugin_pods
    ready = [p.name for p in pods if p.ready]
    if ready:
        return Check(DEVICE_PLUGIN, CheckResult.PASS, f"device-plugin pod {ready[0]} is Ready")
    if pods:
        return Check(
            DEVICE_PLUGIN, CheckResult.FAIL, f"device-plugin pod {pods[0].name} is not Ready"
        )
    selector = ",".join(f"{k}={v}" for k, v in config.health_gate.device_plugin_selector.items())
    if config.health_gate.device_plugin_required:
        return Check(
            DEVICE_PLUGIN,
            CheckResult.FAIL,
            f"no device-plugin pod ({selector}) on the node; healthGate.devicePluginRequired",
        )
    return Check(
        DEVICE_PLUGIN, CheckResult.SKIPPED, f"no device-plugin pod ({selector}); not required"
    )


def _environment(facts: GateFacts, config: Config) -> Check:
    """The agent's start-order facts: a bad one fails; an unknown one (the agent cannot
    see that host file) fails only when healthGate.environmentRequired names it; those
    healthGate.environmentIgnored names are not looked at."""
    gate = config.health_gate
    required = gate.environment_required
    if set(gate.environment_ignored) >= set(ENVIRONMENT_FACTS):
        return Check(ENVIRONMENT, CheckResult.SKIPPED, "healthGate.environmentIgnored: every fact")
    value = facts.annotations.get(NODE_ENVIRONMENT)
    if value is None:
        if required:
            why = f"the agent reports no {NODE_ENVIRONMENT}; healthGate.environmentRequired"
            return Check(ENVIRONMENT, CheckResult.FAIL, why)
        return Check(ENVIRONMENT, CheckResult.SKIPPED, f"the agent reports no {NODE_ENVIRONMENT}")
    try:
        found = {
            n: f for n, f in environment.parse(value).items() if n not in gate.environment_ignored
        }
    except ValueError as err:
        return Check(ENVIRONMENT, CheckResult.FAIL, f"cannot tell: {NODE_ENVIRONMENT}: {err}")
    unknown = environment.Fact(environment.UNKNOWN)
    bad = [environment.describe(n, f) for n, f in found.items() if f.bad]
    bad += [
        f"{name} unknown; healthGate.environmentRequired"
        for name in required
        if found.get(name, unknown).unknown
    ]
    if bad:
        return Check(ENVIRONMENT, CheckResult.FAIL, "; ".join(bad))
    said = ", ".join(environment.describe(n, f) for n, f in found.items())
    return Check(ENVIRONMENT, CheckResult.PASS, said or "no start-order fact reported")


def _validation(facts: GateFacts, config: Config) -> Check:
    verdict = facts.validation
    if verdict is None:
        why = (
            "the controller's recovery runs one"
            if config.health_gate.validation.enabled
            else "healthGate.validation.enabled is false"
        )
        return Check(
            VALIDATION, CheckResult.SKIPPED, f"no validation Job run ({why}; --validate runs one)"
        )
    return Check(
        VALIDATION, CheckResult.PASS if verdict.passed else CheckResult.FAIL, verdict.reason
    )
