"""The bodies of the controller's writes that carry outside input: pure builders.

A fault's id, reason, devices and time come from an agent's annotation, an
alert, DCGM or a person; its node name from the cloud. Each builder passes
them through gpuheal.values, so every body here is one the API server accepts
whatever the input looked like (tests/integration/test_values.py sends them to
the real API server as server-side dry runs). The executor sends them.
"""

from __future__ import annotations

from typing import Any

from gpuheal import values
from gpuheal.clock import parse_time
from gpuheal.model import (
    GPUFAULT_API_VERSION,
    GPUFAULT_KIND,
    HANDLED_AT,
    HANDLED_FAULT_ID,
    LAST_PROCESS_TIME,
    NODE_LABEL,
    STATE_LABEL,
    TAINT_KEY,
    ActionEntry,
    FaultRecord,
    FaultSignal,
    Mode,
    NodeView,
    Phase,
    RepairApproval,
)


def _time(value: str) -> str:
    """An RFC 3339 time as reported, or "" when it is not one (or too long to keep)."""
    return value if len(value) <= values.TIME_MAX and parse_time(value) is not None else ""


def _devices(devices: tuple[str, ...]) -> list[str]:
    return [values.text(d) for d in devices[: values.DEVICES_MAX]]


def _record_meta(name: str, node: str) -> dict[str, Any]:
    return {"name": name, "labels": {NODE_LABEL: values.node_label(node)}}


def fault_record(name: str, signal: FaultSignal, mode: Mode) -> dict[str, Any]:
    """A node-scope GPUFault: created first, it is the fault's exactly-once lock."""
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


def repair_approval(asked: RepairApproval) -> dict[str, Any]:
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


def taint_patch(
    node: NodeView, fault_id: str | None, effect: str, *, state: str | None
) -> dict[str, Any]:
    """A merge patch setting our taint for `fault_id` (None: removing it) with the
    node's resourceVersion as precondition: everyone else's taints are kept as read.
    `state`: the gpuheal.io/state label to set, "" to remove it, None to leave it."""
    taints = [
        {"key": t.key, "effect": t.effect, "value": t.value}
        | ({"timeAdded": t.time_added} if t.time_added else {})
        for t in node.taints
        if t.key != TAINT_KEY
    ]
    if fault_id is not None:
        taints.append({"key": TAINT_KEY, "value": values.taint_value(fault_id), "effect": effect})
    metadata: dict[str, Any] = {"resourceVersion": node.resource_version}
    if state is not None:
        metadata["labels"] = {STATE_LABEL: state or None}
    return {"metadata": metadata, "spec": {"taints": taints}}


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
