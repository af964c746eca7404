"""`gpuheal controller`: wire informers, work queue, leader election, workers
and the HTTP endpoints, and run until told to stop.

Every replica runs the informers (standbys keep warm caches); only the leader
runs workers, and the API layer's write gate refuses writes from anyone else
(docs/architecture.md#the-write-gate).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuheal.api import token as api_token
from gpuheal.api.console.feed import ChangeFeed
from gpuheal.api.server import Api, ApiSettings, serve
from gpuheal.api.token import ApiTokens
from gpuheal.config import Config, ConfigError, load_config
from gpuheal.controller.dcgm_source import DcgmSource
from gpuheal.controller.dra import DraIndex
from gpuheal.controller.effects.context import WriteThrough
from gpuheal.controller.executor import Crashpoint, Executor
from gpuheal.controller.fences import FenceCaches
from gpuheal.controller.fleet import Fleet
from gpuheal.controller.handlers import EventHandlers
from gpuheal.controller.hygiene import HygieneLoop
from gpuheal.controller.intake import ConsoleCaches, ControllerIntake
from gpuheal.controller.maintenance import MaintenanceLoop
from gpuheal.controller.notify import Notifier
from gpuheal.controller.reconciler import Reconciler
from gpuheal.controller.retention import RecordCollector
from gpuheal.controller.rollouts import RolloutLoop
from gpuheal.controller.signals import ExternalSignals
from gpuheal.controller.sweep import SweepCaches, SweepLoop
from gpuheal.controller.worker import ReconcileFailures, work
from gpuheal.kube import crds
from gpuheal.kube.api import (
    RESOURCE_API,
    KubeApi,
    gpufault_path,
    gpurollout_path,
    node_path,
    pod_path,
)
from gpuheal.kube.event_cache import EventCache
from gpuheal.kube.events import EventRecorder, ObjectRef, node_ref
from gpuheal.kube.informer import Informer, J, V, default_key_of
from gpuheal.kube.leader import LeaderElector
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
from gpuheal.kube.workqueue import WorkQueue
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
from gpuheal.policy.devicefence import fence_problem
from gpuheal.policy.fence import FENCE_LABEL, FENCE_LABEL_VALUE
from gpuheal.policy.sweep import PendingPod, SweepPass
from gpuheal.policy.validation import VALIDATION_LABEL, ValidationPod
from gpuheal.sources import dcgm, hygiene
from gpuheal.sources import sweep as sweep_source
from gpuheal.sources.dcgm import Query
from gpuheal.sources.dcgm import queries as dcgm_queries
from gpuheal.supervisor import OnCrash, Supervisor
from gpuheal.vocabulary import Reason

log = logging.getLogger(__name__)

GPUFAULT_CRD = f"gpufaults.{GPUFAULT_GROUP}"
GPUROLLOUT_CRD = f"gpurollouts.{GPUFAULT_GROUP}"
CRD_CHECK_S = 10.0  # how often the served CRDs are compared with this version's

# Only scheduled, live pods can hold a GPU: the API server filters the rest out.
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class RunOptions:
    kubeconfig: Path | None = None
    config_path: Path | None = None  # re-read on SIGHUP and when the file changes
    identity: str = ""
    listen_host: str = "0.0.0.0"  # noqa: S104 -- probes and scrapes come from the cluster
    listen_port: int = 8080


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def advertised_address(listen_port: int) -> str:
    """Where the other replicas reach this one's API (on the Lease while it leads):
    the pod's IP from the downward API (POD_IP) and the port it listens on; "" when
    not known (then a standby answers 503 for what only the leader does)."""
    ip = os.environ.get("POD_IP", "")
    if not ip or not listen_port:
        return ""
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{listen_port}"


# A DRA API the API server does not serve is looked for again this often: turning one
# on takes an API server restart, and a cluster without DRA (or DeviceTaintRules at
# one of their two versions) must not be asked every 30 s forever.
DRA_RECHECK_S = 600.0


class Controller:
    def __init__(self, config: Config, api: KubeApi, identity: str) -> None:
        self.config = config
        self.api = api
        self.identity = identity
        self.metrics = ControllerMetrics()
        # Every background task runs under it (docs/controller.md#supervised-tasks);
        # a crash of one whose restart is unsafe ends the controller (run() returns 1).
        self._stop: asyncio.Event | None = None
        self.supervisor = Supervisor(
            "controller",
            counted=lambda task: self.metrics.task_crashes.labels(task).inc(),
            fatal=lambda _task: self._stop.set() if self._stop is not None else None,
        )
        # GPUs offered through DRA, joined into the node and pod views (controller/dra.py).
        self.dra = DraIndex()
        self.nodes, self.pods = self._node_and_pod_informers(config)
        self.slices, self.claims, self.fences = self._dra_informers(frozenset(config.gpu_drivers))
        self.records: Informer[FaultJson, FaultRecord] = self._informer(
            "gpufaults", gpufault_path(), FaultJson, fault_record, lambda r: r.name
        )
        # Roll-outs (`gpuheal rollout`): which to drive (controller/rollouts.py), and
        # the recovery gate's driver rule.
        # Optional: a chart upgrade does not install new CRDs (Helm leaves crds/ alone),
        # and a cluster without this one must still handle faults (unready_reasons).
        self.rollouts: Informer[RolloutJson, RolloutState] = self._informer(
            "gpurollouts", gpurollout_path(), RolloutJson, state_of, lambda r: r.name,
            optional=True,
        )  # fmt: skip
        # Our canary pods, finished ones included (the pod informer drops those).
        self.canaries: Informer[PodJson, CanaryView] = self._informer(
            "canaries",
            pod_path(config.device_health.canary_namespace),
            PodJson,
            canary_view,
            lambda c: c.name,
            key_of=lambda _namespace, name: name,
            label_selector=f"{CANARY_LABEL}=true",
        )
        # Our validation Jobs' pods, finished ones included: the gate reads how they ended.
        self.validations: Informer[ValidationPodJson, ValidationPod] = self._informer(
            "validations",
            pod_path(config.health_gate.validation.namespace),
            ValidationPodJson,
            validation_pod,
            lambda v: v.name,
            key_of=lambda _namespace, name: name,
            label_selector=f"{VALIDATION_LABEL}=true",
        )
        # Failed reconciles and refused device evictions back off as documented for
        # evictions (node evictions keep their own per-pod schedule, same settings).
        self.queue = WorkQueue(
            backoff_base_s=config.eviction_retry_base_seconds,
            backoff_max_s=config.eviction_retry_max_seconds,
            jitter=0.1,
        )
        caches = WriteThrough.over(self.nodes, self.records, self.pods, self.canaries, self.fences)
        self.recorder = EventRecorder(
            api, identity, counted=lambda result: self.metrics.events.labels(result).inc()
        )
        self.failures = ReconcileFailures(
            counted=lambda reason: self.metrics.reconcile_errors.labels(reason).inc(),
            warn=lambda node, note: self.recorder.emit(
                self._node_ref(node),
                reason=Reason.RECONCILE_FAILED,
                note=note,
                action="Reconcile",
                warning=True,
            ),
        )
        self.executor = Executor(
            api,
            caches=caches,
            recorder=self.recorder,
            metrics=self.metrics,
            config=lambda: self.config,
            crashpoint=Crashpoint.from_env(),
        )
        self.notifier = Notifier(
            config.notification_sinks,
            counted=lambda result: self.metrics.notifications.labels(result).inc(),
        )
        # The fleet's indexes see each event first, then the reconciler's memories,
        # then the handlers that decide what to queue.
        self.fleet = Fleet(lambda: self.config)
        self.fleet.watch(self.nodes, self.pods, self.records)
        self.dra.watch(
            self.slices,
            self.claims,
            self.pods,
            lambda n: self.fleet.pods_by_node.get(n, ()),
            refresh=(self.nodes.refresh, self.pods.refresh),
            fences=self.fences.informers,
        )
        self.external = ExternalSignals(config.external_signal_ttl_seconds)
        self.reconciler = Reconciler(
            config=lambda: self.config,
            nodes=self.nodes,
            pods=self.pods,
            records=self.records,
            fleet=self.fleet,
            external=self.external,
            executor=self.executor,
            metrics=self.metrics,
            notify=self.notifier.notify,
            canaries=self.canaries.store,
            pods_synced=self.pods.synced.is_set,
            rollouts=self.rollouts,
            validations=self.validations.values,
            fences=self.fences.of,
        )
        self.handlers = EventHandlers(
            self.queue, self.fleet, self.records, external_nodes=self.external.nodes
        )
        self.handlers.watch(
            self.nodes, self.pods, self.records, self.canaries, self.fences.informers
        )
        self.validations.handlers.append(self.handlers.on_validation)
        _read_at_scrape(self.metrics, self.fleet, self.queue, self.reconciler)
        self.collector = RecordCollector(
            api,
            records=self.records.values,
            config=lambda: self.config,
            reported=self.reconciler.reported_faults,
            metrics=self.metrics,
        )
        # The console's live updates: every cache change bumps a version (last, so
        # a page drawn on the bump sees the fleet's indexes current).
        self.changes = ChangeFeed()
        # gpuheal's own Events, for the fault page; not among the caches that make
        # a replica ready: the console can do without them.
        self.events = EventCache(
            api,
            watch_timeout_s=config.watch_timeout_seconds,
            inactivity_s=config.watch_inactivity_seconds,
        )
        for informer in (self.nodes, self.pods, self.records, self.events):
            informer.handlers.append(self.changes.on_change)
        self.intake = ControllerIntake(
            self.reconciler,
            self.nodes,
            self.records,
            enqueue=self.queue.add,
            synced=lambda: self.synced and self.schema_ok,
            leading=lambda: self.leading,
            caches=ConsoleCaches(
                self.nodes.store, self.pods.store, self.records.store, self.events, self.fence_said
            ),
            changes=self.changes,
        )
        self.hygiene = self._hygiene_loop()
        self.sweep_loop = self._sweep_loop(api)
        # GPURollouts, driven by the leader alone (started with the workers).
        self.rollout_loop = RolloutLoop(
            lambda: self.config,
            api,
            rollouts=self.rollouts.values,
            identity=identity,
            schema_ok=lambda: self._current(GPUROLLOUT_CRD),
            supervisor=self.supervisor,
        )
        # `gpuheal maintenance` requests on nodes, carried out by the leader alone.
        self.maintenance_loop = MaintenanceLoop(
            lambda: self.config,
            api,
            nodes=self.nodes.values,
            identity=identity,
            supervisor=self.supervisor,
        )
        self.elector: LeaderElector | None = None
        le = config.leader_election
        if le.enabled:
            self.elector = LeaderElector(
                api,
                namespace=le.namespace,
                name=le.name,
                identity=identity,
                lease_s=le.lease_seconds,
                renew_deadline_s=le.renew_deadline_seconds,
                retry_s=le.retry_period_seconds,
                on_started=self._start_leading,
                on_stopped=self._stop_leading,
                counted=lambda reason: self.metrics.leader_election_errors.labels(reason).inc(),
            )
            api.write_gate = self.elector.may_write
        self._leader_tasks: tuple[str, ...] = ()  # the supervisor's, while leading
        self.api_tokens = ApiTokens(config.api_token_file)
        self.view_tokens = ApiTokens(
            config.console_view_token_file, "consoleViewTokenFile", "console view"
        )
        self._http: Api | None = None
        self._dcgm_source: DcgmSource | None = None
        # How the API server serves gpuheal's CRDs against this version's (kube/crds.py).
        self.crds: dict[str, crds.Served] = {}
        self._crds_error = ""

    def _hygiene_loop(self) -> HygieneLoop:
        """Fleet hygiene from the caches: gpuheal_hygiene_* and, as configured, signals."""
        loop = HygieneLoop(
            lambda: self.config,
            nodes=self.nodes.values,
            pod=self.pods.get,
            pods_by_node=self.fleet.pods_by_node,
            records=self.records.values,
            port=self.intake.port(hygiene.SOURCE),
        )
        self.metrics.read_hygiene(lambda: loop.last)
        return loop

    def _sweep_loop(self, api: KubeApi) -> SweepLoop:
        """The idle-node sweep, the leader's (started with the workers)."""
        # Unscheduled pods, for the idle-node sweep to yield to: watched only when the
        # sweep is on at start (turning it on takes a restart; see docs/operations.md).
        pending: Informer[PendingPodJson, PendingPod] | None = (
            self._informer(
                "pending-pods", "/api/v1/pods", PendingPodJson,
                pending_pod_factory(self.config.is_gpu_resource),
                lambda p: f"{p.namespace}/{p.name}", field_selector=PENDING_FIELD_SELECTOR,
            )
            if self.config.sweep.enabled
            else None
        )  # fmt: skip
        self.pending = pending
        caches = SweepCaches(
            nodes=self.nodes.values,
            pods_by_node=self.fleet.pods_by_node,
            pod=self.pods.get,
            pending=pending.values if pending is not None else None,
            checks=self.validations.values,
            records=self.records.values,
            managed=lambda node: self.intake.node_status(node) == "managed",
            put_node=lambda view: self.nodes.upsert(view, view.resource_version),
        )

        def looked(seen: SweepPass) -> None:
            self.metrics.sweep_running.set(seen.running)
            self.metrics.sweep_waiting.set(seen.due)

        loop = SweepLoop(
            lambda: self.config,
            api,
            caches,
            recorder=self.recorder,
            port=self.intake.port(sweep_source.SOURCE),
            counted=lambda result: self.metrics.sweep_checks.labels(result).inc(),
            looked=looked,
        )
        if pending is not None:
            pending.handlers.append(loop.on_pending)
        return loop

    def _node_ref(self, name: str) -> ObjectRef:
        node = self.nodes.get(name)
        return node_ref(name, node.uid, node.resource_version) if node else node_ref(name)

    def _node_and_pod_informers(
        self, config: Config
    ) -> tuple[Informer[NodeJson, NodeView], Informer[PodJson, PodView]]:
        """Every node, and every pod not finished; each view joined to its DRA devices."""
        nodes = self._informer(
            "nodes", node_path(), NodeJson, node_view, lambda n: n.name, join=self.dra.with_node
        )  # fmt: skip
        pod_view = pod_view_factory(
            config.is_gpu_resource,
            device_plugin_matcher(
                config.health_gate.device_plugin_selector,
                config.health_gate.device_plugin_namespaces,
            ),
            frozenset(config.gpu_drivers),
        )
        pods = self._informer(
            "pods",
            "/api/v1/pods",
            PodJson,
            pod_view,
            lambda p: p.key,
            field_selector=POD_FIELD_SELECTOR,
            join=self.dra.with_pod,
        )
        return nodes, pods

    def _fence_problem(self) -> str | None:
        """Where DRA GPUs have no fence: why (fence_problem), else None."""
        looked = all(i.synced.is_set() for i in self.fences.informers)
        served, effect = self.fences.served(), self.config.device_health.fence
        return fence_problem(self.dra.gpus(), served, looked, effect)

    def fence_said(self) -> str:
        """Which fence a bad DRA GPU gets, in a sentence; "" without DRA GPUs."""
        gpus, served = self.dra.gpus(), self.fences.served()
        problem = self._fence_problem()
        if problem or not gpus or not served:
            return problem or ""
        return (
            f"device fence: a bad one of the {gpus} DRA GPUs gets a DeviceTaintRule "
            f"(resource.k8s.io/{served}, {self.config.device_health.fence})"
        )

    def _dra_informers(
        self, drivers: frozenset[str]
    ) -> tuple[Informer[SliceJson, SliceView], Informer[ClaimJson, ClaimView], FenceCaches]:
        """ResourceSlices and ResourceClaims: optional, as a cluster may not serve DRA
        (then every GPU is an extended resource, and both caches stay empty). And our
        device fences (DeviceTaintRules, controller/fences.py): optional too."""
        slices = self._informer(
            "resourceslices", f"{RESOURCE_API}/resourceslices", SliceJson,
            slice_view_factory(drivers), lambda s: s.name, optional=True,
            missing_retry_s=DRA_RECHECK_S,
        )  # fmt: skip
        claims = self._informer(
            "resourceclaims", f"{RESOURCE_API}/resourceclaims", ClaimJson,
            claim_view_factory(drivers), lambda c: c.key, optional=True,
            missing_retry_s=DRA_RECHECK_S,
        )  # fmt: skip
        fences = FenceCaches(
            lambda name, path: self._informer(
                name,
                path,
                RuleJson,
                fence_view,
                lambda f: f.name,
                label_selector=f"{FENCE_LABEL}={FENCE_LABEL_VALUE}",
                optional=True,
                missing_retry_s=DRA_RECHECK_S,
            )
        )
        self.metrics.read_dra(self.dra.gpus, fences.served)
        return slices, claims, fences

    def _decode_error_counter(self, informer: str) -> Callable[[], None]:
        counter = self.metrics.informer_decode_errors.labels(informer)  # exported from 0
        return counter.inc

    def _informer(
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
            on_decode_error=self._decode_error_counter(name),
            watch_timeout_s=self.config.watch_timeout_seconds,
            inactivity_s=self.config.watch_inactivity_seconds,
            optional=optional,
            join=join,
            missing_retry_s=missing_retry_s,
        )

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self._informers)

    @property
    def _informers(self) -> tuple[Informer[Any, Any], ...]:
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
    def _dra_caches(self) -> tuple[Informer[Any, Any], ...]:
        return (self.slices, self.claims, *self.fences.informers)

    @property
    def _crd_informers(self) -> tuple[Informer[Any, Any], ...]:
        """Those of gpuheal's own resources: one not served is a CRD not installed."""
        return tuple(i for i in self._informers if i.path.startswith(f"/apis/{GPUFAULT_GROUP}/"))

    @property
    def schema_ok(self) -> bool:
        """The GPUFault CRD served is this version's (or could not be read: said, not
        held against it). An older one would prune the fields this version writes."""
        return self._current(GPUFAULT_CRD)

    def _current(self, crd: str) -> bool:
        """The CRD served is this version's, or could not be read (said, not held)."""
        record = self.crds.get(crd)
        return record is None or record.state == crds.CURRENT

    async def check_crds(self) -> None:
        """Read the served CRDs and say, once per change, what is not this version's."""
        found: dict[str, crds.Served] = {}
        try:
            for name, manifest in crds.shipped().items():
                found[name] = await crds.served(self.api, name, manifest)
            self._crds_error = ""
        except Exception as err:  # RBAC or an outage: the check is retried, nothing held
            error = f"cannot read gpuheal's CRDs: {str(err)[:200]}"
            if error != self._crds_error:
                log.warning("CRD check failed", extra={"error": error})
            self._crds_error = error
            return
        for name, now in found.items():
            before = self.crds.get(name)
            if before is not None and before.state == now.state:
                continue
            if now.state != crds.CURRENT:
                log.error("CRD not this version's", extra={"crd": name, "detail": now.sentence()})
            elif before is not None:
                log.info("CRD current", extra={"crd": name})
        self.crds = found

    async def _watch_crds(self) -> None:
        while True:
            await asyncio.sleep(CRD_CHECK_S)
            await self.check_crds()

    def unready_reasons(self) -> list[str]:
        """What keeps this replica from being ready or from leading, for /readyz."""
        # A CRD whose informer finds it unserved is said once, below, with what is off.
        unserved = {f"{i.name}.{GPUFAULT_GROUP}" for i in self._crd_informers if i.missing}
        reasons = [
            s.sentence()
            for s in self.crds.values()
            if s.state != crds.CURRENT and not (s.state == crds.MISSING and s.name in unserved)
        ]
        if self._crds_error:
            reasons.append(self._crds_error)
        waiting = [i.name for i in self._informers if not i.synced.is_set()]
        if waiting:
            reasons.append(f"caches not synced: {', '.join(waiting)}")
        # Said, not unready: faults are handled without it.
        reasons += [
            f"{i.name}.{GPUFAULT_GROUP} is not served (its CRD is not installed: run "
            f"`{crds.APPLY_COMMAND}` or kubectl apply -f the chart's crds/): the features "
            "that need it are off"
            for i in self._crd_informers
            if i.missing
        ]
        if self.elector is not None and self.elector.problem:
            reasons.append(self.elector.problem)
        # Said, never a reason to be unready: an optional counter left out of
        # dcgm-exporter's list is a choice, and Prometheus is not the controller's.
        if self._dcgm_source is not None:
            reasons += self._dcgm_source.problems()
        # Said, not unready: the task restarts by itself (or the controller ends).
        reasons += self.supervisor.down()
        # Said, not unready: DRA is optional, and the chart grants what it needs.
        reasons += [
            f"cannot list {i.name} (forbidden): GPUs offered through DRA and the device "
            "fence are off until list and watch are granted (the chart's ClusterRole does)"
            for i in self._dra_caches
            if i.forbidden
        ]
        fence = self._fence_problem()
        reasons += [fence] if fence else []
        return reasons

    @property
    def leading(self) -> bool:
        return self.elector.is_leader if self.elector else bool(self._leader_tasks)

    async def _start_leading(self) -> None:
        self.metrics.leader.set(1)
        self.handlers.active = True
        for i in range(self.config.workers):
            # A worker that dies outside a reconcile (work() handles a reconcile's own
            # errors) leaves the queue's bookkeeping in doubt: the controller ends and
            # the next leader starts from every node.
            self.supervisor.spawn(f"worker-{i}", self._work, on_crash=OnCrash.END, kind="worker")
        self.supervisor.spawn("rollouts", self.rollout_loop.run)
        self.supervisor.spawn("maintenance-requests", self.maintenance_loop.run)
        self.supervisor.spawn("retention", self.collector.run)
        self.supervisor.spawn("sweep", self.sweep_loop.run)
        names = [f"worker-{i}" for i in range(self.config.workers)]
        self._leader_tasks = (*names, "rollouts", "maintenance-requests", "retention", "sweep")
        # Level-triggered start: look at every node once, whatever happened before we led.
        self.handlers.enqueue_all()

    async def _work(self) -> None:
        await work(
            self.queue,
            self.reconciler.reconcile,
            not_leader_retry_s=self.config.leader_election.retry_period_seconds,
            failures=self.failures,
        )

    async def _stop_leading(self) -> None:
        self.metrics.leader.set(0)
        self.handlers.active = False
        names, self._leader_tasks = self._leader_tasks, ()
        await self.supervisor.stop(*names)

    def http_api(self) -> Api:
        self.api_tokens.refresh()
        if self.view_tokens.path is not None:
            self.view_tokens.refresh()
        self._http = Api(
            self.intake,
            _api_settings(self.config),
            self.metrics,
            tokens=self.api_tokens,
            view_tokens=self.view_tokens,
            reasons=self.unready_reasons,
            leader_address=lambda: self.elector.leader_address if self.elector else "",
            identity=self.identity,
        )
        return self._http

    async def _resync(self) -> None:
        """Every `resyncSeconds`, queue every node the leader looks after, from the
        caches (no API request): a safety net for a change no event announced."""
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            if self.handlers.active:
                self.handlers.enqueue_all()
                log.debug("resync", extra={"queued": len(self.queue)})

    async def _watch_api_tokens(self) -> None:
        """Re-read the token file when it changes: a Secret update swaps it in place."""
        while True:
            await asyncio.sleep(api_token.POLL_S)
            self.api_tokens.refresh()
            if self.view_tokens.path is not None:
                self.view_tokens.refresh()

    def _dcgm(self, prometheus_url: str) -> DcgmSource:
        config = self.config
        self._dcgm_source = DcgmSource(
            prometheus_url,
            config.dcgm_interval_seconds,
            _dcgm_queries(config),
            port=self.intake.port(dcgm.SOURCE),
            metrics=self.metrics,
            observe=self.intake.observe,
            overrides=config.xid_overrides,
        )
        return self._dcgm_source

    def reload(self, path: Path) -> bool:
        """Re-read the config file; a bad one is refused and the running config kept."""
        try:
            config = load_config(path, check_files=True)
        except ConfigError as err:
            log.error(
                "config reload refused; keeping the running config", extra={"error": str(err)}
            )
            return False
        if config.leader_election != self.config.leader_election:
            log.warning("leaderElection changes need a restart; the rest is applied")
        if config.sweep.enabled and self.pending is None:
            # The pending pods it yields to are watched only when it is on at start.
            log.warning("turning sweep.enabled on needs a restart; the rest is applied")
        # What reads the config where it needs it (fleet, reconciler, executor,
        # retention) sees the new one from here; the rest takes it here.
        self.config = config
        self.queue.set_backoff(
            config.eviction_retry_base_seconds, config.eviction_retry_max_seconds
        )
        self.external.ttl_s = config.external_signal_ttl_seconds
        self.intake.observed.ttl_s = config.external_signal_ttl_seconds
        if self._dcgm_source is not None:
            self._dcgm_source.configure(_dcgm_queries(config), config.xid_overrides)
        self.notifier.sinks = config.notification_sinks
        self.api_tokens.use(config.api_token_file)
        self.view_tokens.use(config.console_view_token_file)
        if self._http is not None:
            if config.api_max_body_bytes != self._http.settings.max_body_bytes:
                log.warning("apiMaxBodyBytes changes need a restart; the rest is applied")
            self._http.configure(_api_settings(config, self._http.settings.max_body_bytes))
        log.info("config reloaded", extra={"mode": config.mode.value})
        self.handlers.enqueue_all()  # a mode switch applies to what is open now
        return True

    async def _watch_config(self, path: Path, hangup: asyncio.Event) -> None:
        """Reload on SIGHUP, or when the file changes (a ConfigMap update swaps it)."""

        def stamp() -> tuple[float, int]:
            try:
                info = path.stat()
            except OSError:
                return (0.0, 0)
            return (info.st_mtime, info.st_ino)

        seen = stamp()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hangup.wait(), timeout=5.0)
            current = stamp()
            if hangup.is_set() or current != seen:
                hangup.clear()
                seen = current
                self.reload(path)

    async def run(
        self, stop: asyncio.Event, options: RunOptions, hangup: asyncio.Event | None = None
    ) -> int:
        """Run until `stop` is set; 0, or 1 when a task whose restart is unsafe
        crashed (the supervisor set `stop`: the lease is released on the way out)."""
        self._stop = stop
        runner = await serve(self.http_api().app(), options.listen_host, options.listen_port)
        synced = asyncio.Event()
        self._start_tasks(options, synced, hangup or asyncio.Event())
        await self.check_crds()
        self.supervisor.spawn("crds", self._watch_crds)
        if self.elector is not None:
            self.elector.address = advertised_address(options.listen_port)
        try:
            await self._wait_synced(stop)
            synced.set()
            await self._wait_schema(stop)
            if not stop.is_set():
                log.info("caches synced", extra={"identity": self.identity})
                await self._lead_when_elected()
                await stop.wait()
        finally:
            if self.elector:
                await self.elector.release()
            else:
                await self._stop_leading()
            await self.supervisor.stop_all()
            self.queue.shutdown()
            await self.recorder.flush()
            if self._http is not None:
                await self._http.forwarder.close()
            await runner.cleanup()
        return 1 if self.supervisor.failed else 0

    def _start_tasks(
        self, options: RunOptions, synced: asyncio.Event, hangup: asyncio.Event
    ) -> None:
        """Every replica's background tasks, under the supervisor: each resumes from
        what it observes, so a crash restarts it after a backoff."""
        spawn = self.supervisor.spawn
        spawn("api-tokens", self._watch_api_tokens)
        spawn("resync", self._resync)
        spawn("notifier", self.notifier.run)
        path = options.config_path
        if path is not None:
            spawn("config", lambda: self._watch_config(path, hangup))
        if self.config.dcgm_prometheus_url:
            source = self._dcgm(self.config.dcgm_prometheus_url)
            spawn("dcgm", lambda: source.run(synced))
        spawn("hygiene", lambda: self.hygiene.run(synced))
        for informer in (*self._informers, self.events):
            spawn(f"informer-{informer.name}", informer.run)

    async def _lead_when_elected(self) -> None:
        """Take part in the election (its loop starts and stops the leader's tasks),
        or lead at once without one. A crashed election loop ends the controller: the
        lease it held is released on the way out and another replica takes over,
        rather than this one leading on a loop it cannot trust."""
        if self.elector is not None:
            self.supervisor.spawn("leader-election", self.elector.run, on_crash=OnCrash.END)
        else:
            await self._start_leading()

    async def _wait_schema(self, stop: asyncio.Event) -> None:
        """Never lead over an older GPUFault schema: its writes would lose fields.
        An upgrade's new replicas wait here (unready, /readyz says what to run) while
        the old ones go on leading."""
        while not self.schema_ok and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=CRD_CHECK_S)
            await self.check_crds()

    async def _wait_synced(self, stop: asyncio.Event) -> None:
        synced = asyncio.gather(*(i.synced.wait() for i in self._informers))
        stopped = asyncio.ensure_future(stop.wait())
        waiting: set[asyncio.Future[Any]] = {synced, stopped}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for future in waiting:
            future.cancel()


