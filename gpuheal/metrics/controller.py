"""Everything the controller process exports: reconciles and remediation, the
fleet's gauges (read when scraped), device health, the DCGM source, retention,
the HTTP API and the notifier (docs/controller.md, "Observability")."""

from __future__ import annotations

from collections.abc import Callable, Collection

from gpuheal.metrics.declare import Metrics, counter, gauge, histogram
from gpuheal.metrics.hygiene import HygieneCollector
from gpuheal.policy.fence import RULE_VERSIONS
from gpuheal.policy.hygiene import Examined

# Seconds: from a fraction of a second to a day, for ages that can be that long.
AGE_BUCKETS = (1, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400)

# One node's devices: (unknown, suspect, quarantined).
DeviceCounts = tuple[int, int, int]


class ControllerMetrics(Metrics):
    faults_detected = counter(
        "gpuheal_faults_detected_total",
        "Faults seen for the first time.",
        "source",
        "reason",
        "severity",
    )
    inputs_altered = counter(
        "gpuheal_fault_inputs_normalized_total",
        "Faults whose reported values could not be written as they were (too long, "
        "control characters, not a time): acted on with normalized values, by source "
        "and field.",
        "source",
        "field",
    )
    remediations = counter(
        "gpuheal_remediations_total",
        "Remediation actions taken, by action and result.",
        "action",
        "result",
    )
    duplicates_suppressed = counter(
        "gpuheal_duplicates_suppressed_total",
        "Signals for an already handled fault, by the dedupe layer that stopped them.",
        "layer",
    )
    pods_evicted = counter(
        "gpuheal_pods_evicted_total",
        "GPU pod evictions, by result (evicted, blocked, gone, deleted, failed).",
        "result",
    )
    events = counter(
        "gpuheal_events_total",
        "Kubernetes Events, by result (sent, failed, dropped: the queue was full).",
        "result",
    )
    informer_decode_errors = counter(
        "gpuheal_informer_decode_errors_total",
        "Objects an informer skipped because it could not decode them, once per version.",
        "informer",
    )
    # The fleet's state: read from its indexes when scraped (`read_fleet`).
    quarantined_nodes = gauge("gpuheal_quarantined_nodes", "GPU nodes carrying the gpuheal taint.")
    unmanaged_gpu_nodes = gauge(
        "gpuheal_unmanaged_gpu_nodes",
        "Nodes with GPUs that the nodeSelector does not match (not opted out with"
        " gpuheal.io/managed=false): their faults are not acted on.",
    )
    held_faults = gauge("gpuheal_held_faults", "Faults held by the blast-radius breaker.")
    dra_gpus = gauge(
        "gpuheal_dra_gpus",
        "GPUs the configured DRA drivers offer (devices in their ResourceSlices).",
    )
    device_fence = gauge(
        "gpuheal_device_fence",
        "1 at the resource.k8s.io version that serves DeviceTaintRules (the device fence "
        "of DRA GPUs); 0 at every version when none does.",
        "version",
    )
    breaker_open = gauge(
        "gpuheal_breaker_open", "1 while the blast-radius breaker refuses new quarantines."
    )
    # Set by the elector's callbacks: the moments this replica starts and stops leading.
    leader = gauge("gpuheal_leader", "1 while this replica holds the lease.")
    annotations_unreadable = counter(
        "gpuheal_annotations_unreadable_total",
        "gpuheal annotations on a node, or a pod's checkpoint request, that their readers "
        "cannot read (each value told once, with a warning log and a "
        "GPUAnnotationUnreadable Event), by annotation.",
        "annotation",
    )
    task_crashes = counter(
        "gpuheal_task_crashes_total",
        "Background tasks that ended with an unexpected exception, by task (restarted "
        "after a backoff, or the controller ends: docs/controller.md#supervised-tasks).",
        "task",
    )
    leader_election_errors = counter(
        "gpuheal_leader_election_errors_total",
        "Lease reads and writes that failed, by reason (Forbidden, NotFound, Timeout, ...).",
        "reason",
    )
    reconcile_errors = counter(
        "gpuheal_reconcile_errors_total",
        "Reconciles that failed and will be retried, by reason (Invalid, Forbidden, ...).",
        "reason",
    )
    queue_depth = gauge("gpuheal_queue_depth", "Nodes waiting in the work queue.")
    time_to_quarantine = histogram(
        "gpuheal_time_to_quarantine_seconds",
        "From the fault's reported time to the taint on the node.",
        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
    )
    reconcile_duration = histogram(
        "gpuheal_reconcile_duration_seconds",
        "One reconcile of one node.",
        buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    )
    # Device-level health (docs/controller.md, "Device-level health").
    device_report_age = histogram(
        "gpuheal_device_report_age_seconds",
        "Age of each device health report, observed when its node is reconciled.",
        buckets=AGE_BUCKETS,
    )
    device_unknown_duration = histogram(
        "gpuheal_device_unknown_duration_seconds",
        "How long each Unknown device has been Unknown, observed at each reconcile.",
        buckets=AGE_BUCKETS,
    )
    # The devices' state: the reconciler's per-node counts, summed when scraped (`read_devices`).
    devices_unknown = gauge(
        "gpuheal_devices_unknown", "Devices reporting Unknown (or a stale Healthy)."
    )
    devices_suspect = gauge(
        "gpuheal_devices_suspect",
        "Devices Unknown for longer than the tolerance, marked suspect on their node.",
    )
    devices_quarantined = gauge(
        "gpuheal_devices_quarantined", "Devices with an open device GPUFault."
    )
    device_migrations = counter(
        "gpuheal_device_migrations_total",
        "Evictions of pods holding a bad device, by result (evicted, blocked, gone, failed).",
        "result",
    )
    device_releases = counter(
        "gpuheal_device_releases_total", "Devices released after canary + observation."
    )
    device_false_quarantines = counter(
        "gpuheal_device_false_quarantines_total",
        "Released devices that never failed a canary, within falseQuarantineSeconds.",
    )
    # The DCGM source (docs/api.md, "DCGM metrics through Prometheus").
    dcgm_samples_dropped = counter(
        "gpuheal_dcgm_samples_dropped_total",
        "DCGM samples no fault can be made of (NaN, Inf, DCGM blank values, an Xid"
        " that is no Xid), by query and why.",
        "query",
        "why",
    )
    # Set by each poll: what the DCGM source last saw, not what the controller keeps.
    dcgm_findings = gauge(
        "gpuheal_dcgm_findings",
        "What the DCGM source found on managed nodes at its last poll, by query.",
        "query",
    )
    # Set by each poll: how many series dcgm-exporter's counters that a query reads
    # have in Prometheus; 0: the query can never find anything (the counter is not
    # exported: most are optional in dcgm-exporter's counters file).
    dcgm_query_series = gauge(
        "gpuheal_dcgm_query_series",
        "Series in Prometheus of the dcgm-exporter counters each DCGM query reads, at the"
        " last poll (0: the query cannot see anything).",
        "query",
    )
    dcgm_poll_errors = counter(
        "gpuheal_dcgm_poll_errors_total",
        "Failed Prometheus requests of the DCGM source, by reason (connection,"
        " timeout, http, prometheus, response, internal).",
        "reason",
    )
    records_collected = counter(
        "gpuheal_fault_records_collected_total",
        "Closed GPUFault records deleted by retention, by why (age, count).",
        "why",
    )
    records_collect_errors = counter(
        "gpuheal_fault_records_collect_errors_total",
        "Retention deletes that failed (the pass stops until the next), by reason.",
        "reason",
    )
    contact_support = counter(
        "gpuheal_contact_support_total",
        "Faults flagged contact support: repeated remediations of one node.",
    )
    # Repairs (policy/repair.py): each step of each attempt, as the record notes it.
    repairs = counter(
        "gpuheal_repairs_total",
        "Repair steps, by action (reset-gpu, reboot) and step: requested, done, failed, "
        "refused, timed-out, ineffective, proposed, contact-support.",
        "action",
        "step",
    )
    # The idle-node sweep (controller/sweep.py): the leader's passes.
    sweep_checks = counter(
        "gpuheal_sweep_checks_total",
        "Idle-node checks, by result: started, passed, failed (a fault), yielded (to a "
        "workload, a fault or a cordon), error (could not run; no fault).",
        "result",
    )
    sweep_running = gauge(
        "gpuheal_sweep_checks_running", "Idle-node checks running at the leader's last pass."
    )
    sweep_waiting = gauge(
        "gpuheal_sweep_nodes_waiting",
        "Idle nodes due a check that no slot (sweep.maxConcurrent) was left for at the "
        "leader's last pass.",
    )
    # The notifier (controller/notify.py).
    notifications = counter(
        "gpuheal_notifications_total",
        "Notifications by result (sent, failed, dropped).",
        "result",
    )
    # The HTTP API (docs/api.md): served on the same /metrics.
    api_requests = counter(
        "gpuheal_api_requests_total", "API requests by route and status code.", "route", "code"
    )
    alerts = counter(
        "gpuheal_alerts_total",
        "Alerts received, by what became of them"
        " (accepted, duplicate, resolved, skipped, invalid, observed: an Xid that is no"
        " node fault).",
        "result",
    )
    # Xids no source may quarantine a node for (controller/observed_xids.py). The xid
    # label is bounded: only catalogued codes (and the config's rows) are counted here,
    # an unknown one is a node fault; no node or GPU label, for a fleet of thousands.
    xids_observed = counter(
        "gpuheal_xids_observed_total",
        "Xids a controller source saw that are no node fault by themselves (NVIDIA: restart"
        " the application, or ignore), by source, xid and kind (application, informational).",
        "source",
        "xid",
        "kind",
    )

    def read_fleet(
        self,
        *,
        quarantined: Callable[[], int],
        unmanaged: Callable[[], int],
        held: Callable[[], int],
        queued: Callable[[], int],
    ) -> None:
        """The fleet's gauges read its indexes when scraped, not pushed on each event."""
        self.quarantined_nodes.set_function(quarantined)
        self.unmanaged_gpu_nodes.set_function(unmanaged)
        self.held_faults.set_function(held)
        self.breaker_open.set_function(lambda: 1 if held() else 0)
        self.queue_depth.set_function(queued)

    def read_dra(self, gpus: Callable[[], int], fence: Callable[[], str]) -> None:
        """The DRA gauges read the controller's slice and fence caches when scraped."""
        self.dra_gpus.set_function(gpus)
        for version in RULE_VERSIONS:
            self.device_fence.labels(version).set_function(_serves(fence, version))

    def read_hygiene(self, last: Callable[[], Examined | None]) -> None:
        """The hygiene gauges read the loop's latest examination when scraped."""
        self.registry.register(HygieneCollector(last))

    def read_devices(self, counts: Callable[[], Collection[DeviceCounts]]) -> None:
        """The device gauges sum the per-node counts when scraped: a reconcile only
        keeps its node's counts, and a deleted node's go with it."""
        gauges = (self.devices_unknown, self.devices_suspect, self.devices_quarantined)
        for column, device_gauge in enumerate(gauges):
            device_gauge.set_function(_column_sum(counts, column))


def _serves(fence: Callable[[], str], version: str) -> Callable[[], int]:
    return lambda: int(fence() == version)


def _column_sum(counts: Callable[[], Collection[DeviceCounts]], column: int) -> Callable[[], int]:
    # tuple() copies the counts in one step: a scrape never sees them change midway.
    return lambda: sum(node[column] for node in tuple(counts()))
