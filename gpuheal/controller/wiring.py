"""The controller's composition root: every part built and joined here, once, in
the order an event flows through them (caches, the fleet's indexes, the
reconciler's memories, the handlers that queue), then the loops the leader runs.
The Controller (app.py) runs what this returns; nothing here starts anything.

Configuration reaches the parts one way each: a part that reads it where it needs
it is given `settings.current`; a part that keeps values from it subscribes to
`settings` (wired here, next to the part), and is told on each reload."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuheal.api.console.feed import ChangeFeed
from gpuheal.config import Config
from gpuheal.controller.caches import CacheFactory, Caches
from gpuheal.controller.dra import DraIndex
from gpuheal.controller.effects.context import WriteThrough
from gpuheal.controller.executor import Crashpoint, Executor
from gpuheal.controller.fleet import Fleet
from gpuheal.controller.handlers import EventHandlers
from gpuheal.controller.hygiene import HygieneLoop
from gpuheal.controller.intake import ConsoleCaches, ControllerIntake
from gpuheal.controller.maintenance import MaintenanceLoop
from gpuheal.controller.notify import Notifier
from gpuheal.controller.reconciler import Reconciler
from gpuheal.controller.retention import RecordCollector
from gpuheal.controller.rollouts import RolloutLoop
from gpuheal.controller.settings import Settings
from gpuheal.controller.signals import ExternalSignals
from gpuheal.controller.sweep import SweepCaches, SweepLoop
from gpuheal.controller.worker import ReconcileFailures
from gpuheal.kube.api import KubeApi
from gpuheal.kube.events import EventRecorder, ObjectRef, node_ref
from gpuheal.kube.workqueue import WorkQueue
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.policy.sweep import SweepPass
from gpuheal.sources import hygiene
from gpuheal.sources import sweep as sweep_source
from gpuheal.supervisor import Supervisor
from gpuheal.vocabulary import Reason


class Standing(Protocol):
    """What the parts ask of the running controller (app.py's Controller)."""

    @property
    def ready(self) -> bool:
        """Caches synced and the GPUFault schema this version's: writes may go."""
        ...

    @property
    def leading(self) -> bool: ...

    def rollout_schema_ok(self) -> bool: ...

    def fence_said(self) -> str: ...


@dataclass(frozen=True)
class Parts:
    """The controller's parts, joined."""

    caches: Caches
    dra: DraIndex
    queue: WorkQueue
    recorder: EventRecorder
    failures: ReconcileFailures
    executor: Executor
    notifier: Notifier
    fleet: Fleet
    external: ExternalSignals
    reconciler: Reconciler
    handlers: EventHandlers
    collector: RecordCollector
    changes: ChangeFeed
    intake: ControllerIntake
    hygiene: HygieneLoop
    sweep: SweepLoop
    rollouts: RolloutLoop
    maintenance: MaintenanceLoop


def wire(
    settings: Settings,
    api: KubeApi,
    *,
    identity: str,
    metrics: ControllerMetrics,
    supervisor: Supervisor,
    standing: Standing,
    crashpoint: Crashpoint | None = None,
) -> Parts:
    """Every part of the controller, built and joined (`crashpoint`: the harness's
    crash tests' hook, gpuheal/sim/crashing.py)."""
    config, current = settings.current(), settings.current
    dra = DraIndex()  # GPUs offered through DRA, joined into the node and pod views
    caches = CacheFactory(api, config, metrics).caches(dra)
    queue = _queue(settings)
    recorder = EventRecorder(
        api, identity, counted=lambda result: metrics.events.labels(result).inc()
    )
    notifier = Notifier(
        config.notification_sinks,
        counted=lambda result: metrics.notifications.labels(result).inc(),
    )
    settings.subscribe(lambda c: setattr(notifier, "sinks", c.notification_sinks))
    fleet = _fleet(current, caches, dra)
    external = ExternalSignals(config.external_signal_ttl_seconds)
    settings.subscribe(lambda c: setattr(external, "ttl_s", c.external_signal_ttl_seconds))
    executor = _executor(api, current, caches, recorder, metrics=metrics, crashpoint=crashpoint)
    reconciler = _reconciler(current, caches, fleet, external, executor=executor,
                             metrics=metrics, notifier=notifier)  # fmt: skip
    handlers = EventHandlers(queue, fleet, caches.records, external_nodes=external.nodes)
    handlers.watch(
        caches.nodes, caches.pods, caches.records, caches.canaries, caches.fences.informers
    )
    caches.validations.handlers.append(handlers.on_validation)
    _read_at_scrape(metrics, fleet, queue, reconciler)
    changes = ChangeFeed()
    intake = _intake(settings, reconciler, caches, queue=queue, changes=changes, standing=standing)
    return Parts(
        caches=caches, dra=dra, queue=queue, recorder=recorder,
        failures=_failures(metrics, recorder, caches), executor=executor, notifier=notifier,
        fleet=fleet, external=external, reconciler=reconciler, handlers=handlers,
        collector=RecordCollector(api, records=caches.records.values, config=current,
                                  reported=reconciler.reported_faults, metrics=metrics),
        changes=changes, intake=intake,
        hygiene=_hygiene(current, caches, fleet, intake, metrics),
        sweep=_sweep(current, api, caches, fleet=fleet, intake=intake, recorder=recorder,
                     metrics=metrics),
        # GPURollouts and `gpuheal maintenance` requests: the leader's alone.
        rollouts=RolloutLoop(current, api, rollouts=caches.rollouts.values, identity=identity,
                             schema_ok=standing.rollout_schema_ok, supervisor=supervisor),
        maintenance=MaintenanceLoop(current, api, nodes=caches.nodes.values, identity=identity,
                                    supervisor=supervisor),
    )  # fmt: skip


def _executor(
    api: KubeApi,
    current: Callable[[], Config],
    caches: Caches,
    recorder: EventRecorder,
    *,
    metrics: ControllerMetrics,
    crashpoint: Crashpoint | None,
) -> Executor:
    return Executor(
        api,
        caches=WriteThrough.over(
            caches.nodes, caches.records, caches.pods, caches.canaries, caches.fences
        ),
        recorder=recorder,
        metrics=metrics,
        config=current,
        crashpoint=crashpoint,
    )


def _reconciler(
    current: Callable[[], Config],
    caches: Caches,
    fleet: Fleet,
    external: ExternalSignals,
    *,
    executor: Executor,
    metrics: ControllerMetrics,
    notifier: Notifier,
) -> Reconciler:
    return Reconciler(
        config=current,
        nodes=caches.nodes,
        pods=caches.pods,
        records=caches.records,
        fleet=fleet,
        external=external,
        executor=executor,
        metrics=metrics,
        notify=notifier.notify,
        canaries=caches.canaries.store,
        pods_synced=caches.pods.synced.is_set,
        rollouts=caches.rollouts,
        validations=caches.validations.values,
        fences=caches.fences.of,
    )


def _queue(settings: Settings) -> WorkQueue:
    """Failed reconciles and refused device evictions back off as documented for
    evictions (node evictions keep their own per-pod schedule, same settings)."""
    config = settings.current()
    queue = WorkQueue(
        backoff_base_s=config.eviction_retry_base_seconds,
        backoff_max_s=config.eviction_retry_max_seconds,
        jitter=0.1,
    )
    settings.subscribe(
        lambda c: queue.set_backoff(c.eviction_retry_base_seconds, c.eviction_retry_max_seconds)
    )
    return queue


def _fleet(current: Callable[[], Config], caches: Caches, dra: DraIndex) -> Fleet:
    """The fleet's indexes see each event first, then the DRA index joins views."""
    fleet = Fleet(current)
    fleet.watch(caches.nodes, caches.pods, caches.records)
    dra.watch(
        caches.slices,
        caches.claims,
        caches.pods,
        lambda n: fleet.pods_by_node.get(n, ()),
        refresh=(caches.nodes.refresh, caches.pods.refresh),
        fences=caches.fences.informers,
    )
    return fleet


def _failures(
    metrics: ControllerMetrics, recorder: EventRecorder, caches: Caches
) -> ReconcileFailures:
    def node_of(name: str) -> ObjectRef:
        node = caches.nodes.get(name)
        return node_ref(name, node.uid, node.resource_version) if node else node_ref(name)

    return ReconcileFailures(
        counted=lambda reason: metrics.reconcile_errors.labels(reason).inc(),
        warn=lambda node, note: recorder.emit(
            node_of(node),
            reason=Reason.RECONCILE_FAILED,
            note=note,
            action="Reconcile",
            warning=True,
        ),
    )


def _intake(
    settings: Settings,
    reconciler: Reconciler,
    caches: Caches,
    *,
    queue: WorkQueue,
    changes: ChangeFeed,
    standing: Standing,
) -> ControllerIntake:
    """The API's side of the controller. The console's live updates: every cache
    change bumps a version (last, so a page drawn on the bump sees the fleet's
    indexes current)."""
    for informer in (caches.nodes, caches.pods, caches.records, caches.events):
        informer.handlers.append(changes.on_change)
    intake = ControllerIntake(
        reconciler,
        caches.nodes,
        caches.records,
        enqueue=queue.add,
        synced=lambda: standing.ready,
        leading=lambda: standing.leading,
        caches=ConsoleCaches(
            caches.nodes.store,
            caches.pods.store,
            caches.records.store,
            caches.events,
            standing.fence_said,
        ),
        changes=changes,
    )
    settings.subscribe(lambda c: setattr(intake.observed, "ttl_s", c.external_signal_ttl_seconds))
    return intake


def _hygiene(
    current: Callable[[], Config],
    caches: Caches,
    fleet: Fleet,
    intake: ControllerIntake,
    metrics: ControllerMetrics,
) -> HygieneLoop:
    """Fleet hygiene from the caches: gpuheal_hygiene_* and, as configured, signals."""
    loop = HygieneLoop(
        current,
        nodes=caches.nodes.values,
        pod=caches.pods.get,
        pods_by_node=fleet.pods_by_node,
        records=caches.records.values,
        port=intake.port(hygiene.SOURCE),
    )
    metrics.read_hygiene(lambda: loop.last)
    return loop


def _sweep(
    current: Callable[[], Config],
    api: KubeApi,
    caches: Caches,
    *,
    fleet: Fleet,
    intake: ControllerIntake,
    recorder: EventRecorder,
    metrics: ControllerMetrics,
) -> SweepLoop:
    """The idle-node sweep, the leader's (started with the workers)."""
    pending = caches.pending
    sweep_caches = SweepCaches(
        nodes=caches.nodes.values,
        pods_by_node=fleet.pods_by_node,
        pod=caches.pods.get,
        pending=pending.values if pending is not None else None,
        checks=caches.validations.values,
        records=caches.records.values,
        managed=lambda node: intake.node_status(node) == "managed",
        put_node=lambda view: caches.nodes.upsert(view, view.resource_version),
    )

    def looked(seen: SweepPass) -> None:
        metrics.sweep_running.set(seen.running)
        metrics.sweep_waiting.set(seen.due)

    loop = SweepLoop(
        current,
        api,
        sweep_caches,
        recorder=recorder,
        port=intake.port(sweep_source.SOURCE),
        counted=lambda result: metrics.sweep_checks.labels(result).inc(),
        looked=looked,
    )
    if pending is not None:
        pending.handlers.append(loop.on_pending)
    return loop


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
