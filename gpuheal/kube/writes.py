"""The bodies of the controller's writes that carry outside input: pure builders.

A fault's id, reason, devices and time come from an agent's annotation, an
alert, DCGM or a person; its node name from the cloud. Each builder passes
them through gpuheal.values, so every body here is one the API server accepts
whatever the input looked like (tests/integration/test_values.py sends them to
the real API server as server-side dry runs). The executor sends them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gpuheal import values
from gpuheal.clock import parse_time
from gpuheal.model import (
    CANARY_LABEL,
    CHECKPOINT_REQUESTED,
    DISRUPTION_GUARD,
    GPUFAULT_API_VERSION,
    GPUFAULT_KIND,
    HANDLED_AT,
    HANDLED_FAULT_ID,
    LAST_PROCESS_TIME,
    NODE_LABEL,
    QUARANTINED_DEVICES,
    RECORD_ANNOTATION,
    REPAIR_REQUEST,
    STATE_LABEL,
    SUSPECT_DEVICES,
    TAINT_KEY,
    UNKNOWN_DEVICES,
    ActionEntry,
    DraDevice,
    FaultRecord,
    FaultSignal,
    Mode,
    NodeView,
    Phase,
    PodView,
    RepairApproval,
)


def _time(value: str) -> str:
    """An RFC 3339 time as reported, or "" when it is not one (or too long to keep)."""
    return value if len(value) <= values.TIME_MAX and parse_time(value) is not None else ""


def _devices(devices: tuple[str, ...]) -> list[str]:
    return [values.text(d) for d in devices[: values.DEVICES_MAX]]


def _record_meta(name: str, node: str) -> dict[str, Any]:
    return {"name": name, "labels": {NODE_LABEL: values.node_label(node)}}


def fault_record(
    name: str, signal: FaultSignal, mode: Mode, supersedes: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A node-scope GPUFault: created first, it is the fault's exactly-once lock.
    `supersedes`: the fault ids it replaces on the node (policy/plan/admit.py::superseded_ids)."""
    return {
        "apiVersion": GPUFAULT_API_VERSION,
        "kind": GPUFAULT_KIND,
        "metadata": _record_meta(name, signal.node),
        "spec": {
            "node": signal.node,
            "faultID": values.fault_id(signal.fault_id),
            "scope": "node",
            "device": "",
            "devices": _devices(signal.devices),
            "source": values.text(signal.source),
            "reason": values.text(signal.reason),
            "severity": signal.severity.value,
            "detectedAt": _time(signal.detected_at),
            "mode": mode.value,
            **(
                {"supersedes": [values.fault_id(f) for f in supersedes[: values.SUPERSEDES_MAX]]}
                if supersedes
                else {}
            ),
        },
    }


def device_record(record: FaultRecord, mode: Mode) -> dict[str, Any]:
    """A device-scope GPUFault (resource name and resourceID come from the kubelet)."""
    return {
        "apiVersion": GPUFAULT_API_VERSION,
        "kind": GPUFAULT_KIND,
        "metadata": _record_meta(record.name, record.node),
        "spec": {
            "node": record.node,
            "faultID": values.fault_id(record.fault_id),
            "scope": "device",
            "device": values.text(record.device),
            "resourceName": values.text(record.resource),
            "resourceID": values.text(record.device),
            "source": values.text(record.source),
            "reason": values.text(record.reason),
            "severity": record.severity.value,
            "detectedAt": _time(record.detected_at),
            "mode": mode.value,
            "expiry": _time(record.expiry),
        },
    }


def action_entry(entry: ActionEntry) -> dict[str, str]:
    """One status.actions[] item (details quote fault ids, pod names, gate findings)."""
    return {
        "time": entry.time,
        "action": entry.action,
        "result": entry.result,
        "detail": values.text(entry.detail, values.DETAIL_MAX),
    }


