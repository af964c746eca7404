"""Kubernetes Events (events.k8s.io/v1) for the audit trail.

Events are best effort: a failure is logged and counted, never allowed to
stop or repeat a remediation step. They are sent behind a queue by a few sender
tasks, off the remediation path: a storm's thousands of Events must not stand
between a fault and its taint (eventTime keeps their order readable).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from gpuheal import values
from gpuheal.clock import iso
from gpuheal.kube.api import KubeApi
from gpuheal.model import GPUFAULT_API_VERSION, GPUFAULT_KIND

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "gpuheal.io/controller"
EVENT_NAMESPACE = "default"  # cluster-scoped objects' events live here


@dataclass(frozen=True)
class ObjectRef:
    """An Event's `regarding` or `related` object. kubectl describe selects an
    object's Events by its UID (and kind, name, namespace): without the UID an
    Event is written but never shown there."""

    kind: str
    name: str
    api_version: str
    uid: str = ""
    namespace: str = ""  # "" for cluster-scoped objects (Node, GPUFault)
    resource_version: str = ""  # the version the Event speaks of, where known

    def json(self) -> dict[str, str]:
        ref = {
            "kind": self.kind,
            "name": self.name,
            "apiVersion": self.api_version,
            "namespace": self.namespace,
        }
        if self.uid:
            ref["uid"] = self.uid
        if self.resource_version:
            ref["resourceVersion"] = self.resource_version
        return ref


def node_ref(name: str, uid: str = "", resource_version: str = "") -> ObjectRef:
    return ObjectRef("Node", name, "v1", uid, resource_version=resource_version)


def fault_ref(name: str, uid: str = "", resource_version: str = "") -> ObjectRef:
    return ObjectRef(
        GPUFAULT_KIND,
        name,
        GPUFAULT_API_VERSION,
        uid,
        resource_version=resource_version,
    )


def pod_ref(namespace: str, name: str, uid: str = "", resource_version: str = "") -> ObjectRef:
    return ObjectRef("Pod", name, "v1", uid, namespace, resource_version)


def event_body(
    regarding: ObjectRef,
    *,
    reason: str,
    note: str,
    action: str,
    warning: bool,
    related: ObjectRef | None,
    instance: str,
    now: dt.datetime,
    controller: str = REPORTING_CONTROLLER,
) -> dict[str, object]:
    """One events.k8s.io/v1 Event, valid whatever the note quotes (fault ids,
    reasons and node names come from outside: gpuheal.values keeps them in bounds)."""
    body: dict[str, object] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        # Named like client-go's: <object>.<unique suffix>, within 253 characters.
        # An Event lives in its object's namespace (the API server requires it);
        # cluster-scoped objects' Events in "default".
        "metadata": {
            "name": values.object_name(regarding.name, secrets.token_hex(8)),
            "namespace": regarding.namespace or EVENT_NAMESPACE,
        },
        "eventTime": iso(now, "microseconds"),
        "reportingController": controller,
        "reportingInstance": values.utf8_text(instance, values.EVENT_WORD_MAX),
        "action": values.utf8_text(action, values.EVENT_WORD_MAX),
        "reason": values.utf8_text(reason, values.EVENT_WORD_MAX),
        "type": "Warning" if warning else "Normal",
        "note": values.utf8_text(note, values.EVENT_NOTE_MAX_BYTES),
        "regarding": regarding.json(),
    }
    if related is not None:
        body["related"] = related.json()
    return body


class EventRecorder:
    def __init__(
        self,
        api: KubeApi,
        instance: str,
        *,
        counted: Callable[[str], None] = lambda _: None,
        senders: int = 4,
        capacity: int = 10_000,
    ) -> None:
        self.api = api
        self.instance = instance
        self.counted = counted  # told "sent", "failed" or "dropped" per Event
        self.senders = senders
        # (namespace, Event) pairs.
        self._queue: asyncio.Queue[tuple[str, dict[str, object]]] = asyncio.Queue(capacity)
        self._tasks: list[asyncio.Task[None]] = []

    def emit(
        self,
        regarding: ObjectRef,
        *,
        reason: str,
        note: str,
        action: str,
        warning: bool = False,
        related: ObjectRef | None = None,
    ) -> None:
        """Queue one Event; returns at once. Needs a running event loop."""
        body = event_body(
            regarding,
            reason=reason,
            note=note,
            action=action,
            warning=warning,
            related=related,
            instance=self.instance,
            now=dt.datetime.now(dt.UTC),
        )
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._send()) for _ in range(self.senders)]
        try:
            self._queue.put_nowait((regarding.namespace or EVENT_NAMESPACE, body))
        except asyncio.QueueFull:
            self.counted("dropped")
            log.warning("event dropped: queue full", extra={"reason": reason})

    async def _send(self) -> None:
        while True:
            namespace, body = await self._queue.get()
            try:
                await self.api.create(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", body)
                self.counted("sent")
            except Exception as err:
                self.counted("failed")
                log.warning(
                    "event not recorded", extra={"reason": body["reason"], "error": str(err)}
                )
            finally:
                self._queue.task_done()

    async def flush(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (up to `timeout_s`), then stop the senders."""
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), timeout_s)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
