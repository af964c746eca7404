"""Write the agent's verdict on its own Node: the GPUHealthy condition and the
fault annotations, plus the facts of agent/facts.py (versions, error counters,
GPU processes), in one PATCH of nodes/<name>/status, only when they change."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from gpuheal.agent.debounce import Report
from gpuheal.agent.facts import FACT_KEYS, changed_facts
from gpuheal.agent.findings import HEALTHY_MESSAGE, HEALTHY_REASON, Health, Verdict
from gpuheal.clock import iso
from gpuheal.kube.api import STRATEGIC_PATCH, node_path
from gpuheal.kube.blocking import BlockingKube
from gpuheal.kube.projections import NodeJson
from gpuheal.model import ANNOTATION_PREFIX, FAULT_ID, GPU_HEALTHY_CONDITION
from gpuheal.sources.annotations import KEYS, Annotated, encode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Desired:
    """What the Node should say. Annotation value None means: absent."""

    status: Health
    reason: str
    message: str
    annotations: tuple[tuple[str, str | None], ...]


def desired(report: Report | None, seen: Verdict) -> Desired:
    """The condition follows the reported fault (debounced), or the round's verdict
    while nothing is reported (True, or Unknown when the probes could not run)."""
    if report is not None:
        said = Annotated(
            report.fault_id, report.fault_time, report.reason, report.devices, report.severity
        )
        return Desired(
            Health.FAULTY, report.reason, report.message[:1024], tuple(encode(said).items())
        )
    cleared = tuple(encode(None).items())
    if seen.health is Health.UNKNOWN:
        return Desired(Health.UNKNOWN, seen.reason, seen.message[:1024], cleared)
    # GPUsHealthy, or what the agent cannot reach besides (KernelLogUnreadable).
    reason = seen.reason or HEALTHY_REASON
    message = seen.message if seen.reason != HEALTHY_REASON else HEALTHY_MESSAGE
    return Desired(Health.HEALTHY, reason, message[:1024], cleared)


def _now() -> str:
    return iso(dt.datetime.now(dt.UTC), "seconds")


class NodeReporter:
    def __init__(self, client: BlockingKube, node: str) -> None:
        self.client = client
        self.node = node
        self.written: Desired | None = None
        self.writes = 0
        self._transition = ""
        self.labels: dict[str, str] = {}
        self.capacity: dict[str, int] = {}  # the node's countable resources (GPUs)
        self.facts_written: dict[str, str] = {}

    def read(self) -> dict[str, str]:
        """The node's gpuheal annotations as they are now (and remember its labels)."""
        node = msgspec.json.decode(self.client.get(node_path(self.node)), type=NodeJson)
        self.labels = dict(node.metadata.labels)
        self.capacity = {k: int(v) for k, v in node.status.capacity.items() if v.isdigit()}
        annotations = dict(node.metadata.annotations)
        self.facts_written = {k: v for k, v in annotations.items() if k in FACT_KEYS}
        conditions = node.status.conditions
        current = next((c for c in conditions if c.type == GPU_HEALTHY_CONDITION), None)
        if current is not None:
            self._transition = current.lastTransitionTime or ""
            ours = tuple((k, annotations.get(k)) for k in KEYS)
            self.written = Desired(Health(current.status), current.reason, current.message, ours)
        return {k: v for k, v in annotations.items() if k in KEYS}

    def annotations(self) -> dict[str, str]:
        """The node's gpuheal annotations as they are now (nothing remembered)."""
        node = msgspec.json.decode(self.client.get(node_path(self.node)), type=NodeJson)
        return {
            k: v for k, v in node.metadata.annotations.items() if k.startswith(ANNOTATION_PREFIX)
        }

    def annotate(self, key: str, value: str) -> None:
        """One annotation of the agent's own (the repair result), in its own PATCH."""
        body = {"metadata": {"annotations": {key: value}}}
        self.client.patch(f"{node_path(self.node)}/status", body, STRATEGIC_PATCH)

    def sync(self, want: Desired, facts: Mapping[str, str] | None = None) -> bool:
        """PATCH when `want` or a fact differs from what was written last (a fact
        change alone leaves the condition as it is). Raises on API errors."""
        changed = changed_facts(self.facts_written, facts or {})
        verdict_changed = want != self.written
        if not verdict_changed and not changed:
            return False
        body: dict[str, Any] = {"metadata": {"annotations": {**changed}}}
        if verdict_changed:
            if self.written is None or self.written.status != want.status or not self._transition:
                self._transition = _now()
            body["metadata"]["annotations"].update(dict(want.annotations))
            body["status"] = {
                "conditions": [
                    {
                        "type": GPU_HEALTHY_CONDITION,
                        "status": want.status.value,
                        "reason": want.reason,
                        "message": want.message,
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": self._transition,
                    }
                ]
            }
        self.client.patch(f"{node_path(self.node)}/status", body, STRATEGIC_PATCH)
        self.written = want
        self.facts_written.update(changed)
        self.writes += 1
        if not verdict_changed:
            log.debug("facts reported", extra={"node": self.node, "facts": sorted(changed)})
            return True
        log.info(
            "reported",
            extra={
                "node": self.node,
                "status": want.status.value,
                "reason": want.reason,
                "fault_id": dict(want.annotations).get(FAULT_ID),
            },
        )
        return True
