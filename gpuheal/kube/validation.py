"""The validation Jobs' pods, projected to what the gate reads: where the pod
stands, why the scheduler will not place it, and how its container ended (exit
code and termination message)."""

from __future__ import annotations

import msgspec

from gpuheal import values
from gpuheal.kube.projections import Meta
from gpuheal.policy.validation import (
    CONTAINER,
    NODE_ANNOTATION,
    VALIDATION_JOB_LABEL,
    ValidationPod,
)

# A termination message is at most 4096 bytes (the kubelet's limit); keep what a reason can use.
MESSAGE_KEPT = 4096


class _Spec(msgspec.Struct):
    nodeName: str = ""  # noqa: N815 -- API field name


class _Terminated(msgspec.Struct):
    exitCode: int = 0  # noqa: N815
    reason: str | None = None
    message: str | None = None


class _Waiting(msgspec.Struct):
    reason: str | None = None
    message: str | None = None


class _State(msgspec.Struct):
    terminated: _Terminated | None = None
    waiting: _Waiting | None = None


class _ContainerStatus(msgspec.Struct):
    name: str = ""
    state: _State | None = None


class _Condition(msgspec.Struct):
    type: str = ""
    status: str = ""
    reason: str | None = None
    message: str | None = None


class _Status(msgspec.Struct):
    phase: str = ""
    reason: str | None = None  # DeadlineExceeded, Evicted
    message: str | None = None
    conditions: list[_Condition] | None = None
    containerStatuses: list[_ContainerStatus] | None = None  # noqa: N815


class ValidationPodJson(msgspec.Struct):
    metadata: Meta
    spec: _Spec = msgspec.field(default_factory=_Spec)
    status: _Status = msgspec.field(default_factory=_Status)


def validation_pod(pod: ValidationPodJson) -> ValidationPod:
    meta, status = pod.metadata, pod.status
    ours = next((c for c in status.containerStatuses or () if c.name == CONTAINER), None)
    state = ours.state if ours is not None else None
    ended = state.terminated if state is not None else None
    waiting = state.waiting if state is not None else None
    unschedulable = next(
        (
            c.message or "Unschedulable"
            for c in status.conditions or ()
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        ),
        "",
    )
    return ValidationPod(
        name=meta.name,
        job=meta.labels.get(VALIDATION_JOB_LABEL, ""),
        node=meta.annotations.get(NODE_ANNOTATION) or pod.spec.nodeName,
        phase=status.phase,
        unschedulable=values.text(unschedulable, values.DETAIL_MAX),
        exit_code=ended.exitCode if ended is not None else None,
        message=(ended.message or "")[:MESSAGE_KEPT] if ended is not None else "",
        reason=(ended.reason or "") if ended is not None else (status.reason or ""),
        waiting=values.text(
            ": ".join(p for p in (waiting.reason, waiting.message) if p) if waiting else "", 256
        ),
    )
