"""The one-line summary of a remediation step: node, what is wrong, what was done."""

from __future__ import annotations

from gpuheal.controller.effects.context import PassOutcome
from gpuheal.controller.notices import notice_for
from gpuheal.controller.notify import Notice
from gpuheal.model import ActionEntry, FaultRecord, FaultSignal, Mode, Phase, PodView
from gpuheal.policy.actions import (
    Action,
    AddTaint,
    AwaitApproval,
    CreateRecord,
    Emit,
    Evict,
    MarkHandled,
    Planned,
    RemoveTaint,
    UpdateRecord,
)
from gpuheal.policy.devices import CreateDeviceRecord, DeviceAction, MarkDevices
from gpuheal.policy.repair import RequestRepair
from gpuheal.policy.repairwire import RepairRequest, fault_digest
from gpuheal.policy.validation import DeleteValidationJob
from gpuheal.xid import Action as XidAction
from tests.corpus import EKS_NODE, GPU_UUIDS

T = "2026-11-29T12:00:00.000Z"


def pod(name: str) -> PodView:
    return PodView("ml", name, f"uid-{name}", EKS_NODE, "Running", gpu=True)


def nothing(_: str) -> FaultRecord | None:
    return None


def test_a_quarantine_and_drain_in_one_line() -> None:
    signal = FaultSignal(EKS_NODE, "xid-79-a", "XidCritical79", "agent")
    ran: tuple[Action | DeviceAction, ...] = (
        CreateRecord("r1", signal, Phase.DETECTED, Mode.FULL),
        Emit("GPUFaultDetected", "…", EKS_NODE, "r1"),
        AddTaint(EKS_NODE, "xid-79-a", "NoSchedule"),
        *(Evict(pod(n), "xid-79-a") for n in ("a", "b", "c")),
        MarkHandled(EKS_NODE, "xid-79-a"),
    )
    outcome = PassOutcome(evicted=["ml/a", "ml/b", "ml/c"])
    notice = notice_for(EKS_NODE, ran, outcome, nothing, "xid-79-a")
    assert notice is not None
    assert notice.summary == (
        f"{EKS_NODE}: XidCritical79 — detected, tainted NoSchedule, "
        "evicted 3 pods (ml/a, ml/b, ml/c)"
    )
    assert notice.actions == ("CreateRecord", "AddTaint", "Evict", "MarkHandled")
    assert notice.slack()["text"] == f"gpuheal: {notice.summary} (fault xid-79-a)"


def test_a_recovery_names_its_fault_from_the_record() -> None:
    record = FaultRecord("r1", EKS_NODE, "xid-79-a", Phase.RECOVERING, reason="XidCritical79")
    ran = (
        RemoveTaint(EKS_NODE),
        UpdateRecord("r1", Phase.RESOLVED, ActionEntry(T, "untaint", "ok")),
    )
    notice = notice_for(EKS_NODE, ran, PassOutcome(untainted=True), {"r1": record}.get)
    assert notice is not None and notice.fault_id == "xid-79-a"
    assert notice.summary == f"{EKS_NODE}: XidCritical79 — untainted, resolved"


def test_a_device_fault_and_its_partial_drain() -> None:
    device = GPU_UUIDS[0]
    record = FaultRecord(
        "r2", EKS_NODE, f"{device}#1", Phase.QUARANTINED, reason="DeviceUnhealthy",
        scope="device", resource="nvidia.com/gpu", device=device,
    )  # fmt: skip
    ran = (
        CreateDeviceRecord(record),
        Emit("GPUFaultDetected", "…", EKS_NODE, "r2"),
        Evict(pod("a"), record.fault_id, device=device),
        UpdateRecord("r2", Phase.DRAINING, ActionEntry(T, "evict", "ok"), record_evictions=True),
        MarkDevices(EKS_NODE, (device,), (), ()),
    )
    notice = notice_for(EKS_NODE, ran, PassOutcome(evicted=["ml/a"]), nothing)
    assert notice is not None and notice.fault_id == f"{device}#1"
    assert notice.summary == (
        f"{EKS_NODE}: DeviceUnhealthy on nvidia.com/gpu {device} — detected, "
        "device quarantined, evicted 1 pod (ml/a)"
    )


