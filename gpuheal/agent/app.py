"""`gpuheal agent`: probe rounds -> verdict -> debounce -> report on the own Node.

The loop never stops for an API error: a failed report is retried with
backoff on later rounds, and whatever was found meanwhile is reported once the
API server answers again.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import start_http_server

from gpuheal.agent.config import AgentConfig
from gpuheal.agent.daemons import NodeDaemons
from gpuheal.agent.debounce import Debounce, Report, step
from gpuheal.agent.environment import EnvironmentProbe, HostPaths, read_driver_version
from gpuheal.agent.facts import Counters, gpu_processes, vbios_text
from gpuheal.agent.findings import ProbeResult, Verdict, verdict, with_access
from gpuheal.agent.infiniband import IbProbe
from gpuheal.agent.intake import EventIntake
from gpuheal.agent.kmsg import KmsgFollower, read_boot_id
from gpuheal.agent.nvml import NvmlProbe, Thresholds, XidWatcher
from gpuheal.agent.repair import Repairer, RepairLog, nvml_reset, smi_reset
from gpuheal.agent.reporter import NodeReporter, desired
from gpuheal.agent.smi import SmiProbe
from gpuheal.agent.sticky import StickyEvents
from gpuheal.agent.telling import Telling
from gpuheal.agent.timeouts import GuardedProbe
from gpuheal.clock import iso
from gpuheal.kube.blocking import BlockingKube
from gpuheal.metrics.agent import AgentMetrics
from gpuheal.model import (
    AGENT_ACCESS,
    CUDA_VERSION,
    DRIVER_VERSION,
    GPU_PROCESSES,
    MIG_LAYOUT,
    NODE_ENVIRONMENT,
    REPAIR_RESULT,
    VBIOS_VERSION,
)
from gpuheal.policy import access
from gpuheal.policy.backoff import backoff_delay
from gpuheal.policy.sharing import gpus_offered, label_counts_gpus, layout
from gpuheal.sources.annotations import written
from gpuheal.supervisor import Supervisor
from gpuheal.xid import VERSION as XID_CATALOGUE_VERSION

log = logging.getLogger(__name__)


class Agent:
    def __init__(
        self, config: AgentConfig, node: str, client: BlockingKube, nvml_lib: Any | None
    ) -> None:
        self.config = config
        self.node = node
        self.metrics = AgentMetrics()
        # The kernel-log follower's and the NVML event watcher's threads, and the
        # rounds (docs/agent.md#supervised-threads).
        self.supervisor = Supervisor(
            "agent", counted=lambda task: self.metrics.task_crashes.labels(task).inc()
        )
        self.metrics.xid_catalogue.labels(XID_CATALOGUE_VERSION).set(1)
        self.reporter = NodeReporter(client, node)
        self.state = Debounce()
        self.round = 0
        self._adopted = False
        self._next_report_at = 0.0
        self._report_failures = 0
        self._node_read_at = 0.0  # monotonic time of the last read of the Node
        self.boot_id = read_boot_id(config.boot_id_path)
        config.state_path.parent.mkdir(parents=True, exist_ok=True)
        self.sticky = StickyEvents(
            config.state_path.with_name(config.state_path.stem + "-faults.json"),
            self.boot_id,
            config.xid_hold_seconds,
            counted=self.metrics.state_file_errors.labels("faults").inc,
        )
        self.counters = Counters(dt.datetime.now(dt.UTC))
        self.intake = EventIntake(
            config,
            node,
            self.sticky,
            metrics=self.metrics,
            counters=self.counters,
            driver=self._driver_version,
            by_pci=lambda pci: self.nvml.devices.by_pci.get(pci) if self.nvml else None,
        )
        self._processes_at: float | None = None  # monotonic time of the last listing
        self._listed_pids: tuple[int, ...] | None = None
        self._processes = ""
        self.probes: list[Callable[[], ProbeResult]] = []
        self.told = Telling(self.metrics, node)
        self.nvml: NvmlProbe | None = None
        self.watcher: XidWatcher | None = None
        self.follower: KmsgFollower | None = None
        if config.nvml_enabled and nvml_lib is not None:
            self._add_nvml(config, nvml_lib)
        self.network: IbProbe | None = None
        self.environment: EnvironmentProbe | None = None
        self._add_probes_beside_nvml(config)
        self._next_repair_at = 0.0
        self._repair_failures = 0
        self.repairer = self._repairer(config, client, nvml_lib) if config.repair_enabled else None
        if config.kmsg_enabled:
            self._follow_kmsg(config)
        self.metrics.follow_access(self.reach)

    def _follow_kmsg(self, config: AgentConfig) -> None:
        """The kernel log's follower, its lines to the event intake."""
        self.follower = KmsgFollower(
            config.kmsg_path,
            config.state_path,
            self.boot_id,
            self.intake.on_kernel,
            state_corrupt=self.metrics.state_file_errors.labels("cursor").inc,
        )
        self.metrics.follow_kmsg(self.follower)
        self.intake.kernel_log = True

    def _add_nvml(self, config: AgentConfig, nvml_lib: Any) -> None:
        """The NVML probe, under its time limit, and NVML's Xid events where enabled."""
        self.nvml = NvmlProbe(
            nvml_lib,
            expected_gpus=self._expected_gpus,
            thresholds=Thresholds(config.temperature_warning_c, config.temperature_critical_c),
            processes_due=self._processes_due,
            limits=config.limits(),
        )
        guarded = GuardedProbe(
            "nvml",
            self.nvml.run,
            config.nvml_timeout_seconds,
            level=True,
            fault_after_s=config.driver_hang_seconds,
        )
        self.probes.append(guarded.run)
        if config.nvml_events:
            self.watcher = XidWatcher(nvml_lib, self.intake.on_nvml_xid)

    def _repairer(self, config: AgentConfig, client: BlockingKube, nvml_lib: Any) -> Repairer:
        """What answers the controller's repair requests (agent/repair.py)."""
        fake = config.nvml_backend == "fake" and nvml_lib is not None
        return Repairer(
            config,
            node=self.node,
            boot_id=self.boot_id,
            repairs=RepairLog(
                config.state_path.with_name(config.state_path.stem + "-repair.json"),
                counted=self.metrics.state_file_errors.labels("repair").inc,
            ),
            reset=nvml_reset(nvml_lib)
            if fake
            else smi_reset(config.repair_reset_command, config.repair_reset_timeout_seconds),
            nvml=nvml_lib if config.nvml_enabled else None,
            on_reset=self.sticky.clear_devices,
            daemons=NodeDaemons(client, self.node, config.repair_daemon_namespace)
            if config.repair_pause_labels or config.repair_daemon_namespace
            else None,
            release_nvml=self._release_nvml,
            resume_nvml=self._resume_nvml,
        )

    def _add_probes_beside_nvml(self, config: AgentConfig) -> None:
        """nvidia-smi, the node's network and the environment, each where enabled."""
        if config.smi_enabled:
            self.probes.append(
                GuardedProbe(
                    "smi",
                    SmiProbe(
                        config.smi_command,
                        config.smi_timeout_seconds,
                        expected_gpus=self._expected_gpus,
                        by_pci=self.intake.pci_to_uuid.get,
                    ).run,
                    config.smi_timeout_seconds + 1,
                    level=True,
                ).run
            )
        if config.ib_enabled:
            self.network = IbProbe(
                config.ib_sysfs_path, config.ib_expectations(), clock=time.monotonic
            )
            self.probes.append(self.network.run)
        if config.env_enabled:
            host = HostPaths(
                config.proc_root,
                config.host_root,
                config.runtime_config_paths,
                config.required_modules,
                config.nvswitch_pci_ids,
            )
            self.environment = EnvironmentProbe(
                config.device_paths,
                config.driver_version_path,
                host,
                config.env_facts_seconds,
                node=self.node,
            )
            self.probes.append(self.environment.run)

    # -- the agent's own NVML session, closed for a GPU reset ---------------------

    def _release_nvml(self) -> None:
        if self.watcher is not None and not self.watcher.pause():
            log.warning(
                "the NVML event thread did not close its session", extra={"node": self.node}
            )
        if self.nvml is not None:
            self.nvml.shutdown()

    def _resume_nvml(self) -> None:
        if self.watcher is not None:
            self.watcher.resume()

    def _driver_version(self) -> str:
        """NVLink5 Xids are decoded by the IntrInfo layout of the driver's release."""
        if self.nvml is not None and self.nvml.versions.driver:
            return self.nvml.versions.driver
        return read_driver_version(self.config.driver_version_path)

    def _processes_due(self) -> bool:
        """List the GPU processes this round? At most every processReportSeconds."""
        every = self.config.process_report_seconds
        now = time.monotonic()
        if every <= 0 or (self._processes_at is not None and now - self._processes_at < every):
            return False
        self._processes_at = now
        return True

    def facts(self) -> dict[str, str]:
        """What the Node should say besides the verdict (agent/facts.py)."""
        facts = self.counters.facts()
        facts[AGENT_ACCESS] = access.encode(self.reach())
        if self.environment is not None and self.environment.value is not None:
            facts[NODE_ENVIRONMENT] = self.environment.value
        nvml = self.nvml
        if nvml is None:
            return facts
        if nvml.versions.driver:
            facts[DRIVER_VERSION] = nvml.versions.driver
        if nvml.versions.cuda:
            facts[CUDA_VERSION] = nvml.versions.cuda
        vbios = vbios_text(r.vbios for r in nvml.last_readings.values())
        if vbios:
            facts[VBIOS_VERSION] = vbios
        if nvml.mig is not None:
            facts[MIG_LAYOUT] = layout(nvml.mig)
        if nvml.pids is not None:
            if nvml.pids != self._listed_pids:
                self._listed_pids = nvml.pids
                self._processes = gpu_processes(
                    nvml.pids, self.config.proc_root, self.config.process_report_max
                )
            facts[GPU_PROCESSES] = self._processes
        return facts

    def _expected_gpus(self) -> int | None:
        """The GPUs this node should have: the config's count, else GFD's label (where
        it counts GPUs, not MIG devices), else the GPUs the node's capacity offers."""
        if self.config.expected_gpus is not None:
            return self.config.expected_gpus
        labels = self.reporter.labels
        label = labels.get(self.config.expected_gpus_label, "")
        if label.isdigit() and label_counts_gpus(labels):
            return int(label)
        return gpus_offered(labels, self.reporter.capacity)

    def reach(self) -> access.Access:
        """What the agent reaches now: NVML, the GPUs, the kernel log (policy/access.py)."""
        nvml, follower = self.nvml, self.follower
        if follower is None:
            kernel_log, kmsg_error = access.KMSG_OFF, ""
        elif follower.readable is None:
            kernel_log, kmsg_error = access.KMSG_PENDING, ""
        else:
            readable = follower.readable
            kernel_log = access.KMSG_OK if readable else access.KMSG_UNREADABLE
            kmsg_error = "" if readable else f"{self.config.kmsg_path}: {follower.error}"
        if nvml is None:
            return access.Access(access.NVML_OFF, kernel_log, kernel_log_error=kmsg_error)
        loaded = nvml.state == access.NVML_OK
        return access.Access(
            nvml.state,
            kernel_log,
            gpus=nvml.devices.count if loaded else None,
            expected=self._expected_gpus(),
            driver=nvml.versions.driver if loaded else "",
            nvml_version=nvml.versions.nvml if loaded else "",
            library=nvml.versions.library if loaded else "",
            nvml_error=nvml.error,
            kernel_log_error=kmsg_error,
        )

    # -- the loop ----------------------------------------------------------------

    def run_round(self) -> Verdict:
        self.round += 1
        self.metrics.rounds.inc()
        results = []
        for probe in self.probes:
            started = time.monotonic()
            result = probe()
            self.metrics.probe_duration.labels(result.probe).observe(time.monotonic() - started)
            if not result.ran:
                self.metrics.probe_failures.labels(result.probe).inc()
            results.append(result)
        if self.nvml is not None and self.nvml.ecc_uncorrected is not None:
            self.counters.ecc_total(self.nvml.ecc_uncorrected, dt.datetime.now(dt.UTC))
        if self.follower is not None or self.watcher is not None:
            results += self.intake.findings()
        self.told.warnings(results)
        self.told.usage(self.nvml)
        reach = self.reach()
        problems = access.problems(reach)
        self.told.access(reach, problems)
        seen = with_access(verdict(results), problems)
        before = self.state.reported
        self.state = step(
            self.state,
            seen,
            fail_rounds=self.config.fail_rounds,
            healthy_rounds=self.config.healthy_rounds,
            immediate_p0=self.config.immediate_p0_xid,
            new_fault_id=self._new_fault_id(),
            now=iso(dt.datetime.now(dt.UTC), "seconds"),
        )
        if before is None and self.state.reported is not None:
            log.warning(
                "fault reported",
                extra={
                    "node": self.node,
                    "fault_id": self.state.reported.fault_id,
                    "reason": self.state.reported.reason,
                    "severity": self.state.reported.severity.value,
                    "failing_rounds": self.state.failing,
                    "round": self.round,
                },
            )
        elif before is not None and self.state.reported is None:
            log.info(
                "fault cleared",
                extra={
                    "node": self.node,
                    "fault_id": before.fault_id,
                    "healthy_rounds": self.state.healthy,
                },
            )
        self.metrics.faulty.set(1 if self.state.reported else 0)
        self._report(seen)
        self._repair()
        return seen

    def _new_fault_id(self) -> str:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        return f"{self.node}-{stamp}-{uuid.uuid4().hex[:6]}"

    def _adopt(self, annotations: dict[str, str]) -> None:
        """Continue a fault this agent reported before a restart, with the same id."""
        earlier = written(annotations)
        if earlier is not None and self.state.reported is None:
            report = Report(
                earlier.fault_id,
                earlier.fault_time,
                earlier.reason,
                "reported before the agent restarted",
                earlier.devices,
                earlier.severity,
            )
            self.state = Debounce(reported=report)
            log.info(
                "continuing the reported fault",
                extra={"node": self.node, "fault_id": report.fault_id},
            )

    def _report(self, seen: Verdict) -> None:
        if time.monotonic() < self._next_report_at:
            return
        try:
            if not self._adopted:
                self._adopt(self.reporter.read())
                self._adopted = True
                self._node_read_at = time.monotonic()
            elif time.monotonic() - self._node_read_at >= self.config.node_read_seconds:
                self.reporter.read()  # labels and capacity, for the expected GPUs
                self._node_read_at = time.monotonic()
            if self.reporter.sync(desired(self.state.reported, seen), self.facts()):
                self.metrics.reports.inc()
            self._report_failures = 0
        except Exception as err:
            self._report_failures += 1
            self.metrics.report_failures.inc()
            delay = backoff_delay(self._report_failures, 0.5, 30.0)
            self._next_report_at = time.monotonic() + delay
            log.warning(
                "report failed",
                extra={"node": self.node, "error": str(err)[:300], "retry_s": delay},
            )

    def _repair(self) -> None:
        """Look for the controller's repair request on this Node (only while a fault
        is reported, or an attempt's result is still to be written) and answer it."""
        repairer = self.repairer
        if repairer is None or not self._adopted or time.monotonic() < self._next_repair_at:
            return
        if self.state.reported is None and not repairer.log.unanswered():
            return
        try:
            result = repairer.answer(self.reporter.annotations(), self.state.reported)
            if result is not None:
                self.reporter.annotate(REPAIR_RESULT, result.encode())
                repairer.written(result)
                self.metrics.repairs.labels(result.action.value, result.outcome.value).inc()
            self._repair_failures = 0
            self._next_repair_at = time.monotonic() + self.config.repair_poll_seconds
        except Exception as err:
            self._repair_failures += 1
            delay = backoff_delay(self._repair_failures, 0.5, 30.0)
            self._next_repair_at = time.monotonic() + delay
            self.metrics.report_failures.inc()
            log.warning(
                "repair request not answered",
                extra={"node": self.node, "error": str(err)[:300], "retry_s": delay},
            )

    def run(self, stop: threading.Event) -> None:
        """Rounds until `stop`; a round that raises ends the agent (said and counted
        as the task `rounds`): the kubelet restarts it, and it adopts its report."""
        if self.follower is not None:
            self.follower.start(self.supervisor)
        if self.watcher is not None:
            self.watcher.start(self.supervisor)

        def rounds() -> None:
            while not stop.is_set():
                started = time.monotonic()
                self.run_round()
                stop.wait(max(0.0, self.config.interval_seconds - (time.monotonic() - started)))

        try:
            self.supervisor.call("rounds", rounds)
        finally:
            if self.follower is not None:
                self.follower.stop()
            if self.watcher is not None:
                self.watcher.stop()


def serve_metrics(agent: Agent, port: int) -> int:
    """Start /metrics on 127.0.0.1-less 0.0.0.0:port (0: any free port); returns the port."""
    server, _thread = start_http_server(port, addr="0.0.0.0", registry=agent.metrics.registry)  # noqa: S104
    return int(server.server_port)
