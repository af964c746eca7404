"""The controller's caches: one informer per resource it watches, each counting
its decode errors under its name and watching as configured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuheal.config import Config
from gpuheal.controller.dra import DraIndex
from gpuheal.controller.fences import FenceCaches
from gpuheal.kube.api import (
    RESOURCE_API,
    KubeApi,
    gpufault_path,
    gpurollout_path,
    node_path,
    pod_path,
)
from gpuheal.kube.event_cache import EventCache
from gpuheal.kube.informer import Informer, J, V, default_key_of
from gpuheal.kube.pending import FIELD_SELECTOR as PENDING_FIELD_SELECTOR
from gpuheal.kube.pending import PendingPodJson, pending_pod_factory
from gpuheal.kube.projections import (
    ClaimJson,
    FaultJson,
    NodeJson,
    PodJson,
    RuleJson,
    SliceJson,
    canary_view,
    claim_view_factory,
    device_plugin_matcher,
    fault_record,
    fence_view,
    node_view,
    pod_view_factory,
    slice_view_factory,
)
from gpuheal.kube.rollouts import RolloutJson, RolloutState, state_of
from gpuheal.kube.validation import ValidationPodJson, validation_pod
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import (
    CANARY_LABEL,
    GPUFAULT_GROUP,
    CanaryView,
    ClaimView,
    FaultRecord,
    NodeView,
    PodView,
    SliceView,
)
from gpuheal.policy.fence import FENCE_LABEL, FENCE_LABEL_VALUE
from gpuheal.policy.sweep import PendingPod
from gpuheal.policy.validation import VALIDATION_LABEL, ValidationPod

# Only scheduled, live pods can hold a GPU: the API server filters the rest out.
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"

# A DRA API the API server does not serve is looked for again this often: turning one
# on takes an API server restart, and a cluster without DRA (or DeviceTaintRules at
# one of their two versions) must not be asked every 30 s forever.
DRA_RECHECK_S = 600.0


@dataclass(frozen=True)
class Caches:
    """Every informer of the controller (each keeps one store for its life)."""

    nodes: Informer[NodeJson, NodeView]
    pods: Informer[PodJson, PodView]
    records: Informer[FaultJson, FaultRecord]
    # Roll-outs (`gpuheal rollout`). Optional: a chart upgrade does not install new
    # CRDs (Helm leaves crds/ alone), and a cluster without this one must still
    # handle faults (Controller.unready_reasons).
    rollouts: Informer[RolloutJson, RolloutState]
    # Our canary pods, finished ones included (the pod informer drops those).
    canaries: Informer[PodJson, CanaryView]
    # Our validation Jobs' pods, finished ones included: the gate reads how they ended.
    validations: Informer[ValidationPodJson, ValidationPod]
    slices: Informer[SliceJson, SliceView]
    claims: Informer[ClaimJson, ClaimView]
    fences: FenceCaches
    # Unscheduled pods, for the idle-node sweep to yield to: watched only when the
    # sweep is on at start (turning it on takes a restart; see docs/operations.md).
    pending: Informer[PendingPodJson, PendingPod] | None
    # gpuheal's own Events, for the fault page; not among the caches that make a
    # replica ready: the console can do without them.
    events: EventCache

    @property
    def informers(self) -> tuple[Informer[Any, Any], ...]:
        """The caches that must sync before this replica is ready."""
        return (
            self.nodes,
            self.pods,
            self.records,
            self.canaries,
            self.rollouts,
            self.validations,
            self.slices,
            self.claims,
            *self.fences.informers,
            *((self.pending,) if self.pending is not None else ()),
        )

    @property
    def dra(self) -> tuple[Informer[Any, Any], ...]:
        return (self.slices, self.claims, *self.fences.informers)

    @property
    def of_gpuheal(self) -> tuple[Informer[Any, Any], ...]:
        """Those of gpuheal's own resources: one not served is a CRD not installed."""
        return tuple(i for i in self.informers if i.path.startswith(f"/apis/{GPUFAULT_GROUP}/"))


