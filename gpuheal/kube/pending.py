"""Pods waiting for a node, as the idle-node sweep weighs them (policy/sweep.py): the
controller watches unscheduled Pending pods (`FIELD_SELECTOR`) only while the
sweep is on, and keeps of each what the sweep asks: the GPUs it wants, whether
it wants DRA devices, its nodeSelector. A pod that wants no GPU, and gpuheal's own
(a validation Job's pod, the sweep's included, or a canary), is kept as an empty
view (the informer's store keys every pod) that never fits a node: the sweep's
check must not yield to its own pod.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from gpuheal.kube.projections import Container, Meta, PodClaimJson, quantity
from gpuheal.model import CANARY_LABEL, scheduled_gpus
from gpuheal.policy.sweep import PendingPod
from gpuheal.policy.validation import VALIDATION_LABEL

# Pods no node has been given yet: what the scheduler itself watches to place.
FIELD_SELECTOR = "spec.nodeName=,status.phase=Pending"


class _Spec(msgspec.Struct):
    containers: list[Container] = []
    initContainers: list[Container] = []  # noqa: N815 -- API field name
    resourceClaims: list[PodClaimJson] | None = None  # noqa: N815
    nodeSelector: dict[str, str] = {}  # noqa: N815


class PendingPodJson(msgspec.Struct):
    metadata: Meta
    spec: _Spec = msgspec.field(default_factory=_Spec)


def pending_pod_factory(
    is_gpu_resource: Callable[[str], bool],
) -> Callable[[PendingPodJson], PendingPod]:
    def count(container: Container, resource: str) -> int:
        wanted = {**container.resources.limits, **container.resources.requests}
        return quantity(wanted.get(resource, "0"))

    def view(pod: PendingPodJson) -> PendingPod:
        spec, labels = pod.spec, pod.metadata.labels
        if labels.get(VALIDATION_LABEL) == "true" or labels.get(CANARY_LABEL) == "true":
            return PendingPod(pod.metadata.namespace, pod.metadata.name)
        names = {
            n
            for c in (*spec.containers, *spec.initContainers)
            for n in (*c.resources.requests, *c.resources.limits)
            if is_gpu_resource(n)
        }
        wants = tuple(
            (n, scheduled_gpus((count(c, n) for c in spec.containers),
                               (count(c, n) for c in spec.initContainers)))
            for n in sorted(names)
        )  # fmt: skip
        return PendingPod(
            namespace=pod.metadata.namespace,
            name=pod.metadata.name,
            wants=tuple((n, k) for n, k in wants if k > 0),
            claims=bool(spec.resourceClaims),
            node_selector=tuple(sorted(spec.nodeSelector.items())),
        )

    return view
