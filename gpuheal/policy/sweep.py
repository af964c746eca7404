"""The idle-node sweep: the validation Job, run on GPU nodes that hold no GPU pods,
finds what only an active check finds (silent data corruption, a card that
degrades under load) before a job does.

Each pass the leader (controller/sweep.py) hands this module the fleet as its
caches hold it; it decides, level-triggered from the nodes' own marks
(gpuheal.io/sweep, `SweepMark`), which checks start, which end and how, and
which failed checks are faults still:

- a node is checked when it is idle (a managed, Ready, schedulable GPU node
  with no GPU pod, no open fault, no maintenance, no taint that says it is
  unwell) and its last check ended `sweep.intervalHours` ago or more; the
  longest unchecked first, at most `sweep.maxConcurrent` at a time;
- while its check runs the node carries the sweep's NoSchedule taint, so no
  workload lands on GPUs that are being tested; the Job tolerates it and the
  node's other NoSchedule taints (those GPU pods tolerate anyway);
- the check yields at once, its Job deleted and the taint removed, to a
  pending GPU pod the node could take, to a GPU pod bound there, to a fault,
  a cordon or maintenance: the sweep never delays a workload;
- a check that ran and failed (the Job's verdict, read as the health gate reads
  it, or still running at `sweep.timeoutSeconds`) is a fault of the `sweep`
  source (sources/sweep.py), held until the node boots again or a person
  removes the mark; one that could not run (not schedulable, no pod) is an
  error, said, never a fault.

Pure: the time is passed in.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum

from gpuheal import values
from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.model import (
    SWEEP,
    SWEEP_TAINT,
    TAINT_KEY,
    FaultRecord,
    NodeView,
    PodView,
    Taint,
    fault_record_name,
)
from gpuheal.policy.nodes import gpu_node, in_maintenance
from gpuheal.policy.pools import pool_config, pool_of
from gpuheal.policy.validation import CreateValidationJob, ValidationPod, parse_result
from gpuheal.sources import sweep as source

JOB_PREFIX = "gpuheal-sweep-"
# After a check that yielded or could not run, the node waits this long (or its
# interval, if shorter) before the next: work came, or something is off.
RETRY_AFTER_S = 3600.0
# How a pod ends that is no verdict of its container's (the kubelet's reasons).
_NOT_THE_GPUS = frozenset({"Evicted", "DeadlineExceeded", "OOMKilled", "Preempting"})
# Taints that say a node is unwell or going away: never swept, never tolerated.
_UNWELL_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")


class Result(StrEnum):
    PASSED = "passed"
    FAILED = "failed"  # a fault (sources/sweep.py)
    YIELDED = "yielded"  # to a workload, a fault, a cordon or maintenance
    ERROR = "error"  # could not run: said, not a fault


@dataclass(frozen=True)
class SweepMark:
    """The node's gpuheal.io/sweep: the check running (no `ended`) or the last one."""

    job: str
    started: str
    boot: str = ""  # the node's bootID when the check started
    ended: str = ""
    result: str = ""
    detail: str = ""
    fault: str = ""  # a failed check's fault id

    @property
    def running(self) -> bool:
        return not self.ended

    def encode(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v}, sort_keys=True)


def parse_mark(text: str | None) -> SweepMark | None:
    """The mark, or None when absent or unreadable (then the node counts as never checked)."""
    try:
        raw = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("job"), str):
        return None
    fields = SweepMark.__dataclass_fields__
    return SweepMark(**{k: str(v) for k, v in raw.items() if k in fields})


def job_name(node: str, started: dt.datetime) -> str:
    """One Job per node and check: a valid name (and label value) whatever the node's."""
    return f"{JOB_PREFIX}{values.digest(node)}-{int(started.timestamp())}"


@dataclass(frozen=True)
class PendingPod:
    """A pod no node has been given yet that wants GPUs (the projection keeps no other)."""

    namespace: str
    name: str
    wants: tuple[tuple[str, int], ...] = ()  # GPU resources and counts it asks for
    claims: bool = False  # it asks for devices through DRA
    node_selector: tuple[tuple[str, str], ...] = ()

    def fits(self, node: NodeView) -> bool:
        """The node could take it, as far as GPUs and labels say: taints and
        affinities are not weighed, so the sweep yields when in doubt."""
        if any(node.labels.get(k) != v for k, v in self.node_selector):
            return False
        offered = dict(node.allocatable)
        if self.claims and node.devices:
            return True
        return bool(self.wants) and all(0 < n <= offered.get(r, 0) for r, n in self.wants)


