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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuheal.api import token as api_token
from gpuheal.api.server import Api, ApiSettings, serve
from gpuheal.api.token import ApiTokens
from gpuheal.config import Config, ConfigError, load_config
from gpuheal.controller import fences
from gpuheal.controller.dcgm_source import DcgmSource
from gpuheal.controller.executor import Crashpoint
from gpuheal.controller.schema import CRD_CHECK_S, GPUROLLOUT_CRD, SchemaCheck
from gpuheal.controller.settings import Settings, watch_file
from gpuheal.controller.wiring import wire
from gpuheal.controller.worker import work
from gpuheal.kube import crds
from gpuheal.kube.api import (
    KubeApi,
)
from gpuheal.kube.leader import LeaderElector
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import (
    GPUFAULT_GROUP,
)
from gpuheal.sources import dcgm
from gpuheal.sources.dcgm import Query
from gpuheal.sources.dcgm import queries as dcgm_queries
from gpuheal.supervisor import OnCrash, Supervisor

log = logging.getLogger(__name__)


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


# The longest a stopping leader waits to send its queued Events before the release:
# after it, the write gate refuses them, and they were lost (a restart right after
# a fence left its record without GPUFaultQuarantined).
FLUSH_BEFORE_RELEASE_S = 1.0


class Controller:
    """Runs the parts (wiring.py): the informers and every replica's tasks at once,
    the workers and the leader's loops while it leads; says what keeps it unready."""

    def __init__(
        self, config: Config, api: KubeApi, identity: str, *, crashpoint: Crashpoint | None = None
    ) -> None:
        self.settings = Settings(config)
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
        self.parts = wire(
            self.settings,
            api,
            identity=identity,
            metrics=self.metrics,
            supervisor=self.supervisor,
            standing=self,
            crashpoint=crashpoint,
        )
        self.caches = self.parts.caches
        self.reconciler = self.parts.reconciler
        self.elector = self._elector(config)
        self._leader_tasks: tuple[str, ...] = ()  # the supervisor's, while leading
        self.api_tokens = ApiTokens(config.api_token_file)
        self.view_tokens = ApiTokens(
            config.console_view_token_file, "consoleViewTokenFile", "console view"
        )
        self._http: Api | None = None
        self._dcgm_source: DcgmSource | None = None
        self.settings.subscribe(self._configure)
        self.schema = SchemaCheck(api)

    @property
    def config(self) -> Config:
        return self.settings.current()

    def _elector(self, config: Config) -> LeaderElector | None:
        le = config.leader_election
        if not le.enabled:
            return None
        elector = LeaderElector(
            self.api,
            namespace=le.namespace,
            name=le.name,
            identity=self.identity,
            lease_s=le.lease_seconds,
            renew_deadline_s=le.renew_deadline_seconds,
            retry_s=le.retry_period_seconds,
            on_started=self._start_leading,
            on_stopped=self._stop_leading,
            counted=lambda reason: self.metrics.leader_election_errors.labels(reason).inc(),
        )
        self.api.write_gate = elector.may_write
        return elector

    def fence_said(self) -> str:
        """Which fence a bad DRA GPU gets, in a sentence; "" without DRA GPUs."""
        effect = self.config.device_health.fence
        return fences.said(self.parts.dra.gpus(), self.caches.fences, effect)

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.caches.informers)

    @property
    def ready(self) -> bool:
        """Caches synced and the GPUFault schema this version's: writes may go."""
        return self.synced and self.schema_ok

    def rollout_schema_ok(self) -> bool:
        return self.schema.current(GPUROLLOUT_CRD)

    @property
    def schema_ok(self) -> bool:
        return self.schema.faults_ok

    def unready_reasons(self) -> list[str]:
        """What keeps this replica from being ready or from leading, for /readyz."""
        # A CRD whose informer finds it unserved is said once, below, with what is off.
        reasons = self.schema.reasons(
            f"{i.name}.{GPUFAULT_GROUP}" for i in self.caches.of_gpuheal if i.missing
        )
        waiting = [i.name for i in self.caches.informers if not i.synced.is_set()]
        if waiting:
            reasons.append(f"caches not synced: {', '.join(waiting)}")
        # Said, not unready: faults are handled without it.
        reasons += [
            f"{i.name}.{GPUFAULT_GROUP} is not served (its CRD is not installed: run "
            f"`{crds.APPLY_COMMAND}` or kubectl apply -f the chart's crds/): the features "
            "that need it are off"
            for i in self.caches.of_gpuheal
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
            for i in self.caches.dra
            if i.forbidden
        ]
        effect = self.config.device_health.fence
        fence = fences.problem(self.parts.dra.gpus(), self.caches.fences, effect)
        reasons += [fence] if fence else []
        return reasons

    @property
    def leading(self) -> bool:
        return self.elector.is_leader if self.elector else bool(self._leader_tasks)

    async def _start_leading(self) -> None:
        self.metrics.leader.set(1)
        self.parts.handlers.active = True
        for i in range(self.config.workers):
            # A worker that dies outside a reconcile (work() handles a reconcile's own
            # errors) leaves the queue's bookkeeping in doubt: the controller ends and
            # the next leader starts from every node.
            self.supervisor.spawn(f"worker-{i}", self._work, on_crash=OnCrash.END, kind="worker")
        self.supervisor.spawn("rollouts", self.parts.rollouts.run)
        self.supervisor.spawn("maintenance-requests", self.parts.maintenance.run)
        self.supervisor.spawn("retention", self.parts.collector.run)
        self.supervisor.spawn("sweep", self.parts.sweep.run)
        names = [f"worker-{i}" for i in range(self.config.workers)]
        self._leader_tasks = (*names, "rollouts", "maintenance-requests", "retention", "sweep")
        # Level-triggered start: look at every node once, whatever happened before we led.
        self.parts.handlers.enqueue_all()

    async def _work(self) -> None:
        await work(
            self.parts.queue,
            self.reconciler.reconcile,
            not_leader_retry_s=self.config.leader_election.retry_period_seconds,
            failures=self.parts.failures,
        )

    async def _stop_leading(self) -> None:
        self.metrics.leader.set(0)
        self.parts.handlers.active = False
        names, self._leader_tasks = self._leader_tasks, ()
        await self.supervisor.stop(*names)

    def http_api(self) -> Api:
        api_token.refresh(self.api_tokens, self.view_tokens)
        self._http = Api(
            self.parts.intake,
            _api_settings(self.config),
            self.metrics,
            tokens=self.api_tokens,
            view_tokens=self.view_tokens,
            reasons=self.unready_reasons,
            leader_address=lambda: self.elector.leader_address if self.elector else "",
            identity=self.identity,
        )
        return self._http

    def _dcgm(self, prometheus_url: str) -> DcgmSource:
        config = self.config
        self._dcgm_source = DcgmSource(
            prometheus_url,
            config.dcgm_interval_seconds,
            _dcgm_queries(config),
            port=self.parts.intake.port(dcgm.SOURCE),
            metrics=self.metrics,
            observe=self.parts.intake.observe,
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
        if config.sweep.enabled and self.caches.pending is None:
            # The pending pods it yields to are watched only when it is on at start.
            log.warning("turning sweep.enabled on needs a restart; the rest is applied")
        if (
            self._http is not None
            and config.api_max_body_bytes != self._http.settings.max_body_bytes
        ):
            log.warning("apiMaxBodyBytes changes need a restart; the rest is applied")
        # Parts that read the config see the new one from here; those that keep
        # values from it are told (Settings.subscribe, wired in wiring.py and below).
        self.settings.replace(config)
        log.info("config reloaded", extra={"mode": config.mode.value})
        self.parts.handlers.enqueue_all()  # a mode switch applies to what is open now
        return True

    def _configure(self, config: Config) -> None:
        """What the Controller itself keeps from the config, on a reload."""
        if self._dcgm_source is not None:
            self._dcgm_source.configure(_dcgm_queries(config), config.xid_overrides)
        self.api_tokens.use(config.api_token_file)
        self.view_tokens.use(config.console_view_token_file)
        if self._http is not None:
            self._http.configure(_api_settings(config, self._http.settings.max_body_bytes))

    async def run(
        self, stop: asyncio.Event, options: RunOptions, hangup: asyncio.Event | None = None
    ) -> int:
        """Run until `stop` is set; 0, or 1 when a task whose restart is unsafe
        crashed (the supervisor set `stop`: the lease is released on the way out)."""
        self._stop = stop
        runner = await serve(self.http_api().app(), options.listen_host, options.listen_port)
        synced = asyncio.Event()
        self._start_tasks(options, synced, hangup or asyncio.Event())
        await self.schema.check()
        self.supervisor.spawn("crds", self.schema.watch)
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
            # Still leading: the workers stop and their queued Events are sent
            # (bounded: a standby waits) before the release closes the write gate.
            await self._stop_leading()
            await self.parts.recorder.flush(timeout_s=FLUSH_BEFORE_RELEASE_S)
            if self.elector:
                await self.elector.release()
            await self.supervisor.stop_all()
            self.parts.queue.shutdown()
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
        spawn("api-tokens", lambda: api_token.watch(self.api_tokens, self.view_tokens))
        spawn("resync", lambda: self.parts.handlers.resync(lambda: self.config.resync_seconds))
        spawn("notifier", self.parts.notifier.run)
        path = options.config_path
        if path is not None:
            spawn("config", lambda: watch_file(path, hangup, self.reload))
        if self.config.dcgm_prometheus_url:
            source = self._dcgm(self.config.dcgm_prometheus_url)
            spawn("dcgm", lambda: source.run(synced))
        spawn("hygiene", lambda: self.parts.hygiene.run(synced))
        for informer in (*self.caches.informers, self.caches.events):
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
            await self.schema.check()

    async def _wait_synced(self, stop: asyncio.Event) -> None:
        synced = asyncio.gather(*(i.synced.wait() for i in self.caches.informers))
        stopped = asyncio.ensure_future(stop.wait())
        waiting: set[asyncio.Future[Any]] = {synced, stopped}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for future in waiting:
            future.cancel()


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