def _repair_approval(asked: RepairApproval) -> dict[str, Any]:
    """status.repairApproval as the controller asks it (a merge patch): the attempt's
    question, and the answer to an earlier attempt removed (null)."""
    return {
        "attempt": asked.attempt,
        "action": asked.action,
        "since": asked.since,
        "decision": asked.decision or None,
        "by": values.text(asked.by) if asked.by else None,
        "at": asked.at or None,
    }


def record_status(phase: Phase, entries: list[ActionEntry], **fields: Any) -> dict[str, Any]:
    """A status patch of a GPUFault: its phase, its action entries, and `fields` as given."""
    return {
        "status": {"phase": phase.value, "actions": [action_entry(e) for e in entries]} | fields
    }


def news_patch(
    version: str,
    phase: Phase,
    entries: list[ActionEntry],
    *,
    evicted: list[str] | None,
    recovering_since: str | None,
    expiry: str | None,
    plan: dict[str, Any] | None,
    contact_support: bool,
    repair_approval: RepairApproval | None,
) -> dict[str, Any]:
    """A pass's status patch of a GPUFault under its resourceVersion: phase and entries,
    and each other field only where the pass set it (None: left as it is;
    recovering_since "": removed)."""
    body = record_status(phase, entries)
    status = body["status"]
    if evicted is not None:
        status["evictedPods"] = evicted
    if recovering_since is not None:
        status["recoveringSince"] = recovering_since or None
    if expiry is not None:
        status["expiry"] = expiry
    if plan is not None:
        status["plan"] = plan
    if contact_support:
        status["contactSupport"] = True
    if repair_approval is not None:
        status["repairApproval"] = _repair_approval(repair_approval)
    return {"metadata": {"resourceVersion": version}} | body


def taint_patch(
    node: NodeView,
    fault_id: str | None,
    effect: str,
    *,
    state: str | None,
    handled_at: str | None = None,
    added_at: str | None = None,
) -> dict[str, Any]:
    """A merge patch setting our taint for `fault_id` (None: removing it) with the
    node's resourceVersion as precondition: everyone else's taints are kept as read.
    `state`: the gpuheal.io/state label to set, "" to remove it, None to leave it.
    `handled_at`: the fault's handled mark goes in the same write (AddTaint.with_mark).
    `added_at`: the taint's timeAdded (the API server keeps whole seconds): the
    record's `taint` entry, when written after the fact, is dated from it."""
    taints = taints_but(node, TAINT_KEY)
    if fault_id is not None:
        ours = {"key": TAINT_KEY, "value": values.taint_value(fault_id), "effect": effect}
        taints.append(ours | ({"timeAdded": added_at} if added_at else {}))
    metadata: dict[str, Any] = {"resourceVersion": node.resource_version}
    if state is not None:
        metadata["labels"] = {STATE_LABEL: state or None}
    if fault_id is not None and handled_at is not None:
        metadata |= handled_patch(fault_id, handled_at)["metadata"]
    return {"metadata": metadata, "spec": {"taints": taints}}


def taints_but(node: NodeView, key: str) -> list[dict[str, Any]]:
    """The node's taints as read, as a merge patch writes them back, without `key`'s."""
    return [
        {"key": t.key, "effect": t.effect, "value": t.value}
        | ({"timeAdded": t.time_added} if t.time_added else {})
        for t in node.taints
        if t.key != key
    ]


def handled_patch(fault_id: str, now: str) -> dict[str, Any]:
    """The node's durable "handled" mark: the fault id as the record carries it."""
    return {
        "metadata": {
            "annotations": {
                HANDLED_FAULT_ID: values.fault_id(fault_id),
                HANDLED_AT: now,
                LAST_PROCESS_TIME: now,
            }
        }
    }


def repair_request(value: str) -> dict[str, Any]:
    """The node's repair request (gpuheal.io/repair-request: the agent's to carry out)."""
    return {"metadata": {"annotations": {REPAIR_REQUEST: value}}}


