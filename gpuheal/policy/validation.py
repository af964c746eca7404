"""Validation: a Job on a recovered node that runs its GPUs before it may return.

The other gate checks read what others report; this one proves the GPUs work
(DCGM's diagnostic and, on multi-GPU nodes, an NCCL all-reduce). The controller's
recovery starts one Job per attempt, named from the fault record and the attempt
so a rerun finds its own Job (409) instead of making a second; the Job's pod
reports in its termination message, a JSON summary:

    {"result": "pass" | "fail", "tool": "dcgmi-diag", "detail": "..."}

Anything else (no message, not JSON, a pass with a non-zero exit) fails with a
sentence saying what was wrong. A pod the scheduler cannot place, or a Job with
no result by healthGate.validation.timeoutSeconds, fails too. Each attempt is
written in the record (validation-start, then -passed or -failed with why); a
failed attempt is retried after retrySeconds, the node held meanwhile.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuheal import values
from gpuheal.clock import iso, parse_time
from gpuheal.config import Config, PoolValidationConfig, ValidationConfig
from gpuheal.model import (
    NODE_LABEL,
    RECORD_ANNOTATION,
    SWEEP_TAINT,
    TAINT_KEY,
    ActionEntry,
    FaultRecord,
    NodeView,
    Taint,
)
from gpuheal.policy.gate import Validated
from gpuheal.policy.pools import pool_config, pool_of
from gpuheal.policy.validation_script import SCRIPT
from gpuheal.vocabulary import Entry, Reason

# On the Job and its pod: the controller watches the pods by this label.
VALIDATION_LABEL = "gpuheal.io/validation"
# On the pod: the Job's name (the pod's own name is the Job controller's).
VALIDATION_JOB_LABEL = "gpuheal.io/validation-job"
# On the idle-node sweep's Jobs and pods (policy/sweep.py), beside VALIDATION_LABEL.
SWEEP_LABEL = "gpuheal.io/sweep"
# On the Job and its pod: the node's full name (a label holds 63 characters, a
# node name 253, and an unscheduled pod has no spec.nodeName yet).
NODE_ANNOTATION = "gpuheal.io/node"

JOB_PREFIX = "gpuheal-validate-"
CONTAINER = "validate"
JOB_DEADLINE_GRACE_S = 60
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

MESSAGE_SHOWN = 120  # characters of an unreadable termination message quoted back

# The built-in test (healthGate.validation.command empty): the GPUs the container sees,
# DCGM's diagnostic at the configured level read from its JSON, then, on a multi-GPU
# node with a threshold, nccl-tests' all_reduce_perf against it. It writes the summary
# the gate reads. POSIX sh and awk (the image need not have Python): policy/
# validation_script.py, which says what it checks and why.
DEFAULT_SCRIPT = SCRIPT


def job_name(record: str, attempt: int) -> str:
    """One Job per record and attempt: a restarted controller (or a rerun of the same
    pass) asks for the same name and finds its Job. A valid name whatever the node's."""
    return f"{JOB_PREFIX}{values.digest(record)}-{attempt}"


@dataclass(frozen=True)
class ValidationPod:
    """One of our validation Jobs' pods, finished ones included (the projection)."""

    name: str
    job: str
    node: str
    phase: str
    # The scheduler's message while PodScheduled is False for reason Unschedulable.
    unschedulable: str = ""
    # The container's end: exit code, termination message, reason (Error, OOMKilled).
    exit_code: int | None = None
    message: str = ""
    reason: str = ""
    # Why the container has not started (ErrImagePull: ...), for a timeout's reason.
    waiting: str = ""


@dataclass(frozen=True)
class CreateValidationJob:
    node: str
    pool: str
    name: str
    record: str  # the fault record the gate's Job proves ("" for the sweep's)
    resource: str
    gpus: int
    # The idle-node sweep's (policy/sweep.py): its DCGM level and timeout over the
    # gate's, the node's other taints it tolerates, and its own label.
    dcgm_level: int | None = None
    timeout_seconds: float | None = None
    tolerate: tuple[Taint, ...] = ()
    sweep: bool = False


@dataclass(frozen=True)
class DeleteValidationJob:
    name: str


@dataclass(frozen=True)
class Run:
    """What one node's Job runs: its pool's settings over the fleet's."""

    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]


