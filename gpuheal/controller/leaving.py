"""Pods this controller evicted or deleted, until the cache shows them leaving.

A deletion cannot be undone, but the pod cache can briefly say otherwise: the
executor marks an evicted pod leaving at the version it read, and a watch event
written before the eviction (a status update, say) may still arrive after that
and show the pod as it was. A reconcile in that window would evict the pod a
second time. This memory keeps such a pod leaving, by UID, until the watch
delivers its deletionTimestamp or its removal.
"""

from __future__ import annotations

from dataclasses import replace

from gpuheal.model import PodView


class LeavingPods:
    def __init__(self) -> None:
        self._uids: dict[str, str] = {}  # pod key -> UID we evicted or deleted

    def __len__(self) -> int:
        return len(self._uids)

    def add(self, key: str, uid: str) -> None:
        self._uids[key] = uid

    def seen(self, pod: PodView) -> PodView:
        """The pod as the policy must see it: leaving if we made it leave."""
        if not pod.deleting and self._uids.get(pod.key) == pod.uid:
            return replace(pod, deleting=True)
        return pod

    def on_pod(self, old: PodView | None, new: PodView | None) -> None:
        """Forget a pod once the cache itself shows it leaving, gone or replaced."""
        pod = new or old
        if pod is None or pod.key not in self._uids:
            return
        if new is None or new.deleting or new.uid != self._uids[pod.key]:
            del self._uids[pod.key]
