"""Everything the node agent exports (docs/agent.md, "Metrics"): its probe rounds
and reports, and the kernel-log follower's counters, read when scraped."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuheal.metrics.declare import Metrics, counter, gauge, histogram
from gpuheal.policy import access

STATE_FILES = ("cursor", "faults", "repair")


class KernelLogReading(Protocol):
    """What the kernel-log follower counts (agent/kmsg.py's KmsgFollower)."""

    lines: int
    parse_errors: int
    errors: int
    started_at: float
    last_record_at: float | None

    @property
    def sxid_continuations(self) -> int: ...


class AgentMetrics(Metrics):
    probe_duration = histogram(
        "gpuheal_agent_probe_duration_seconds",
        "One probe call.",
        "probe",
        buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10),
    )
    probe_failures = counter(
        "gpuheal_agent_probe_failures_total", "Probe calls that could not run.", "probe"
    )
    task_crashes = counter(
        "gpuheal_agent_task_crashes_total",
        "Background threads that ended with an unexpected exception, by thread "
        "(restarted after a backoff, or the agent ends: docs/agent.md#supervised-threads).",
        "task",
    )
    xids = counter("gpuheal_agent_xid_total", "Xid events seen.", "xid")
    application_xids = counter(
        "gpuheal_agent_application_xid_total",
        "Application Xids (NVIDIA: restart the application) per GPU: never a node fault, "
        "only a rate of them on one GPU (applicationXidsPerGpu).",
        "gpu",
        "xid",
    )
    uncatalogued_xids = counter(
        "gpuheal_agent_xid_uncatalogued_total",
        "Xids the loaded NVIDIA catalogue does not know (gpuheal_agent_xid_catalogue_info "
        "says which): P1 node faults until a newer catalogue says what they are.",
        "xid",
    )
    xid_catalogue = gauge(
        "gpuheal_agent_xid_catalogue_info", "The NVIDIA Xid catalogue loaded (1).", "version"
    )
    sxids = counter(
        "gpuheal_agent_sxid_total",
        "NVSwitch SXid events seen, by the kind of their row (node: a node fault;"
        " informational: only counted).",
        "sxid",
        "kind",
    )
    nic_errors = counter(
        "gpuheal_agent_nic_errors_total",
        "NIC lines of the kernel log (mlx5 health, the transmit watchdog), by reason: the"
        " health ones hold the node, a transmit timeout is only counted.",
        "reason",
    )
    rounds = counter("gpuheal_agent_rounds_total", "Probe rounds.")
    reports = counter("gpuheal_agent_reports_total", "Writes to the Node.")
    report_failures = counter("gpuheal_agent_report_failures_total", "Node writes that failed.")
    faulty = gauge("gpuheal_agent_faulty", "1 while a fault is reported.")
    warnings = gauge(
        "gpuheal_agent_warning",
        "1 while a probe warns (a P2 finding: never a node fault), by reason and device"
        ' (a GPU UUID, an HCA port such as mlx5_0/1; "" for the node): docs/agent.md.',
        "reason",
        "device",
    )
    # Usage, for the chart's alerts (GPU memory nearly full; a GPU idle while processes
    # hold it, a stalled job): never a fault.
    gpu_utilization = gauge(
        "gpuheal_agent_gpu_utilization_ratio",
        "The GPU's utilisation (NVML's last sample period), 0 to 1, by GPU UUID.",
        "device",
    )
    gpu_memory_used = gauge(
        "gpuheal_agent_gpu_memory_used_ratio",
        "The GPU's memory in use, 0 to 1, by GPU UUID.",
        "device",
    )
    gpu_processes = gauge(
        "gpuheal_agent_gpu_processes",
        "Compute processes on the GPU at the last listing (processReportSeconds), by GPU"
        " UUID: their pods are the node's gpuheal.io/gpu-processes fact.",
        "device",
    )
    state_file_errors = counter(
        "gpuheal_agent_state_file_errors_total",
        "State files that could not be read, set aside as <file>.corrupt (a fresh start).",
        "file",
    )

    repairs = counter(
        "gpuheal_agent_repairs_total",
        "Repair requests answered, by action (reset-gpu, reboot) and outcome "
        "(done, failed, refused).",
        "action",
        "outcome",
    )

    def __init__(self) -> None:
        super().__init__()
        for state_file in STATE_FILES:
            self.state_file_errors.labels(state_file)  # exported from 0

    def follow_kmsg(self, follower: KernelLogReading) -> None:
        """Export the kernel-log follower's counters, read at scrape time."""
        self.registry.register(KmsgCollector(follower))

    def follow_access(self, reach: Callable[[], access.Access]) -> None:
        """Export what the agent reaches (NVML, the GPUs, the kernel log), read at scrape."""
        self.registry.register(AccessCollector(reach))