def run_for(pool: str, gpus: int, cfg: ValidationConfig) -> Run:
    over = cfg.by_pool.get(pool, PoolValidationConfig())
    level = over.dcgm_level if over.dcgm_level is not None else cfg.dcgm_level
    nccl = (
        over.nccl_min_bus_bandwidth_gbps
        if over.nccl_min_bus_bandwidth_gbps is not None
        else cfg.nccl_min_bus_bandwidth_gbps
    )
    command = over.command if over.command is not None else cfg.command
    env = {
        "GPUHEAL_DCGM_LEVEL": str(level),
        "GPUHEAL_GPUS": str(gpus),
        "GPUHEAL_NCCL_MIN_BUSBW_GBPS": f"{nccl:g}",
        **cfg.env,
        **over.env,
    }
    return Run(
        image=over.image or cfg.image,
        command=command or ("/bin/sh", "-c", DEFAULT_SCRIPT),
        env=env,
    )


def job_manifest(action: CreateValidationJob, config: Config) -> dict[str, Any]:
    """The Job: pinned to the node by the scheduler (so a pod that cannot go there
    says why), tolerating our quarantine and maintenance taints and the cordon,
    holding every GPU of the node, run once, ended by the timeout."""
    cfg = config.health_gate.validation
    name, node, gpus = action.name, action.node, action.gpus
    run = run_for(action.pool, gpus, cfg)
    if action.dcgm_level is not None:
        run = replace(run, env={**run.env, "GPUHEAL_DCGM_LEVEL": str(action.dcgm_level)})
    timeout = action.timeout_seconds if action.timeout_seconds is not None else cfg.timeout_seconds
    marks = {VALIDATION_LABEL: "true", NODE_LABEL: values.node_label(node)}
    marks |= {SWEEP_LABEL: "true"} if action.sweep else {}
    notes = {NODE_ANNOTATION: node} | ({RECORD_ANNOTATION: action.record} if action.record else {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": cfg.namespace,
            "labels": marks,
            "annotations": notes,
        },
        "spec": {
            "backoffLimit": 0,
            # A backstop should the controller be away: it judges (and deletes) first.
            "activeDeadlineSeconds": int(timeout) + JOB_DEADLINE_GRACE_S,
            "ttlSecondsAfterFinished": cfg.ttl_seconds_after_finished,
            "template": {
                "metadata": {
                    "labels": {**marks, VALIDATION_JOB_LABEL: name},
                    "annotations": notes,
                },
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchFields": [
                                            {
                                                "key": "metadata.name",
                                                "operator": "In",
                                                "values": [node],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "tolerations": _tolerations(action, config),
                    "containers": [
                        {
                            "name": CONTAINER,
                            "image": run.image,
                            "command": list(run.command),
                            "env": [{"name": k, "value": v} for k, v in sorted(run.env.items())],
                            "resources": {"limits": {action.resource: str(gpus)}},
                            "terminationMessagePolicy": "File",
                        }
                    ],
                },
            },
        },
    }