@dataclass(frozen=True)
class Start:
    """Mark and fence the node (one write), then create its Job."""

    node: NodeView
    mark: SweepMark
    job: CreateValidationJob


@dataclass(frozen=True)
class End:
    """Write the ended mark (lifting the fence unless `fenced`), then delete the Job."""

    node: NodeView
    mark: SweepMark
    fenced: bool = False  # a failed check keeps the node out until its fault is recorded


@dataclass(frozen=True)
class Unfence:
    """Lift the sweep's fence of a node whose check ended (its fault now recorded)."""

    node: NodeView


@dataclass(frozen=True)
class Hold:
    """A failed check that is a fault still."""

    node: str
    fault: str
    since: dt.datetime


@dataclass(frozen=True)
class SweepPass:
    starts: tuple[Start, ...] = ()
    ends: tuple[End, ...] = ()
    unfences: tuple[Unfence, ...] = ()
    holds: tuple[Hold, ...] = ()
    running: int = 0  # checks running after this pass's starts and ends
    due: int = 0  # idle nodes due a check that no slot was left for


@dataclass(frozen=True)
class Fleet:
    """What a pass looks at, from the controller's caches."""

    nodes: Sequence[NodeView]
    pods: Mapping[str, Sequence[PodView]]  # live pods bound to each node
    pending: Sequence[PendingPod]
    checks: Mapping[str, ValidationPod]  # the sweep's Jobs' pods, by Job name
    records: Sequence[FaultRecord]
    managed: Callable[[str], bool]
    # The pending pods are watched (False: the sweep was off at the controller's
    # start, so none start, and running ones yield).
    looking: bool = True


def plan(fleet: Fleet, config: Config, now: dt.datetime) -> SweepPass:
    """The pass: ends of running checks, fences to lift, faults to hold, then starts."""
    open_by_node = _open_records(fleet.records)
    marked = _marked(fleet, open_by_node, config, now)
    if not config.sweep.enabled or not fleet.looking:
        return marked
    due = _due(fleet, open_by_node, config, now)
    slots = max(config.sweep.max_concurrent - marked.running, 0)
    starts = tuple(_start(node, config, now) for node in due[:slots])
    return replace(
        marked, starts=starts, running=marked.running + len(starts), due=len(due) - len(starts)
    )


def _marked(
    fleet: Fleet, open_by_node: Mapping[str, frozenset[str]], config: Config, now: dt.datetime
) -> SweepPass:
    """What the nodes' marks call for: running checks that end, failed ones that
    hold, fences to lift once their fault is recorded (or is no more)."""
    ends: list[End] = []
    unfences: list[Unfence] = []
    holds: list[Hold] = []
    running = 0
    for node in fleet.nodes:
        mark = parse_mark(node.annotations.get(SWEEP))
        if mark is None:
            continue
        records = open_by_node.get(node.name, frozenset())
        if mark.running:
            end = _running(node, mark, fleet, records, (config, now))
            running += end is None
            ends += [end] if end is not None else []
            continue
        held = _held(node, mark)
        holds += [held] if held is not None else []
        recorded = fault_record_name(node.name, mark.fault) in records
        if node.taint(SWEEP_TAINT) is not None and (held is None or recorded):
            unfences.append(Unfence(node))
    return SweepPass(
        ends=tuple(ends), unfences=tuple(unfences), holds=tuple(holds), running=running
    )


def _open_records(records: Iterable[FaultRecord]) -> dict[str, frozenset[str]]:
    """Each node's open records, by name."""
    found: dict[str, set[str]] = {}
    for r in records:
        if r.open:
            found.setdefault(r.node, set()).add(r.name)
    return {node: frozenset(names) for node, names in found.items()}


def _held(node: NodeView, mark: SweepMark) -> Hold | None:
    """A failed check's fault holds while the node has not booted since the check."""
    if mark.result != Result.FAILED or not mark.fault:
        return None
    if mark.boot and node.boot_id and node.boot_id != mark.boot:
        return None
    since = parse_time(mark.ended) or parse_time(mark.started)
    return Hold(node.name, mark.fault, since) if since is not None else None


