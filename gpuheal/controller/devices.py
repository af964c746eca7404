"""Device health reports from the Pod cache, with the times the policy needs.

Pod status carries no timestamp per allocatedResourcesStatus entry, so this keeps,
per pod and device, since when the device has had its current health and when it
was last reported:

- a report is "seen" each time the controller sees the pod object written with the
  entry present (any update of the pod after the initial sync);
- at the initial list (a start or failover) nothing was seen by this process: the
  pod status's latest timestamp (conditions, container states) stands in, so a
  restart never makes an old report look fresh;
- the health's "since" moves only when the reported health changes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable

from gpuheal.clock import parse_time
from gpuheal.model import PodView
from gpuheal.policy.devices import DeviceEntry


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class DeviceReports:
    def __init__(
        self, synced: Callable[[], bool], clock: Callable[[], dt.datetime] = _utcnow
    ) -> None:
        self._synced = synced
        self._clock = clock
        self._by_pod: dict[str, dict[tuple[str, str], DeviceEntry]] = {}

    def on_pod(self, old: PodView | None, new: PodView | None) -> None:
        if new is None or not new.devices:
            if old is not None:
                self._by_pod.pop(old.key, None)
            if new is not None:
                self._by_pod.pop(new.key, None)
            return
        now = self._clock()
        seen = now
        if not self._synced():
            written = parse_time(new.status_time)
            seen = min(written, now) if written else now
        before = self._by_pod.get(new.key, {})
        current = {}
        for report in new.devices:
            key = (report.resource, report.device_id)
            previous = before.get(key)
            same = previous is not None and previous.report.health is report.health
            since = previous.since if previous is not None and same else seen
            current[key] = DeviceEntry(pod=new, report=report, since=since, seen=seen)
        self._by_pod[new.key] = current

    def entries(self, pod_keys: Iterable[str]) -> tuple[DeviceEntry, ...]:
        return tuple(entry for key in pod_keys for entry in self._by_pod.get(key, {}).values())
