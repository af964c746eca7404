"""The validation Jobs' I/O (policy/validation.py decides what and when): create
one idempotently, delete it once its result is read, and project its pod to what
the gate reads: where the pod stands, why the scheduler will not place it, and how
its container ended (exit code and termination message). The controller and the
CLI share these."""

from __future__ import annotations

import json
import logging

import msgspec

from gpuheal import values
from gpuheal.config import Config
from gpuheal.kube.api import ApiError, KubeApi
from gpuheal.kube.projections import Meta
from gpuheal.policy.validation import (
    CONTAINER,
    NODE_ANNOTATION,
    VALIDATION_JOB_LABEL,
    CreateValidationJob,
    DeleteValidationJob,
    ValidationPod,
    job_manifest,
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


log = logging.getLogger(__name__)

# The Job goes now, its pod after it (the garbage collector): nothing waits on it.
BACKGROUND = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}


def job_path(namespace: str, name: str = "") -> str:
    base = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    return f"{base}/{name}" if name else base


async def create_job(api: KubeApi, action: CreateValidationJob, config: Config) -> str:
    """ "created", or "present": the attempt's Job exists already (this pass ran before
    a crash, or twice). One of another node's by the same name is left alone and
    said: this attempt then times out."""
    namespace = config.health_gate.validation.namespace
    try:
        await api.create(job_path(namespace), job_manifest(action, config))
    except ApiError as err:
        if err.code != 409:
            raise
        existing = json.loads(await api.get(job_path(namespace, action.name)))
        node = (existing.get("metadata", {}).get("annotations") or {}).get(NODE_ANNOTATION)
        if node != action.node:
            log.warning(
                "a Job by the validation's name is not ours",
                extra={"node": action.node, "job": action.name, "its_node": node},
            )
            return "not-ours"
        return "present"
    return "created"


async def delete_job(api: KubeApi, action: DeleteValidationJob, config: Config) -> str:
    namespace = config.health_gate.validation.namespace
    try:
        await api.delete(job_path(namespace, action.name), BACKGROUND)
    except ApiError as err:
        if err.code != 404:
            raise
        return "gone"
    return "deleted"