def _running(
    node: NodeView,
    mark: SweepMark,
    fleet: Fleet,
    open_records: frozenset[str],
    at: tuple[Config, dt.datetime],
) -> End | None:
    """A running check's end, or None while it goes on. A result the Job gave wins
    over a yield found in the same pass: a failure is never lost to one."""
    config, now = at
    started = parse_time(mark.started) or now
    verdict = verdict_of(fleet.checks.get(mark.job), (now - started).total_seconds(), config)
    if verdict is not None and verdict[0] in (Result.PASSED, Result.FAILED):
        return _ended(node, mark, verdict[0], f"{mark.job}: {verdict[1]}", now)
    why = _yield_reason(node, fleet, open_records, config)
    if why is None and not (config.sweep.enabled and fleet.looking):
        why = "the sweep is off"
    if why is not None:
        return _ended(node, mark, Result.YIELDED, why, now)
    if verdict is None:
        return None
    return _ended(node, mark, verdict[0], f"{mark.job}: {verdict[1]}", now)


def _ended(node: NodeView, mark: SweepMark, result: Result, detail: str, now: dt.datetime) -> End:
    fault = source.fault_id(now) if result is Result.FAILED else ""
    ended = replace(
        mark,
        ended=iso(now, "seconds"),
        result=result.value,
        detail=values.text(detail, values.DETAIL_MAX),
        fault=fault,
    )
    return End(node, ended, fenced=result is Result.FAILED)


def verdict_of(
    pod: ValidationPod | None, elapsed: float, config: Config
) -> tuple[Result, str] | None:
    """The check's result from its pod, as the health gate reads a validation's, or
    None while it may still finish. Only a check that ran can fail: one that could
    not be placed or never started is an error."""
    gate = config.health_gate.validation
    timeout = config.sweep.timeout_seconds
    if pod is not None and pod.phase in ("Succeeded", "Failed"):
        return _ended_pod(pod)
    if pod is not None and pod.phase == "Running" and elapsed >= timeout:
        return Result.FAILED, f"still running after {timeout:g}s: a hang on the GPUs"
    if elapsed < min(gate.schedule_timeout_seconds, timeout) or (
        pod is not None and not pod.unschedulable and elapsed < timeout
    ):
        return None
    if pod is None:
        return Result.ERROR, f"no pod after {elapsed:g}s"
    if pod.unschedulable:
        return Result.ERROR, f"its pod cannot be placed: {pod.unschedulable}"
    waiting = f" ({pod.waiting})" if pod.waiting else ""
    return Result.ERROR, f"its pod did not start in {timeout:g}s: {pod.phase or 'Pending'}{waiting}"


def _ended_pod(pod: ValidationPod) -> tuple[Result, str]:
    """The verdict of a check whose pod has ended."""
    if pod.phase == "Failed" and (pod.exit_code is None or pod.reason in _NOT_THE_GPUS):
        # Evicted by its kubelet, past its deadline, out of memory: the check did not
        # finish, which says nothing of the GPUs (the gate, returning a node, counts
        # this as a failure; the sweep, taking a healthy one out, must not).
        return Result.ERROR, f"its pod ended before the check did ({pod.reason or 'no exit code'})"
    code = pod.exit_code if pod.exit_code is not None else 0
    judged = parse_result(code, pod.message, pod.reason or pod.phase)
    return (Result.PASSED if judged.passed else Result.FAILED, judged.reason)


def _yield_reason(
    node: NodeView, fleet: Fleet, open_records: frozenset[str], config: Config
) -> str | None:
    """Why a running check must stop now, or None."""
    if open_records:
        return f"a fault on the node ({sorted(open_records)[0]})"
    busy = _workload(fleet.pods.get(node.name, ()))
    if busy is not None:
        return f"pod {busy.namespace}/{busy.name} was placed on the node"
    waiting = next((p for p in fleet.pending if p.fits(node)), None)
    if waiting is not None:
        return f"pending pod {waiting.namespace}/{waiting.name} wants the node's GPUs"
    return _taken_out(node, fleet, config)


