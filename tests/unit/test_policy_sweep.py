"""The idle-node sweep's pure part (policy/sweep.py): which idle nodes are checked,
when a check ends and how, which failed checks stay faults; and what must NOT
happen: a busy, unwell, wanted or recently checked node is never taken, more
checks than allowed never run, a Job's failure is never lost to a yield, a check
that could not run is never a fault."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.clock import iso
from gpuheal.config import Config, HealthGateConfig, SweepConfig, ValidationConfig
from gpuheal.kube.pending import PendingPodJson, pending_pod_factory
from gpuheal.model import (
    SWEEP,
    SWEEP_TAINT,
    TAINT_KEY,
    Condition,
    DeviceKey,
    DraDevice,
    FaultRecord,
    NodeView,
    Phase,
    PodView,
    Taint,
    fault_record_name,
)
from gpuheal.policy import sweep
from gpuheal.policy.sweep import Fleet, PendingPod, Result, SweepMark, parse_mark, plan
from gpuheal.policy.validation import SWEEP_LABEL, ValidationPod, job_manifest
from gpuheal.values import is_label_value, is_subdomain
from tests.corpus import AKS_NODE, EKS_NODES, FQDN_253, GKE_NODE

EXAMPLE_DEVICES = (
    DraDevice(
        DeviceKey("gpu.nvidia.com", EKS_NODES[0], "gpu-0"),
        EKS_NODES[0],
        "GPU-6f2c8a4e-1b3d-4f5a-9c7e-2d8b0a1f3e5c",
        "gpu",
    ),
)
NOW = dt.datetime(2026, 12, 7, 12, 0, 0, tzinfo=dt.UTC)
CONFIG = Config(
    health_gate=HealthGateConfig(validation=ValidationConfig(schedule_timeout_seconds=300)),
    sweep=SweepConfig(enabled=True, max_concurrent=2),
)
PASS = json.dumps({"result": "pass", "tool": "dcgmi-diag", "detail": "level 3: all tests pass"})
FAIL = json.dumps({"result": "fail", "tool": "dcgmi-diag", "detail": "Memory: GPU 3 failed"})
GPU_TAINT = Taint("nvidia.com/gpu", "NoSchedule", "present")
BOOT = "3d6e8f6c-52a1-4c1e-9b0e-2f6f1c0d9a11"


def gpu_node(name: str = EKS_NODES[0], **changes: object) -> NodeView:
    made = NodeView(
        name=name,
        resource_version="7",
        labels={"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "H100"},
        gpus=8,
        allocatable=(("nvidia.com/gpu", 8),),
        capacity=(("nvidia.com/gpu", 8),),
        conditions=(Condition("Ready", "True"),),
        taints=(GPU_TAINT,),
        boot_id=BOOT,
    )
    return replace(made, **changes)  # type: ignore[arg-type]


def marked(node: NodeView, mark: SweepMark, *, fenced: bool = True) -> NodeView:
    taints = (*node.taints, Taint(SWEEP_TAINT, "NoSchedule")) if fenced else node.taints
    return replace(node, annotations={SWEEP: mark.encode()}, taints=taints)


def running(started: dt.datetime = NOW, name: str = EKS_NODES[0]) -> SweepMark:
    return SweepMark(job=sweep.job_name(name, started), started=iso(started, "seconds"), boot=BOOT)


def ended(result: Result, hours_ago: float, fault: str = "") -> SweepMark:
    at = NOW - dt.timedelta(hours=hours_ago)
    return replace(
        running(at - dt.timedelta(minutes=20)), ended=iso(at, "seconds"), result=result, fault=fault
    )


def gpu_pod(node: str, name: str = "train-0", owner: str = "Job/train") -> PodView:
    return PodView("ml", name, f"uid-{name}", node, "Running", gpu=True, gpu_count=8, owner=owner)


def check_pod(job: str, phase: str = "Running", **changes: object) -> ValidationPod:
    return replace(ValidationPod(name=f"{job}-x7k2p", job=job, node="", phase=phase), **changes)  # type: ignore[arg-type]


def fleet(
    *nodes: NodeView,
    pods: dict[str, list[PodView]] | None = None,
    pending: tuple[PendingPod, ...] = (),
    checks: tuple[ValidationPod, ...] = (),
    records: tuple[FaultRecord, ...] = (),
) -> Fleet:
    return Fleet(
        nodes=nodes,
        pods=pods or {},
        pending=pending,
        checks={c.job: c for c in checks},
        records=records,
        managed=lambda _name: True,
    )


# Starting


def test_an_idle_node_never_checked_is_fenced_and_its_job_runs_the_sweeps_level() -> None:
    (start,) = plan(fleet(gpu_node()), CONFIG, NOW).starts
    assert start.mark == SweepMark(
        job=sweep.job_name(EKS_NODES[0], NOW), started=iso(NOW, "seconds"), boot=BOOT
    )
    job = job_manifest(start.job, CONFIG)
    pod = job["spec"]["template"]
    assert job["metadata"]["labels"][SWEEP_LABEL] == "true"
    assert pod["metadata"]["labels"][SWEEP_LABEL] == "true"
    assert "gpuheal.io/record" not in job["metadata"]["annotations"]
    assert job["spec"]["activeDeadlineSeconds"] == 3600 + 60
    (container,) = pod["spec"]["containers"]
    assert {"name": "GPUHEAL_DCGM_LEVEL", "value": "3"} in container["env"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    tolerations = pod["spec"]["tolerations"]
    assert {"key": SWEEP_TAINT, "operator": "Exists", "effect": "NoSchedule"} in tolerations
    # The node's own NoSchedule taint, exactly: its GPU pods tolerate it anyway.
    assert {
        "key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"
    } in tolerations  # fmt: skip


def test_at_most_max_concurrent_run_and_the_longest_unchecked_go_first() -> None:
    names = (*EKS_NODES, GKE_NODE, AKS_NODE)
    busy = running(NOW - dt.timedelta(minutes=5), names[4])
    nodes = (
        marked(gpu_node(names[0]), ended(Result.PASSED, 500), fenced=False),
        marked(gpu_node(names[1]), ended(Result.PASSED, 200), fenced=False),
        gpu_node(names[2]),
        marked(gpu_node(names[3]), ended(Result.PASSED, 300), fenced=False),
        marked(gpu_node(names[4]), busy),
    )
    seen = plan(fleet(*nodes, checks=(check_pod(busy.job),)), CONFIG, NOW)
    # One slot of two is taken by the running check: the never-checked node first.
    assert [s.node.name for s in seen.starts] == [names[2]]
    assert (seen.running, seen.due) == (2, 3)
    seen = plan(
        fleet(*nodes[:4]), replace(CONFIG, sweep=replace(CONFIG.sweep, max_concurrent=3)), NOW
    )
    assert [s.node.name for s in seen.starts] == [names[2], names[0], names[3]]


def test_a_node_checked_within_the_interval_waits_and_one_that_yielded_waits_an_hour() -> None:
    recent = marked(gpu_node(), ended(Result.PASSED, 100), fenced=False)
    assert not plan(fleet(recent), CONFIG, NOW).starts  # 168 h by default
    old = marked(gpu_node(), ended(Result.PASSED, 169), fenced=False)
    assert plan(fleet(old), CONFIG, NOW).starts
    yielded = marked(gpu_node(), ended(Result.YIELDED, 0.5), fenced=False)
    assert not plan(fleet(yielded), CONFIG, NOW).starts
    assert plan(
        fleet(marked(gpu_node(), ended(Result.ERROR, 1.1), fenced=False)), CONFIG, NOW
    ).starts


def test_no_busy_unwell_taken_out_or_wanted_node_is_ever_checked() -> None:
    name = EKS_NODES[0]
    record = FaultRecord(fault_record_name(name, "f-1"), name, "f-1", Phase.QUARANTINED)
    not_idle = {
        "a GPU pod": fleet(gpu_node(), pods={name: [gpu_pod(name)]}),
        "an open fault": fleet(gpu_node(), records=(record,)),
        "cordoned": fleet(gpu_node(unschedulable=True)),
        "not ready": fleet(gpu_node(conditions=(Condition("Ready", "False"),))),
        "maintenance": fleet(gpu_node(labels={"gpuheal.io/state": "maintenance"})),
        "our fault taint": fleet(gpu_node(taints=(Taint(TAINT_KEY, "NoSchedule", "f-1"),))),
        "a NoExecute taint": fleet(gpu_node(taints=(Taint("example.com/drain", "NoExecute"),))),
        "unreachable": fleet(
            gpu_node(taints=(Taint("node.kubernetes.io/unreachable", "NoSchedule"),))
        ),
        "no GPUs allocatable": fleet(gpu_node(allocatable=(("nvidia.com/gpu", 0),))),
        "a pending pod it fits": fleet(
            gpu_node(), pending=(PendingPod("ml", "train-1", (("nvidia.com/gpu", 8),)),)
        ),
        "a pending DRA pod": fleet(
            gpu_node(devices=EXAMPLE_DEVICES), pending=(PendingPod("ml", "dra-0", claims=True),)
        ),
    }
    for why, seen in not_idle.items():
        assert not plan(seen, CONFIG, NOW).starts, why
    unmanaged = replace(fleet(gpu_node()), managed=lambda _name: False)
    assert not plan(unmanaged, CONFIG, NOW).starts
    other_pool = replace(CONFIG, sweep=replace(CONFIG.sweep, pools=("inference",)))
    assert not plan(fleet(gpu_node()), other_pool, NOW).starts
    assert not plan(fleet(gpu_node()), replace(CONFIG, sweep=SweepConfig()), NOW).starts


def test_a_pending_pod_the_node_cannot_take_does_not_hold_the_check_back() -> None:
    too_big = PendingPod("ml", "train-16", (("nvidia.com/gpu", 16),))
    elsewhere = PendingPod(
        "ml",
        "train-a100",
        (("nvidia.com/gpu", 1),),
        node_selector=(("nvidia.com/gpu.product", "A100"),),
    )
    no_gpu = PendingPod("web", "nginx")
    seen = plan(fleet(gpu_node(), pending=(too_big, elsewhere, no_gpu)), CONFIG, NOW)
    assert len(seen.starts) == 1


# Ending


def test_a_pass_lifts_the_fence_and_a_fail_keeps_it_and_names_a_fault() -> None:
    mark = running(NOW - dt.timedelta(minutes=20))
    node = marked(gpu_node(), mark)
    passed = check_pod(mark.job, "Succeeded", exit_code=0, message=PASS)
    (end,) = plan(fleet(node, checks=(passed,)), CONFIG, NOW).ends
    assert (end.mark.result, end.fenced) == (Result.PASSED, False)
    assert end.mark.detail == f"{mark.job}: dcgmi-diag: level 3: all tests pass: pass"
    failed = check_pod(mark.job, "Failed", exit_code=1, message=FAIL)
    (end,) = plan(fleet(node, checks=(failed,)), CONFIG, NOW).ends
    assert (end.mark.result, end.fenced) == (Result.FAILED, True)
    assert end.mark.fault == "sweep-20261207120000"
    assert "Memory: GPU 3 failed" in end.mark.detail


def test_a_check_yields_at_once_to_a_pending_pod_a_placed_pod_or_a_fault() -> None:
    name = EKS_NODES[0]
    mark = running(NOW - dt.timedelta(minutes=2))
    node = marked(gpu_node(), mark)
    ours = check_pod(mark.job)
    record = FaultRecord(fault_record_name(name, "f-9"), name, "f-9", Phase.DETECTED)
    cases = {
        "pending pod ml/train-1": fleet(
            node, checks=(ours,), pending=(PendingPod("ml", "train-1", (("nvidia.com/gpu", 4),)),)
        ),
        "pod ml/train-0 was placed": fleet(node, checks=(ours,), pods={name: [gpu_pod(name)]}),
        "a fault on the node": fleet(node, checks=(ours,), records=(record,)),
        "the node is not Ready": fleet(
            replace(node, conditions=(Condition("Ready", "Unknown"),)), checks=(ours,)
        ),
    }
    for said, seen in cases.items():
        (end,) = plan(seen, CONFIG, NOW).ends
        assert (end.mark.result, end.fenced) == (Result.YIELDED, False), said
        assert said in end.mark.detail
    # Its own pod and a canary are not workloads.
    own = gpu_pod(name, ours.name, owner=f"Job/{mark.job}")
    assert not plan(fleet(node, checks=(ours,), pods={name: [own]}), CONFIG, NOW).ends
    off = replace(CONFIG, sweep=replace(CONFIG.sweep, enabled=False))
    (end,) = plan(fleet(node, checks=(ours,)), off, NOW).ends
    assert end.mark.detail == "the sweep is off"


def test_a_failure_is_never_lost_to_a_yield_seen_in_the_same_pass() -> None:
    mark = running(NOW - dt.timedelta(minutes=20))
    failed = check_pod(mark.job, "Failed", exit_code=1, message=FAIL)
    waiting = PendingPod("ml", "train-1", (("nvidia.com/gpu", 8),))
    seen = fleet(marked(gpu_node(), mark), checks=(failed,), pending=(waiting,))
    (end,) = plan(seen, CONFIG, NOW).ends
    assert end.mark.result == Result.FAILED


def test_a_hang_is_a_failure_but_a_check_that_never_ran_is_an_error_never_a_fault() -> None:
    late = running(NOW - dt.timedelta(seconds=3600))
    node = marked(gpu_node(), late)
    (end,) = plan(fleet(node, checks=(check_pod(late.job),)), CONFIG, NOW).ends
    assert end.mark.result == Result.FAILED and "a hang on the GPUs" in end.mark.detail
    stuck = check_pod(
        late.job, "Pending", unschedulable="0/1 nodes are available: Insufficient nvidia.com/gpu"
    )
    early = running(NOW - dt.timedelta(seconds=299))
    assert not plan(
        fleet(marked(gpu_node(), early), checks=(replace(stuck, job=early.job),)), CONFIG, NOW
    ).ends
    (end,) = plan(fleet(node, checks=(stuck,)), CONFIG, NOW).ends
    assert (end.mark.result, end.mark.fault) == (Result.ERROR, "")
    assert "cannot be placed: 0/1 nodes are available" in end.mark.detail
    pulling = check_pod(late.job, "Pending", waiting="ErrImagePull: not found")
    (end,) = plan(fleet(node, checks=(pulling,)), CONFIG, NOW).ends
    assert end.mark.result == Result.ERROR and "ErrImagePull" in end.mark.detail
    (end,) = plan(fleet(node), CONFIG, NOW).ends
    assert end.mark.result == Result.ERROR and "no pod" in end.mark.detail
    # Ended by its kubelet or out of memory, not by the check: no verdict on the GPUs.
    for reason, code in (("Evicted", None), ("OOMKilled", 137), ("DeadlineExceeded", None)):
        ended = check_pod(late.job, "Failed", reason=reason, exit_code=code)
        (end,) = plan(fleet(node, checks=(ended,)), CONFIG, NOW).ends
        assert (end.mark.result, end.mark.fault) == (Result.ERROR, ""), reason
        assert f"ended before the check did ({reason})" in end.mark.detail


# Failed checks as faults


def test_a_failed_check_holds_its_fault_until_the_node_boots_again() -> None:
    mark = ended(Result.FAILED, 2, fault="sweep-20261207100000")
    node = marked(gpu_node(), mark)
    (hold,) = plan(fleet(node), CONFIG, NOW).holds
    assert (hold.node, hold.fault, hold.since) == (
        node.name,
        mark.fault,
        NOW - dt.timedelta(hours=2),
    )
    assert not plan(fleet(node), CONFIG, NOW).starts
    # Its fence stays until the fault is recorded, then goes.
    assert not plan(fleet(node), CONFIG, NOW).unfences
    record = FaultRecord(
        fault_record_name(node.name, mark.fault), node.name, mark.fault, Phase.DRAINED
    )
    (unfence,) = plan(fleet(node, records=(record,)), CONFIG, NOW).unfences
    assert unfence.node == node
    rebooted = replace(node, boot_id="8a1f0e55-0c2b-4d7e-a3f9-6b5d4c3e2a10")
    seen = plan(fleet(rebooted), CONFIG, NOW)
    assert not seen.holds and len(seen.unfences) == 1


# The mark, the Job's name, the pending pods' projection


def test_the_mark_reads_back_and_junk_reads_as_never_checked() -> None:
    mark = ended(Result.FAILED, 1, fault="sweep-20261207110000")
    assert parse_mark(mark.encode()) == mark
    for junk in ("", "{", "[]", '{"started": "x"}', json.dumps({"job": 7})):
        assert parse_mark(junk) is None


@given(st.sampled_from([*EKS_NODES, GKE_NODE, AKS_NODE, FQDN_253]), st.integers(0, 4_000_000_000))
def test_a_jobs_name_is_valid_whatever_the_node(name: str, epoch: int) -> None:
    job = sweep.job_name(name, dt.datetime.fromtimestamp(epoch, dt.UTC))
    assert len(job) <= 63 and is_subdomain(job) and is_label_value(job)


def test_a_pending_pod_keeps_what_it_wants_of_gpus_and_where() -> None:
    view = pending_pod_factory(lambda r: r == "nvidia.com/gpu")
    raw = {
        "metadata": {"name": "train-0", "namespace": "ml"},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "H100"},
            "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            "containers": [
                {"resources": {"limits": {"nvidia.com/gpu": "4", "cpu": "8"}}},
                {"resources": {"requests": {"memory": "1Gi"}}},
            ],
        },
    }
    pod = view(msgspec.convert(raw, PendingPodJson))
    assert pod == PendingPod(
        "ml",
        "train-0",
        (("nvidia.com/gpu", 8),),
        node_selector=(("nvidia.com/gpu.product", "H100"),),
    )
    web = view(msgspec.convert({"metadata": {"name": "web", "namespace": "a"}}, PendingPodJson))
    assert not web.fits(gpu_node())
    # The sweep's own Job's pod, waiting for the scheduler, is no workload to yield to.
    own = {
        **raw,
        "metadata": {
            "name": "x",
            "namespace": "gpuheal-system",
            "labels": {SWEEP_LABEL: "true", "gpuheal.io/validation": "true"},
        },
    }
    assert not view(msgspec.convert(own, PendingPodJson)).fits(gpu_node())


# Property: whatever the fleet, never more checks than allowed, never a busy node.


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.booleans(), st.booleans(), st.sampled_from(["none", "running", "passed", "failed"])
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 4),
)
def test_never_more_checks_than_allowed_and_never_on_a_busy_node(
    shape: list[tuple[bool, bool, str]], limit: int
) -> None:
    nodes, pods = [], {}
    for i, (busy, ready, state) in enumerate(shape):
        name = f"ip-10-0-{i}-7.ec2.internal"
        node = gpu_node(name, conditions=(Condition("Ready", "True" if ready else "False"),))
        if state == "running":
            node = marked(node, running(NOW - dt.timedelta(minutes=1), name))
        elif state != "none":
            result = Result.PASSED if state == "passed" else Result.FAILED
            node = marked(node, ended(result, 500, fault="sweep-1"), fenced=state == "failed")
        nodes.append(node)
        if busy:
            pods[name] = [gpu_pod(name)]
    config = replace(CONFIG, sweep=replace(CONFIG.sweep, max_concurrent=limit))
    seen = plan(fleet(*nodes, pods=pods), config, NOW)
    still = sum(1 for s in shape if s[2] == "running") - len(seen.ends)
    assert len(seen.starts) <= max(limit - still, 0)
    assert seen.running == still + len(seen.starts)
    assert not {s.node.name for s in seen.starts} & set(pods)
    assert all(s.node.ready for s in seen.starts)
