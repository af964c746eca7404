"""Xids that are no node fault, as the controller's sources report them (an alert,
a DCGM sample, a manual request: `gpuheal.sources.xids.Observed`): counted by
source and xid, and told to the pod that used the GPU, never acted on.

The Event goes to the pod only when the pod is one the controller's cache holds, on
the node the report names, and a GPU pod: a label of an alert or a series is outside
input, and must not make the controller write Events about any pod it names.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from gpuheal.kube.events import EventRecorder, node_ref, pod_ref
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import PodView
from gpuheal.sources.xids import Observed
from gpuheal.vocabulary import Reason
from gpuheal.xid import Kind

log = logging.getLogger(__name__)

# Reports already told, so a repeat (Alertmanager's, every repeat_interval) counts
# once: at most this many, each for `ttl_s`.
REMEMBERED_MAX = 100_000


class ObservedXids:
    def __init__(
        self,
        metrics: ControllerMetrics,
        recorder: EventRecorder,
        pod: Callable[[str], PodView | None],
        *,
        ttl_s: float,
    ) -> None:
        self.metrics = metrics
        self.recorder = recorder
        self.pod = pod  # "namespace/name" -> the pod as the cache holds it
        self.ttl_s = ttl_s
        self._told: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def observe(self, seen: Observed, key: str = "") -> bool:
        """Count and tell one report; False (nothing done) when `key` (non-empty) was
        told for this source and node within the TTL."""
        if key and self._repeat((seen.source, seen.node, key)):
            return False
        kind = seen.row.kind.value
        self.metrics.xids_observed.labels(seen.source, str(seen.xid), kind).inc(seen.count)
        log.info(
            "Xid seen that is no node fault: counted, the node stays in service",
            extra={
                "source": seen.source,
                "node": seen.node,
                "xid": seen.xid,
                "kind": kind,
                "device": seen.device,
                "pod": f"{seen.namespace}/{seen.pod}" if seen.pod else "",
            },
        )
        self._tell_pod(seen)
        return True

    def _repeat(self, told: tuple[str, str, str]) -> bool:
        now = time.monotonic()
        while self._told and (
            len(self._told) > REMEMBERED_MAX or next(iter(self._told.values())) <= now
        ):
            self._told.popitem(last=False)
        if told in self._told:
            return True
        self._told[told] = now + self.ttl_s
        return False

    def _tell_pod(self, seen: Observed) -> None:
        if not seen.pod:
            return
        pod = self.pod(f"{seen.namespace}/{seen.pod}")
        if pod is None or pod.node != seen.node or not pod.gpu:
            return
        application = seen.row.kind is Kind.APPLICATION
        on = f" on GPU {seen.device}" if seen.device else ""
        advice = "restart the application" if application else "no action needed"
        note = (
            f"Xid {seen.xid} ({seen.row.reason}){on} of node {seen.node}, seen by {seen.source}:"
            f" NVIDIA: {advice} ({seen.row.nvidia}). Not a node fault: the node stays in"
            " service (only a rate of them on one GPU is one: applicationXids.perGpu)"
        )
        self.recorder.emit(
            pod_ref(pod.namespace, pod.name, pod.uid, pod.resource_version),
            reason=Reason.APPLICATION_XID if application else Reason.INFORMATIONAL_XID,
            note=note,
            action="Observe",
            warning=application,
            related=node_ref(seen.node),
        )