def _taken_out(node: NodeView, fleet: Fleet, config: Config) -> str | None:
    """Why the node is no longer one to check, or None."""
    if node.unschedulable or in_maintenance(node.labels) or node.taint(TAINT_KEY):
        return "the node was cordoned or taken out"
    if node.taint(config.maintenance.taint_key) or not fleet.managed(node.name):
        return "the node was taken out or is no longer managed"
    if node.ready is not True:
        # Its kubelet is gone: the Job's pod would read Running to the timeout and
        # fail there, a fault made of a node problem the node's lifecycle handles.
        return "the node is not Ready"
    return None


def _workload(pods: Iterable[PodView]) -> PodView | None:
    """A GPU pod on the node that is not one of gpuheal's checks."""
    return next(
        (p for p in pods if p.gpu and not p.canary and not _ours(p.owner)),
        None,
    )


def _ours(owner: str) -> bool:
    kind, _, name = owner.partition("/")
    return kind == "Job" and name.startswith(("gpuheal-validate-", JOB_PREFIX))


def _due(
    fleet: Fleet, open_by_node: Mapping[str, frozenset[str]], config: Config, now: dt.datetime
) -> list[NodeView]:
    """Idle nodes due a check, the longest unchecked first."""
    found: list[tuple[str, str, NodeView]] = []
    for node in fleet.nodes:
        mark = parse_mark(node.annotations.get(SWEEP))
        if mark is not None and mark.running:
            continue
        if not _idle(node, fleet, open_by_node, config) or not _is_due(node, mark, config, now):
            continue
        found.append((mark.ended if mark else "", node.name, node))
    return [node for _, _, node in sorted(found, key=lambda f: (f[0], f[1]))]


def _is_due(node: NodeView, mark: SweepMark | None, config: Config, now: dt.datetime) -> bool:
    if mark is None:
        return True
    if _held(node, mark) is not None:
        return False  # a fault still: the gate, not the sweep, proves the node again
    ended = parse_time(mark.ended)
    if ended is None:
        return True
    every = config.sweep.interval_hours * 3600.0
    if mark.result in (Result.YIELDED, Result.ERROR):
        every = min(every, RETRY_AFTER_S)
    return (now - ended).total_seconds() >= every


def _idle(
    node: NodeView,
    fleet: Fleet,
    open_by_node: Mapping[str, frozenset[str]],
    config: Config,
) -> bool:
    """A managed, Ready, schedulable GPU node of a swept pool, with GPUs to test,
    nothing wrong said of it and nothing that wants it."""
    pools = config.sweep.pools
    resource = pool_config(pool_of(node.labels, config), config).resource
    return (
        gpu_node(node.labels, node.gpus, config)
        and fleet.managed(node.name)
        and (not pools or pool_of(node.labels, config) in pools)
        and node.ready is True
        and not node.unschedulable
        and not in_maintenance(node.labels)
        and dict(node.allocatable).get(resource, 0) > 0
        and node.name not in open_by_node
        and not any(_unwell(t, config) for t in node.taints)
        and not any(p.gpu for p in fleet.pods.get(node.name, ()))
        and not any(p.fits(node) for p in fleet.pending)
    )


def _unwell(taint: Taint, config: Config) -> bool:
    """A taint that keeps the node from being swept (and is never tolerated)."""
    return (
        taint.effect == "NoExecute"
        or taint.key in (TAINT_KEY, SWEEP_TAINT, config.maintenance.taint_key)
        or taint.key.startswith(_UNWELL_PREFIXES)
    )


def _start(node: NodeView, config: Config, now: dt.datetime) -> Start:
    pool = pool_of(node.labels, config)
    resource = pool_config(pool, config).resource
    name = job_name(node.name, now)
    job = CreateValidationJob(
        node=node.name,
        pool=pool,
        name=name,
        record="",
        resource=resource,
        gpus=dict(node.allocatable).get(resource, 0),
        dcgm_level=config.sweep.dcgm_level,
        timeout_seconds=config.sweep.timeout_seconds,
        tolerate=tuple(t for t in node.taints if t.effect != "NoExecute"),
        sweep=True,
    )
    mark = SweepMark(job=name, started=iso(now, "seconds"), boot=node.boot_id)
    return Start(node, mark, job)