def test_refusals_and_long_pod_lists_are_said_briefly() -> None:
    pods = [f"ml/p{i}" for i in range(8)]
    outcome = PassOutcome(
        evicted=pods,
        blocked=["ml/guarded"],
        blocked_by={"ml/guarded": "PodDisruptionBudget ml/budget"},
    )
    ran = (Evict(pod("p0"), "f"),)
    notice = notice_for(EKS_NODE, ran, outcome, nothing, "f")
    assert notice is not None
    assert notice.summary == (
        f"{EKS_NODE}: fault — evicted 8 pods (ml/p0, ml/p1, ml/p2, ml/p3, ml/p4 and 3 more), "
        "eviction of 1 pod (ml/guarded) refused by PodDisruptionBudget ml/budget"
    )


def test_only_events_or_device_marks_are_no_notice() -> None:
    marks = (
        MarkDevices(EKS_NODE, (), (), (GPU_UUIDS[0],)),
        Emit("GPUDeviceUnknown", "…", EKS_NODE, ""),
    )
    assert notice_for(EKS_NODE, marks, PassOutcome(), nothing) is None


def test_the_summary_travels_in_the_json_body() -> None:
    notice = Notice(EKS_NODE, "f", ("AddTaint",), summary=f"{EKS_NODE}: X — tainted")
    assert notice.json()["summary"] == f"{EKS_NODE}: X — tainted"


def test_a_plan_awaiting_approval_says_what_it_would_do() -> None:
    record = FaultRecord("r1", EKS_NODE, "f1", Phase.DETECTED, reason="XidCritical79")
    planned = Planned(EKS_NODE, "gpuheal.io/gpu-fault=f1:NoSchedule", ("ml/a", "ml/b"))
    entry = ActionEntry(T, "awaiting-approval", "waiting", "…")
    ran = (AwaitApproval("r1", Phase.AWAITING_APPROVAL, entry, plan=planned),)
    notice = notice_for(EKS_NODE, ran, PassOutcome(), {"r1": record}.get)
    assert notice is not None
    assert notice.summary == (
        f"{EKS_NODE}: XidCritical79 — awaiting approval, taint {EKS_NODE} "
        "gpuheal.io/gpu-fault=f1:NoSchedule; evict 2 GPU pods: ml/a, ml/b"
    )


def test_a_failed_validation_is_told_as_such() -> None:
    record = FaultRecord("r1", EKS_NODE, "xid-79-a", Phase.RECOVERING, reason="XidCritical79")
    job = "gpuheal-validate-4f1c2a9b3d-1"
    ran = (
        DeleteValidationJob(job),
        UpdateRecord(
            "r1", Phase.RECOVERING, ActionEntry(T, "validation-failed", "failed", f"{job}: boom")
        ),
        Emit("GPUHealthGateFailed", "…", EKS_NODE, "r1", warning=True),
    )
    notice = notice_for(EKS_NODE, ran, PassOutcome(), {"r1": record}.get)
    assert notice is not None
    assert notice.summary == f"{EKS_NODE}: XidCritical79 — validation failed, stays tainted"


def test_a_repair_request_and_its_outcome_are_told() -> None:
    record = FaultRecord("r1", EKS_NODE, "xid-94-a", Phase.DRAINED, reason="EccContained94")
    request = RepairRequest(XidAction.RESET_GPU, fault_digest("xid-94-a"), 1, T[:19] + "Z")
    ran = (
        RequestRepair(EKS_NODE, request),
        UpdateRecord("r1", Phase.DRAINED, ActionEntry(T, "repair-requested", "waiting", "x")),
    )
    notice = notice_for(EKS_NODE, ran, PassOutcome(), {"r1": record}.get)
    assert notice is not None and notice.actions == ("RequestRepair", "UpdateRecord")
    assert notice.summary == f"{EKS_NODE}: EccContained94 — repair requested"
    exhausted = UpdateRecord(
        "r1", Phase.DRAINED, ActionEntry(T, "repair-exhausted", "contact-support", "x")
    )
    notice = notice_for(EKS_NODE, (exhausted,), PassOutcome(), {"r1": record}.get)
    assert notice is not None
    assert notice.summary == f"{EKS_NODE}: EccContained94 — repairs exhausted: contact support"