def _read_at_scrape(
    metrics: ControllerMetrics, fleet: Fleet, queue: WorkQueue, reconciler: Reconciler
) -> None:
    """The gauges of the fleet's state read the indexes and the reconciler's device
    counts when scraped, not pushed on each event or reconcile."""
    metrics.read_fleet(
        quarantined=lambda: len(fleet.quarantined),
        unmanaged=lambda: len(fleet.unmanaged),
        held=lambda: len(fleet.held),
        queued=lambda: len(queue),
    )
    metrics.read_devices(reconciler.device_counts.values)


def _dcgm_queries(config: Config) -> list[Query]:
    return dcgm_queries(
        config.dcgm_temperature_warning_c,
        config.dcgm_temperature_critical_c,
        overrides=config.xid_overrides,
        application_xids_per_gpu=config.application_xids.per_gpu,
        slowdown_window_s=config.dcgm_slowdown_window_seconds,
    )


def _api_settings(config: Config, max_body_bytes: int | None = None) -> ApiSettings:
    return ApiSettings(
        max_body_bytes=max_body_bytes or config.api_max_body_bytes,
        client_rate_per_second=config.api_client_rate_per_second,
        client_burst=config.api_client_burst,
        node_labels=config.alert_node_labels,
        open_reads=config.api_open_reads,
        resolved_alert_clears=config.resolved_alert_clears,
        console_secure_cookie=config.console_secure_cookie,
        xid_overrides=config.xid_overrides,
    )
