"""gpuheal's own Events, for the console's fault page without an API request per
view: one watch of events.k8s.io/v1 Events restricted by the API server to
`reportingController=gpuheal.io/controller` (no other Event of the cluster is
sent), projected to `EventView`, indexed by the objects they are about and
bounded (the oldest dropped first). Every replica keeps one, so a standby's
console shows the leader's Events, and a restarted one relists what the API
server still keeps (its Event TTL, 1 h by default)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import msgspec

from gpuheal.kube.api import KubeApi
from gpuheal.kube.events import REPORTING_CONTROLLER
from gpuheal.kube.informer import Informer
from gpuheal.kube.projections import Meta
from gpuheal.model import EventView

log = logging.getLogger(__name__)

EVENTS_PATH = "/apis/events.k8s.io/v1/events"
# A field of events.k8s.io/v1 Events the API server selects on (core/v1 calls it
# reportingComponent); checked against the real API server by the tests.
OURS = f"reportingController={REPORTING_CONTROLLER}"
EVENTS_KEPT = 10_000  # ~16 MiB of views and index (tracemalloc, one node per Event: the worst)

Object = tuple[str, str]  # (kind, name)


class EventRefJson(msgspec.Struct):
    kind: str = ""
    name: str = ""


class EventJson(msgspec.Struct):
    metadata: Meta
    eventTime: str | None = None  # noqa: N815 -- API field name
    reason: str = ""
    note: str = ""
    type: str = ""
    action: str = ""
    reportingInstance: str = ""  # noqa: N815
    regarding: EventRefJson = msgspec.field(default_factory=EventRefJson)
    related: EventRefJson | None = None


def event_view(event: EventJson) -> EventView:
    meta = event.metadata
    related = event.related
    return EventView(
        key=f"{meta.namespace}/{meta.name}",
        time=event.eventTime or meta.creationTimestamp or "",
        reason=event.reason,
        note=event.note,
        type=event.type,
        action=event.action,
        instance=event.reportingInstance,
        regarding=(event.regarding.kind, event.regarding.name),
        related=(related.kind, related.name) if related else None,
    )


class EventCache(Informer[EventJson, EventView]):
    def __init__(
        self,
        api: KubeApi,
        *,
        capacity: int = EVENTS_KEPT,
        watch_timeout_s: int = 300,
        inactivity_s: float = 90.0,
    ) -> None:
        super().__init__(
            api,
            EVENTS_PATH,
            EventJson,
            event_view,
            lambda e: e.key,
            name="events",
            field_selector=OURS,
            watch_timeout_s=watch_timeout_s,
            inactivity_s=inactivity_s,
        )
        self.capacity = capacity
        self.dropped = 0  # Events let go for the bound
        # object -> keys of the Events about it (regarding or related), oldest first.
        self.about: dict[Object, dict[str, None]] = {}

    def of(self, objects: Iterable[Object]) -> list[EventView]:
        """The Events about any of `objects`, oldest first."""
        keys = {k for o in objects for k in self.about.get(o, ())}
        found = [e for k in keys if (e := self.store.get(k)) is not None]
        return sorted(found, key=lambda e: (e.time, e.key))

    def _apply(self, key: str, view: EventView | None, resource_version: str) -> None:
        old = self.store.get(key)
        super()._apply(key, view, resource_version)
        if old is not None:
            self._unindex(old)
        if view is not None:
            for o in _objects(view):
                self.about.setdefault(o, {})[key] = None
        while len(self.store) > self.capacity:
            # The dict keeps arrival order: the first is the oldest arrived.
            oldest = next(iter(self.store))
            self._unindex(self.store.pop(oldest))
            self._versions.pop(oldest, None)
            if self.dropped % 1000 == 0:
                log.warning(
                    "event cache full: oldest dropped",
                    extra={"capacity": self.capacity, "dropped": self.dropped + 1},
                )
            self.dropped += 1

    def _unindex(self, view: EventView) -> None:
        for o in _objects(view):
            keys = self.about.get(o)
            if keys is not None:
                keys.pop(view.key, None)
                if not keys:
                    del self.about[o]


def _objects(view: EventView) -> tuple[Object, ...]:
    return (view.regarding, view.related) if view.related else (view.regarding,)