class AccessCollector(Collector):
    """NVML loaded or not and from where, the GPUs it sees against those the node
    offers, the kernel log readable, and each problem by the condition's reason
    (every reason exported, 0 or 1, so an alert on `== 1` never meets an absence)."""

    def __init__(self, reach: Callable[[], access.Access]) -> None:
        self.reach = reach

    def collect(self) -> Iterator[Metric]:
        now = self.reach()
        if now.nvml != access.NVML_OFF:
            yield GaugeMetricFamily(
                "gpuheal_agent_nvml_up",
                "1 while NVML is loaded and answers; 0 when it is not (the problem's reason"
                " says why).",
                value=1 if now.nvml == access.NVML_OK else 0,
            )
        info = GaugeMetricFamily(
            "gpuheal_agent_nvml_info",
            "The NVML loaded (1): the driver's and NVML's versions and the library file.",
            labels=["driver", "nvml", "library"],
        )
        if now.nvml == access.NVML_OK:
            info.add_metric([now.driver, now.nvml_version, now.library], 1)
        yield info
        if now.gpus is not None:
            yield GaugeMetricFamily("gpuheal_agent_gpus_visible", "GPUs NVML sees.", value=now.gpus)
        if now.expected is not None:
            yield GaugeMetricFamily(
                "gpuheal_agent_gpus_expected",
                "GPUs the node should have (expectedGpus, GFD's count, or its capacity).",
                value=now.expected,
            )
        if now.kernel_log in (access.KMSG_OK, access.KMSG_UNREADABLE):
            yield GaugeMetricFamily(
                "gpuheal_agent_kmsg_readable",
                "1 while the kernel log opens and reads; 0 when it cannot.",
                value=1 if now.kernel_log == access.KMSG_OK else 0,
            )
        problems = {p.reason for p in access.problems(now)}
        family = GaugeMetricFamily(
            "gpuheal_agent_access_problem",
            "1 while the agent cannot reach this piece (the GPUHealthy condition's reason).",
            labels=["reason"],
        )
        for reason in access.REASONS:
            family.add_metric([reason], 1 if reason in problems else 0)
        yield family


class KmsgCollector(Collector):
    """Whether the agent is reading the kernel log at all: records, errors, and
    how long since the newest record (since the follower started, before any)."""

    def __init__(self, follower: KernelLogReading) -> None:
        self.follower = follower

    def collect(self) -> Iterator[Metric]:
        f = self.follower
        yield CounterMetricFamily(
            "gpuheal_agent_kmsg_records", "Kernel log records read.", value=f.lines
        )
        yield CounterMetricFamily(
            "gpuheal_agent_kmsg_parse_errors",
            "Kernel log records that could not be parsed (skipped).",
            value=f.parse_errors,
        )
        yield CounterMetricFamily(
            "gpuheal_agent_kmsg_read_errors",
            "Failed opens and reads of the kernel log (retried every 2 s).",
            value=f.errors,
        )
        yield CounterMetricFamily(
            "gpuheal_agent_kmsg_sxid_continuations",
            "SXid Severity and Data lines attached to the SXid line before them (no event"
            " of their own).",
            value=f.sxid_continuations,
        )
        last = f.last_record_at
        yield GaugeMetricFamily(
            "gpuheal_agent_kmsg_last_record_timestamp_seconds",
            "Unix time of the newest kernel log record read (0: none yet).",
            value=last or 0.0,
        )
        yield GaugeMetricFamily(
            "gpuheal_agent_kmsg_last_record_age_seconds",
            "Seconds since the newest kernel log record was read (before any: since the"
            " follower started).",
            value=max(0.0, time.time() - (last if last is not None else f.started_at)),
        )
