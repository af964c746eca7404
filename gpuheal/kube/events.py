"""Kubernetes Events (events.k8s.io/v1) for the audit trail.

Events are best effort: a failure is logged and counted, never allowed to
stop or repeat a remediation step.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from dataclasses import dataclass

from gpuheal.kube.api import GPUFAULT_GROUP, GPUFAULT_VERSION, KubeApi

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "gpuheal.io/controller"
EVENT_NAMESPACE = "default"  # cluster-scoped objects' events live here


@dataclass(frozen=True)
class ObjectRef:
    kind: str
    name: str
    api_version: str
    uid: str = ""

    def json(self) -> dict[str, str]:
        ref = {"kind": self.kind, "name": self.name, "apiVersion": self.api_version}
        if self.uid:
            ref["uid"] = self.uid
        return ref


def node_ref(name: str, uid: str = "") -> ObjectRef:
    return ObjectRef("Node", name, "v1", uid)


def fault_ref(name: str, uid: str = "") -> ObjectRef:
    return ObjectRef("GPUFault", name, f"{GPUFAULT_GROUP}/{GPUFAULT_VERSION}", uid)


class EventRecorder:
    def __init__(self, api: KubeApi, instance: str) -> None:
        self.api = api
        self.instance = instance
        self.failures = 0

    async def emit(
        self,
        regarding: ObjectRef,
        *,
        reason: str,
        note: str,
        action: str,
        warning: bool = False,
        related: ObjectRef | None = None,
    ) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            # Named like client-go's: <object>.<unique suffix>.
            "metadata": {
                "name": f"{regarding.name}.{secrets.token_hex(8)}",
                "namespace": EVENT_NAMESPACE,
            },
            "eventTime": now,
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.instance,
            "action": action,
            "reason": reason,
            "type": "Warning" if warning else "Normal",
            "note": note[:1024],
            "regarding": {**regarding.json(), "namespace": ""},
        }
        if related is not None:
            body["related"] = related.json()
        try:
            await self.api.create(
                f"/apis/events.k8s.io/v1/namespaces/{EVENT_NAMESPACE}/events", body
            )
        except Exception as err:
            self.failures += 1
            log.warning("event not recorded", extra={"reason": reason, "error": str(err)})