def _tolerations(action: CreateValidationJob, config: Config) -> list[dict[str, str]]:
    """Ours, the maintenance taint and the cordon; the sweep's Job also its own fence
    and the node's other taints as they are (those its GPU pods tolerate)."""
    found = [
        {"key": TAINT_KEY, "operator": "Exists"},
        {"key": config.maintenance.taint_key, "operator": "Exists"},
        {"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
    ]
    if action.sweep:
        found.append({"key": SWEEP_TAINT, "operator": "Exists", "effect": "NoSchedule"})
    for t in action.tolerate:
        if t.key in (TAINT_KEY, SWEEP_TAINT, config.maintenance.taint_key):
            continue
        said = {"key": t.key, "operator": "Equal", "value": t.value} if t.value else {}
        found.append((said or {"key": t.key, "operator": "Exists"}) | {"effect": t.effect})
    return found


def parse_result(exit_code: int, message: str, reason: str = "") -> Validated:  # noqa: PLR0911 -- one return per way a message is wrong
    """The pod's end -> pass or fail, with a sentence. Only a JSON summary saying
    "pass" from a container that exited 0 passes."""
    text = message.strip()
    ended = f"exited {exit_code}" + (f" ({reason})" if reason and reason != "Completed" else "")
    if not text:
        return Validated(
            False, f"the validation {ended} without a result in its termination message"
        )
    try:
        raw = json.loads(text)
    except ValueError:
        shown = values.text(text, MESSAGE_SHOWN)
        return Validated(
            False, f"the validation {ended}; its termination message is not JSON: {shown!r}"
        )
    if not isinstance(raw, dict):
        return Validated(
            False, f"the validation {ended}; its termination message is not a JSON object"
        )
    result, tool, detail = raw.get("result"), raw.get("tool"), raw.get("detail")
    tool = values.text(tool, 64) if isinstance(tool, str) and tool else "validation"
    said = f"{tool}: {values.text(detail, 512)}" if isinstance(detail, str) and detail else tool
    if result == "pass" and exit_code == 0:
        return Validated(True, f"{said}: pass")
    if result == "pass":
        return Validated(False, f"{said}: said pass but {ended}")
    if result == "fail":
        return Validated(False, f"{said}: fail ({ended})")
    return Validated(False, f"the validation {ended}; its result is {result!r}, not pass or fail")


def judge(pod: ValidationPod | None, elapsed: float, cfg: ValidationConfig) -> Validated | None:
    """The attempt's verdict, or None while it may still finish. A pod the scheduler
    cannot place gets scheduleTimeoutSeconds: a taint may linger a moment (not-ready
    after a reboot) and the scheduler tries again when the node changes."""
    if pod is not None and pod.phase in ("Succeeded", "Failed"):
        code = pod.exit_code
        if code is None:  # killed before its container ran (deadline, eviction)
            code = 0 if pod.phase == "Succeeded" else 1
        return parse_result(code, pod.message, pod.reason or pod.phase)
    if pod is not None and pod.unschedulable and elapsed >= cfg.schedule_timeout_seconds:
        return Validated(
            False,
            f"the validation pod cannot start after {cfg.schedule_timeout_seconds:g}s: "
            f"{pod.unschedulable}",
        )
    if elapsed < cfg.timeout_seconds:
        return None
    if pod is None:
        state = "no pod"
    elif pod.unschedulable:
        state = f"its pod cannot start: {pod.unschedulable}"
    else:
        state = f"its pod {pod.phase or 'Pending'}" + (f" ({pod.waiting})" if pod.waiting else "")
    return Validated(False, f"timed out after {cfg.timeout_seconds:g}s without a result: {state}")


def deadline(pod: ValidationPod | None, cfg: ValidationConfig) -> float:
    """Seconds after its start when the attempt is judged, whatever its pod does."""
    if pod is not None and pod.unschedulable:
        return min(cfg.timeout_seconds, cfg.schedule_timeout_seconds)
    return cfg.timeout_seconds


@dataclass(frozen=True)
class ValidationStep:
    """One look at a record's validation: the verdict (None: not yet, the node waits),
    what to do, the record's new entries and the Events (reason, note, warning)."""

    verdict: Validated | None
    jobs: tuple[CreateValidationJob | DeleteValidationJob, ...] = ()
    entries: tuple[ActionEntry, ...] = ()
    events: tuple[tuple[str, str, bool], ...] = ()
    requeue_after: float | None = None
    job: str = ""


def _entry(now: dt.datetime, action: str, result: str, detail: str) -> ActionEntry:
    return ActionEntry(
        time=iso(now), action=action, result=result, detail=values.text(detail, values.DETAIL_MAX)
    )


def _this_recovery(record: FaultRecord) -> Sequence[ActionEntry]:
    """The record's entries since its recovery last began: a new recovery validates afresh."""
    entries = list(record.actions)
    starts = [i for i, a in enumerate(entries) if a.action == Entry.RECOVERING]
    return entries[starts[-1] + 1 :] if starts else entries


@dataclass(frozen=True)
class _Attempt:
    last: ActionEntry | None
    number: int  # of the record's attempts so far


def _attempt(record: FaultRecord) -> _Attempt:
    ours = (Entry.VALIDATION_START, Entry.VALIDATION_PASSED, Entry.VALIDATION_FAILED)
    last = next((a for a in reversed(_this_recovery(record)) if a.action in ours), None)
    return _Attempt(last, sum(1 for a in record.actions if a.action == Entry.VALIDATION_START))


def step(
    record: FaultRecord,
    node: NodeView,
    pods: Mapping[str, ValidationPod],
    config: Config,
    now: dt.datetime,
) -> ValidationStep:
    """The record's validation, level-triggered from its entries and the Job's pod
    (`pods`: the node's validation pods by Job name)."""
    cfg = config.health_gate.validation
    attempt = _attempt(record)
    last = attempt.last
    at = (parse_time(last.time) if last else None) or now
    elapsed = (now - at).total_seconds()
    if last is not None and last.action == Entry.VALIDATION_PASSED:
        return ValidationStep(Validated(True, last.detail))
    if last is not None and last.action == Entry.VALIDATION_FAILED and elapsed < cfg.retry_seconds:
        return ValidationStep(
            Validated(False, last.detail), requeue_after=cfg.retry_seconds - elapsed
        )
    if last is None or last.action == Entry.VALIDATION_FAILED:
        started = _start(record, node, attempt.number + 1, config, now)
        pod = pods.get(started.job)
        if started.verdict is not None or pod is None:
            return started
        # The attempt's Job was there already (made just before a restart): its pod may
        # have finished meanwhile, and no event will come again to say so.
        done = _judged(record, started.job, pod, elapsed=0.0, cfg=cfg, now=now)
        if done.verdict is None:
            return started
        return replace(
            done,
            jobs=(*started.jobs, *done.jobs),
            entries=(*started.entries, *done.entries),
            events=(*started.events, *done.events),
        )
    name = last.detail.split(" ", 1)[0]
    return _judged(record, name, pods.get(name), elapsed=elapsed, cfg=cfg, now=now)


def _judged(
    record: FaultRecord,
    name: str,
    pod: ValidationPod | None,
    *,
    elapsed: float,
    cfg: ValidationConfig,
    now: dt.datetime,
) -> ValidationStep:
    """A started attempt: its verdict recorded and its Job deleted, or a wait."""
    verdict = judge(pod, elapsed, cfg)
    if verdict is None:
        return ValidationStep(None, requeue_after=max(deadline(pod, cfg) - elapsed, 0.1), job=name)
    detail = f"{name}: {verdict.reason}"
    if verdict.passed:
        return ValidationStep(
            Validated(True, detail),
            jobs=(DeleteValidationJob(name),),
            entries=(_entry(now, Entry.VALIDATION_PASSED, "ok", detail),),
            events=(
                (Reason.VALIDATION_PASSED, f"fault {record.fault_id}: validation {detail}", False),
            ),
            job=name,
        )
    note = f"fault {record.fault_id}: health gate failed, node stays tainted; validation {detail}"
    return ValidationStep(
        Validated(False, detail),
        jobs=(DeleteValidationJob(name),),
        entries=(_entry(now, Entry.VALIDATION_FAILED, "failed", detail),),
        events=((Reason.GATE_FAILED, note, True),),
        requeue_after=cfg.retry_seconds,
        job=name,
    )


def _start(
    record: FaultRecord, node: NodeView, attempt: int, config: Config, now: dt.datetime
) -> ValidationStep:
    cfg = config.health_gate.validation
    pool = pool_of(node.labels, config)
    resource = pool_config(pool, config).resource
    gpus = dict(node.allocatable).get(resource, 0)
    name = job_name(record.name, attempt)
    if gpus <= 0:
        detail = f"{name}: not started: the node offers no {resource} to validate"
        return ValidationStep(
            Validated(False, detail),
            entries=(_entry(now, Entry.VALIDATION_FAILED, "failed", detail),),
            events=((Reason.GATE_FAILED, f"fault {record.fault_id}: validation {detail}", True),),
            requeue_after=cfg.retry_seconds,
        )
    return ValidationStep(
        None,
        jobs=(CreateValidationJob(node.name, pool, name, record.name, resource, gpus),),
        entries=(_entry(now, Entry.VALIDATION_START, "ok", f"{name} on {gpus} {resource}"),),
        events=(
            (
                Reason.VALIDATION_STARTED,
                f"fault {record.fault_id}: validation Job {cfg.namespace}/{name} started "
                f"on {gpus} {resource}",
                False,
            ),
        ),
        requeue_after=cfg.timeout_seconds,
        job=name,
    )
