"""The validation Job's pure part: its name, its manifest, reading its result, and
the recovery's steps from the record's entries and the Job's pod."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpuheal import values
from gpuheal.clock import iso
from gpuheal.config import Config, HealthGateConfig, PoolValidationConfig, ValidationConfig
from gpuheal.model import (
    TAINT_KEY,
    ActionEntry,
    Condition,
    FaultRecord,
    NodeView,
    Phase,
    Taint,
    fault_record_name,
)
from gpuheal.policy.actions import NodeState, RemoveTaint
from gpuheal.policy.gate import Validated
from gpuheal.policy.plan import plan
from gpuheal.policy.validation import (
    CreateValidationJob,
    DeleteValidationJob,
    ValidationPod,
    job_manifest,
    job_name,
    parse_result,
    run_for,
    step,
)
from gpuheal.values import taint_value
from gpuheal.vocabulary import Entry, Reason
from tests.corpus import EKS_NODES, FQDN_253
from tests.helpers import NO_GUARD

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)
NODE = EKS_NODES[0]
FAULT = f"{NODE}-20261129T115959Z-4f1c2a"
VALIDATION = ValidationConfig(enabled=True, timeout_seconds=600, retry_seconds=3600)
CONFIG = Config(
    breaker_max_nodes=100,
    breaker_max_percent=100,
    recovery_window_seconds=60,
    health_gate=HealthGateConfig(validation=VALIDATION),
    autoscalers=NO_GUARD,  # its actions are tests/unit/test_policy_disruption.py's
)
PASS = json.dumps({"result": "pass", "tool": "dcgmi-diag", "detail": "level 2: all tests pass"})
FAIL = json.dumps({"result": "fail", "tool": "dcgmi-diag", "detail": "Memory: GPU 3 failed"})


def node(name: str = NODE, gpus: int = 8) -> NodeView:
    return NodeView(
        name=name,
        resource_version="1",
        labels={"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "H100"},
        gpus=gpus,
        allocatable=(("nvidia.com/gpu", gpus),),
        conditions=(Condition("Ready", "True"),),
        taints=(Taint(TAINT_KEY, "NoSchedule", taint_value(FAULT)),),
    )


def entry(action: str, at: dt.datetime, detail: str = "", result: str = "ok") -> ActionEntry:
    return ActionEntry(time=iso(at), action=action, result=result, detail=detail)


def recovering(*entries: ActionEntry, name: str = NODE) -> FaultRecord:
    began = NOW - dt.timedelta(seconds=120)
    return FaultRecord(
        name=fault_record_name(name, FAULT),
        node=name,
        fault_id=FAULT,
        phase=Phase.RECOVERING,
        recovering_since=iso(began),
        actions=(entry("recovering", began), *entries),
    )


def pod(job: str, phase: str = "Running", **kw: Any) -> ValidationPod:
    return ValidationPod(name=f"{job}-x7k2q", job=job, node=NODE, phase=phase, **kw)


RECORD = recovering()
FIRST = job_name(RECORD.name, 1)
STARTED = entry(
    Entry.VALIDATION_START, NOW - dt.timedelta(seconds=30), f"{FIRST} on 8 nvidia.com/gpu"
)


# -- the name ----------------------------------------------------------------------


def test_job_names_are_valid_short_and_one_per_record_and_attempt() -> None:
    for name in (NODE, FQDN_253):
        record = fault_record_name(name, FAULT)
        job = job_name(record, 1)
        # A Job's name becomes its pods' job-name label: at most 63 characters.
        assert values.is_subdomain(job) and len(job) <= values.LABEL_VALUE_MAX, job
        assert job == job_name(record, 1)  # a rerun asks for the same Job
        assert job != job_name(record, 2)
    assert job_name(fault_record_name(NODE, FAULT), 1) != job_name(
        fault_record_name(FQDN_253, FAULT), 1
    )


# -- the manifest ------------------------------------------------------------------


def test_the_job_is_pinned_tolerant_holds_every_gpu_and_runs_once() -> None:
    maintenance = replace(CONFIG.maintenance, taint_key="example.com/maintenance")
    config = replace(CONFIG, maintenance=maintenance)
    action = CreateValidationJob(FQDN_253, "H100", FIRST, RECORD.name, "nvidia.com/gpu", 8)
    job = job_manifest(action, config)
    meta, spec = job["metadata"], job["spec"]
    assert meta["name"] == FIRST and meta["namespace"] == VALIDATION.namespace
    assert meta["annotations"]["gpuheal.io/node"] == FQDN_253
    assert all(values.is_label_value(v) for v in meta["labels"].values())
    assert spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] == 660  # the controller's timeout comes first
    assert spec["ttlSecondsAfterFinished"] == VALIDATION.ttl_seconds_after_finished
    template = spec["template"]
    assert template["metadata"]["labels"]["gpuheal.io/validation-job"] == FIRST
    pod_spec = template["spec"]
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [FQDN_253]}]}
    ]
    tolerated = {t["key"] for t in pod_spec["tolerations"]}
    assert tolerated == {TAINT_KEY, "example.com/maintenance", "node.kubernetes.io/unschedulable"}
    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec["automountServiceAccountToken"] is False
    (container,) = pod_spec["containers"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert container["command"][:2] == ["/bin/sh", "-c"]
    assert "dcgmi diag" in container["command"][2]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["GPUHEAL_DCGM_LEVEL"] == "2" and env["GPUHEAL_GPUS"] == "8"


def test_a_pool_overrides_the_fleets_image_command_level_threshold_and_env() -> None:
    cfg = replace(
        VALIDATION,
        env={"NCCL_DEBUG": "WARN", "SITE": "a"},
        by_pool={
            "H100": PoolValidationConfig(
                image="registry.example.com/gpu-burn:2",
                dcgm_level=3,
                nccl_min_bus_bandwidth_gbps=350,
                env={"SITE": "b"},
            ),
            "L4": PoolValidationConfig(command=("/validate", "--quick")),
        },
    )
    h100 = run_for("H100", 8, cfg)
    assert h100.image == "registry.example.com/gpu-burn:2"
    assert h100.env["GPUHEAL_DCGM_LEVEL"] == "3"
    assert h100.env["GPUHEAL_NCCL_MIN_BUSBW_GBPS"] == "350"
    assert h100.env["SITE"] == "b" and h100.env["NCCL_DEBUG"] == "WARN"
    l4 = run_for("L4", 1, cfg)
    assert l4.image == cfg.image and l4.command == ("/validate", "--quick")
    assert l4.env["GPUHEAL_NCCL_MIN_BUSBW_GBPS"] == "0"


# -- the result ----------------------------------------------------------------------


def test_a_json_pass_from_a_clean_exit_passes() -> None:
    verdict = parse_result(0, PASS)
    assert verdict.passed and verdict.reason == "dcgmi-diag: level 2: all tests pass: pass"


def test_a_json_fail_fails_with_the_tools_detail() -> None:
    verdict = parse_result(1, FAIL, "Error")
    assert not verdict.passed
    assert verdict.reason == "dcgmi-diag: Memory: GPU 3 failed: fail (exited 1 (Error))"


def test_malformed_or_missing_results_fail_saying_what_was_wrong() -> None:
    cases = {
        (0, ""): "exited 0 without a result in its termination message",
        (137, ""): "exited 137 (OOMKilled) without a result",
        (0, "Diagnostic: PASS"): "its termination message is not JSON: 'Diagnostic: PASS'",
        (0, '{"result": "pass"'): "is not JSON",
        (0, '["pass"]'): "is not a JSON object",
        (0, '{"result": "ok"}'): "its result is 'ok', not pass or fail",
        (2, PASS): "said pass but exited 2",
    }
    for (code, message), said in cases.items():
        reason = {0: "Completed", 137: "OOMKilled"}.get(code, "Error")
        verdict = parse_result(code, message, reason)
        assert not verdict.passed and said in verdict.reason, (code, message, verdict)


@given(st.integers(-1, 255), st.text(max_size=300))
def test_any_message_is_read_without_raising_and_passes_only_as_documented(
    code: int, message: str
) -> None:
    verdict = parse_result(code, message)
    assert verdict.reason
    if verdict.passed:
        assert code == 0 and json.loads(message)["result"] == "pass"


# -- the steps -----------------------------------------------------------------------


def test_the_first_look_starts_attempt_one_and_waits() -> None:
    first = step(RECORD, node(), {}, CONFIG, NOW)
    assert first.verdict is None
    assert first.jobs == (
        CreateValidationJob(NODE, "H100", FIRST, RECORD.name, "nvidia.com/gpu", 8),
    )
    (started,) = first.entries
    assert (
        started.action == Entry.VALIDATION_START
        and started.detail == f"{FIRST} on 8 nvidia.com/gpu"
    )
    assert [e[0] for e in first.events] == [Reason.VALIDATION_STARTED]
    assert first.requeue_after == VALIDATION.timeout_seconds


def test_a_running_job_is_waited_for_without_a_write() -> None:
    record = recovering(STARTED)
    for pods in ({}, {FIRST: pod(FIRST)}):
        waiting = step(record, node(), pods, CONFIG, NOW)
        assert waiting.verdict is None and not (waiting.jobs or waiting.entries or waiting.events)
        assert waiting.requeue_after == 570


def test_a_finished_job_is_judged_recorded_and_deleted() -> None:
    record = recovering(STARTED)
    passed = step(
        record, node(), {FIRST: pod(FIRST, "Succeeded", exit_code=0, message=PASS)}, CONFIG, NOW
    )
    assert passed.verdict is not None and passed.verdict.passed
    assert passed.jobs == (DeleteValidationJob(FIRST),)
    assert [e.action for e in passed.entries] == [Entry.VALIDATION_PASSED]
    assert [e[0] for e in passed.events] == [Reason.VALIDATION_PASSED]
    failed = step(
        record, node(), {FIRST: pod(FIRST, "Failed", exit_code=1, message=FAIL)}, CONFIG, NOW
    )
    assert failed.verdict is not None and not failed.verdict.passed
    assert failed.jobs == (DeleteValidationJob(FIRST),)
    (said,) = failed.entries
    assert said.action == Entry.VALIDATION_FAILED and said.result == "failed"
    assert said.detail.startswith(f"{FIRST}: dcgmi-diag: Memory: GPU 3 failed")
    (event,) = failed.events
    assert event[0] == Reason.GATE_FAILED and event[2] is True and "GPU 3 failed" in event[1]
    assert failed.requeue_after == VALIDATION.retry_seconds


def test_no_result_by_the_timeout_fails_and_says_what_the_pod_was_doing() -> None:
    late = NOW + dt.timedelta(seconds=600)
    record = recovering(STARTED)
    cases = {
        "no pod": {},
        "its pod Pending (ErrImagePull: pull access denied)": {
            FIRST: pod(FIRST, "Pending", waiting="ErrImagePull: pull access denied")
        },
        "its pod Running": {FIRST: pod(FIRST)},
    }
    for said, pods in cases.items():
        timed_out = step(record, node(), pods, CONFIG, late)
        assert timed_out.verdict is not None and not timed_out.verdict.passed
        assert f"timed out after 600s without a result: {said}" in timed_out.verdict.reason
        assert timed_out.jobs == (DeleteValidationJob(FIRST),)


def test_an_unschedulable_pod_gets_the_schedule_timeout_then_fails_saying_why() -> None:
    why = "0/12 nodes are available: 1 node(s) had untolerated taint(s)."
    stuck = {FIRST: pod(FIRST, "Pending", unschedulable=why)}
    record = recovering(STARTED)
    early = step(record, node(), stuck, CONFIG, NOW)
    assert early.verdict is None and early.requeue_after == 270  # 300 s from its start
    late = step(record, node(), stuck, CONFIG, NOW + dt.timedelta(seconds=270))
    assert late.verdict is not None and not late.verdict.passed
    assert late.verdict.reason == f"{FIRST}: the validation pod cannot start after 300s: {why}"


def test_a_failed_attempt_holds_the_node_until_the_retry_then_attempt_two() -> None:
    failed = entry(
        Entry.VALIDATION_FAILED, NOW - dt.timedelta(seconds=10), f"{FIRST}: boom", "failed"
    )
    record = recovering(STARTED, failed)
    held = step(record, node(), {}, CONFIG, NOW)
    assert held.verdict is not None and held.verdict.reason == f"{FIRST}: boom"
    assert not (held.jobs or held.entries or held.events) and held.requeue_after == 3590
    retried = step(record, node(), {}, CONFIG, NOW + dt.timedelta(seconds=3590))
    assert retried.jobs == (
        CreateValidationJob(
            NODE, "H100", job_name(RECORD.name, 2), RECORD.name, "nvidia.com/gpu", 8
        ),
    )


def test_a_new_recovery_validates_afresh_with_the_next_attempts_name() -> None:
    passed = entry(Entry.VALIDATION_PASSED, NOW - dt.timedelta(seconds=500), f"{FIRST}: pass")
    old = recovering(STARTED, passed)
    again = replace(old, actions=(*old.actions, entry("recovering", NOW - dt.timedelta(seconds=5))))
    assert step(old, node(), {}, CONFIG, NOW).verdict == Validated(True, f"{FIRST}: pass")
    fresh = step(again, node(), {}, CONFIG, NOW)
    assert fresh.verdict is None
    assert [j.name for j in fresh.jobs if isinstance(j, CreateValidationJob)] == [
        job_name(RECORD.name, 2)
    ]


def test_a_node_offering_no_gpus_fails_without_a_job() -> None:
    none = step(RECORD, node(gpus=0), {}, CONFIG, NOW)
    assert none.verdict is not None and not none.verdict.passed and not none.jobs
    assert "the node offers no nvidia.com/gpu to validate" in none.verdict.reason


# -- the recovery's plan -------------------------------------------------------------


def test_recovery_returns_the_node_only_after_its_validation_passes() -> None:
    starting = plan(NodeState(node(), records=(RECORD,)), CONFIG, NOW)
    assert any(isinstance(a, CreateValidationJob) for a in starting.actions)
    assert not any(isinstance(a, RemoveTaint) for a in starting.actions)
    record = recovering(STARTED)
    running = plan(
        NodeState(node(), records=(record,), validations={FIRST: pod(FIRST)}), CONFIG, NOW
    )
    assert running.actions == () and running.requeue_after == 570
    done = {FIRST: pod(FIRST, "Succeeded", exit_code=0, message=PASS)}
    returned = plan(NodeState(node(), records=(record,), validations=done), CONFIG, NOW)
    kinds = [type(a).__name__ for a in returned.actions]
    assert kinds[:2] == ["DeleteValidationJob", "UpdateRecord"]
    assert "RemoveTaint" in kinds


def test_recovery_without_validation_enabled_starts_no_job() -> None:
    off = replace(CONFIG, health_gate=HealthGateConfig())
    returned = plan(NodeState(node(), records=(RECORD,)), off, NOW)
    assert not any(isinstance(a, CreateValidationJob) for a in returned.actions)
    assert any(isinstance(a, RemoveTaint) for a in returned.actions)


def test_a_failed_validation_keeps_the_taint() -> None:
    record = recovering(STARTED)
    bad = {FIRST: pod(FIRST, "Failed", exit_code=1, message=FAIL)}
    held = plan(NodeState(node(), records=(record,), validations=bad), CONFIG, NOW)
    assert not any(isinstance(a, RemoveTaint) for a in held.actions)
    assert held.requeue_after == VALIDATION.retry_seconds


def test_a_job_found_finished_at_its_start_is_judged_at_once() -> None:
    """A controller killed after creating the Job, before its record said so: its
    successor starts the same attempt, finds the Job (409) and its pod finished, and
    no event will come again to say so."""
    finished = {FIRST: pod(FIRST, "Succeeded", exit_code=0, message=PASS)}
    again = step(RECORD, node(), finished, CONFIG, NOW)
    assert again.verdict is not None and again.verdict.passed
    assert [type(j).__name__ for j in again.jobs] == ["CreateValidationJob", "DeleteValidationJob"]
    assert [e.action for e in again.entries] == [Entry.VALIDATION_START, Entry.VALIDATION_PASSED]
    running = step(RECORD, node(), {FIRST: pod(FIRST)}, CONFIG, NOW)
    assert running.verdict is None and [e.action for e in running.entries] == [
        Entry.VALIDATION_START
    ]