def disruption_guard(node: NodeView, add: Sequence[str], remove: Sequence[str]) -> dict[str, Any]:
    """The autoscalers' annotations set ("true", named in the guard annotation) or
    taken back (those the guard named, and the guard), under the node's
    resourceVersion: an annotation a person set meanwhile is never taken for ours."""
    if add:
        annotations: dict[str, str | None] = dict.fromkeys(add, "true")
        annotations[DISRUPTION_GUARD] = ",".join(add)
    else:
        annotations = dict.fromkeys(remove, None) | {DISRUPTION_GUARD: None}
    return {"metadata": {"resourceVersion": node.resource_version, "annotations": annotations}}


def device_marks(
    quarantined: Sequence[str], suspect: Sequence[str], unknown: Sequence[str]
) -> dict[str, Any]:
    """The node's device marks, a merge patch of only our keys: an empty list removes
    its annotation."""
    marks = {QUARANTINED_DEVICES: quarantined, SUSPECT_DEVICES: suspect, UNKNOWN_DEVICES: unknown}
    return {"metadata": {"annotations": {k: ",".join(v) or None for k, v in marks.items()}}}


def checkpoint_request(deadline: str, version: str) -> dict[str, Any]:
    """The pod's checkpoint request, under its resourceVersion when known (so a request
    made meanwhile is never overwritten)."""
    meta: dict[str, Any] = {"annotations": {CHECKPOINT_REQUESTED: deadline}}
    if version:
        meta["resourceVersion"] = version
    return {"metadata": meta}


def eviction(pod: PodView) -> dict[str, Any]:
    """An Eviction of exactly this pod (its UID as precondition: not a new pod of its name)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
        "deleteOptions": {"preconditions": {"uid": pod.uid}},
    }


def pod_delete(pod: PodView) -> dict[str, Any]:
    """DeleteOptions for exactly this pod."""
    return {"preconditions": {"uid": pod.uid}}


def canary_pod(
    name: str,
    namespace: str,
    node: str,
    record: str,
    resource: str,
    *,
    image: str,
    command: list[str],
    timeout_seconds: float,
    claim: str = "",
) -> dict[str, Any]:
    """A canary pod on one device of `node`, tolerating our taint, with no API token.
    A device plugin's GPU: one of `resource`, pinned to the node by name (the
    scheduler would keep off a quarantined node). A DRA device: the ResourceClaim
    `claim` (canary_claim), which the scheduler must allocate, so the pod is kept to
    the node by affinity and the claim's selector picks the very device."""
    container: dict[str, Any] = {"name": "canary", "image": image, "command": command}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": int(timeout_seconds),
        "automountServiceAccountToken": False,
        "tolerations": [{"key": TAINT_KEY, "operator": "Exists"}],
        "containers": [container],
    }
    if claim:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    else:
        container["resources"] = {"limits": {resource: "1"}}
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {CANARY_LABEL: "true"},
            "annotations": {RECORD_ANNOTATION: record},
        },
        "spec": spec,
    }


def canary_claim(
    name: str, namespace: str, record: str, device: DraDevice, device_class: str
) -> dict[str, Any]:
    """The canary's ResourceClaim: exactly the fenced device, chosen by its UUID (a
    CEL selector: DRA selects by attributes, not by name), tolerating gpuheal's taint
    (the device's fence) so the scheduler may give it that one device."""
    # JSON strings are CEL string literals.
    expression = (
        f"device.attributes[{json.dumps(device.key.driver)}].uuid == {json.dumps(device.uuid)}"
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {CANARY_LABEL: "true"},
            "annotations": {RECORD_ANNOTATION: record},
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": device_class,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "selectors": [{"cel": {"expression": expression}}],
                            "tolerations": [{"key": TAINT_KEY, "operator": "Exists"}],
                        },
                    }
                ]
            }
        },
    }