class CacheFactory:
    """Makes the controller's informers, each as configured and counted."""

    def __init__(self, api: KubeApi, config: Config, metrics: ControllerMetrics) -> None:
        self.api = api
        self.config = config
        self.metrics = metrics

    def caches(self, dra: DraIndex) -> Caches:
        config = self.config
        nodes, pods = self._nodes_and_pods(dra)
        slices, claims, fences = self._dra(frozenset(config.gpu_drivers))
        self.metrics.read_dra(dra.gpus, fences.served)
        return Caches(
            nodes=nodes,
            pods=pods,
            records=self.make("gpufaults", gpufault_path(), FaultJson, fault_record, _name),
            rollouts=self.make(
                "gpurollouts", gpurollout_path(), RolloutJson, state_of, _name, optional=True
            ),
            canaries=self.make(
                "canaries",
                pod_path(config.device_health.canary_namespace),
                PodJson,
                canary_view,
                _name,
                key_of=_by_name,
                label_selector=f"{CANARY_LABEL}=true",
            ),
            validations=self.make(
                "validations",
                pod_path(config.health_gate.validation.namespace),
                ValidationPodJson,
                validation_pod,
                _name,
                key_of=_by_name,
                label_selector=f"{VALIDATION_LABEL}=true",
            ),
            slices=slices,
            claims=claims,
            fences=fences,
            pending=self._pending() if config.sweep.enabled else None,
            events=EventCache(
                self.api,
                watch_timeout_s=config.watch_timeout_seconds,
                inactivity_s=config.watch_inactivity_seconds,
            ),
        )

    def make(
        self,
        name: str,
        path: str,
        json_type: type[J],
        to_view: Callable[[J], V],
        key: Callable[[V], str],
        *,
        field_selector: str = "",
        label_selector: str = "",
        key_of: Callable[[str, str], str] = default_key_of,
        optional: bool = False,
        join: Callable[[V], V] | None = None,
        missing_retry_s: float = 30.0,
    ) -> Informer[J, V]:
        """One of the controller's caches: its decode errors counted under its name,
        its watches as configured."""
        return Informer(
            self.api,
            path,
            json_type,
            to_view,
            key,
            name=name,
            field_selector=field_selector,
            label_selector=label_selector,
            key_of=key_of,
            on_decode_error=self.metrics.informer_decode_errors.labels(name).inc,
            watch_timeout_s=self.config.watch_timeout_seconds,
            inactivity_s=self.config.watch_inactivity_seconds,
            optional=optional,
            join=join,
            missing_retry_s=missing_retry_s,
        )

    def _nodes_and_pods(
        self, dra: DraIndex
    ) -> tuple[Informer[NodeJson, NodeView], Informer[PodJson, PodView]]:
        """Every node, and every pod not finished; each view joined to its DRA devices."""
        config = self.config
        nodes = self.make("nodes", node_path(), NodeJson, node_view, _name, join=dra.with_node)
        pod_view = pod_view_factory(
            config.is_gpu_resource,
            device_plugin_matcher(
                config.health_gate.device_plugin_selector,
                config.health_gate.device_plugin_namespaces,
            ),
            frozenset(config.gpu_drivers),
        )
        pods = self.make(
            "pods", "/api/v1/pods", PodJson, pod_view, lambda p: p.key,
            field_selector=POD_FIELD_SELECTOR, join=dra.with_pod,
        )  # fmt: skip
        return nodes, pods

    def _dra(
        self, drivers: frozenset[str]
    ) -> tuple[Informer[SliceJson, SliceView], Informer[ClaimJson, ClaimView], FenceCaches]:
        """ResourceSlices and ResourceClaims: optional, as a cluster may not serve DRA
        (then every GPU is an extended resource, and both caches stay empty). And our
        device fences (DeviceTaintRules, controller/fences.py): optional too."""
        slices = self.make(
            "resourceslices", f"{RESOURCE_API}/resourceslices", SliceJson,
            slice_view_factory(drivers), _name, optional=True, missing_retry_s=DRA_RECHECK_S,
        )  # fmt: skip
        claims = self.make(
            "resourceclaims", f"{RESOURCE_API}/resourceclaims", ClaimJson,
            claim_view_factory(drivers), lambda c: c.key, optional=True,
            missing_retry_s=DRA_RECHECK_S,
        )  # fmt: skip
        fences = FenceCaches(
            lambda name, path: self.make(
                name, path, RuleJson, fence_view, _name,
                label_selector=f"{FENCE_LABEL}={FENCE_LABEL_VALUE}", optional=True,
                missing_retry_s=DRA_RECHECK_S,
            )
        )  # fmt: skip
        return slices, claims, fences

    def _pending(self) -> Informer[PendingPodJson, PendingPod]:
        return self.make(
            "pending-pods", "/api/v1/pods", PendingPodJson,
            pending_pod_factory(self.config.is_gpu_resource),
            lambda p: f"{p.namespace}/{p.name}", field_selector=PENDING_FIELD_SELECTOR,
        )  # fmt: skip


def _name(view: Any) -> str:
    return str(view.name)


def _by_name(_namespace: str, name: str) -> str:
    return name
