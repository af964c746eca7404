"""The agent's hands on its node's GPU daemons around a reset (policy/daemons.py
decides): its Node's deploy labels, and the daemons' pods on this node in one
namespace. Every call is one request; the caller's round retries with backoff."""

from __future__ import annotations

import msgspec

from gpuheal.kube.api import STRATEGIC_PATCH, node_path, pod_path
from gpuheal.kube.blocking import BlockingKube
from gpuheal.kube.projections import NodeJson, PodJson
from gpuheal.policy.daemons import DaemonPod


class PodListJson(msgspec.Struct):
    items: list[PodJson] = []


def _ready(pod: PodJson) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


class NodeDaemons:
    def __init__(self, client: BlockingKube, node: str, namespace: str) -> None:
        self.client = client
        self.node = node
        self.namespace = namespace

    def labels(self) -> dict[str, str]:
        node = msgspec.json.decode(self.client.get(node_path(self.node)), type=NodeJson)
        return dict(node.metadata.labels)

    def set_labels(self, changes: dict[str, str]) -> None:
        """Through nodes/status, the agent's one write on its Node (the admission
        policy allows these keys and values only)."""
        if changes:
            body = {"metadata": {"labels": changes}}
            self.client.patch(f"{node_path(self.node)}/status", body, STRATEGIC_PATCH)

    def pods(self) -> list[DaemonPod]:
        """The pods in the daemons' namespace on this node."""
        if not self.namespace:
            return []
        raw = self.client.get(
            pod_path(self.namespace), {"fieldSelector": f"spec.nodeName={self.node}"}
        )
        listed = msgspec.json.decode(raw, type=PodListJson)
        return [
            DaemonPod(
                name=p.metadata.name,
                uid=p.metadata.uid,
                labels=dict(p.metadata.labels),
                phase=p.status.phase,
                ready=_ready(p),
                deleting=p.metadata.deletionTimestamp is not None,
            )
            for p in listed.items
        ]

    def delete(self, pod: DaemonPod) -> None:
        """Delete one pod, that one only (a precondition on its uid)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": pod.uid}}
        self.client.delete(pod_path(self.namespace, pod.name), body)
