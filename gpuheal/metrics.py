"""Prometheus metrics (named in docs/controller.md, "Observability", and docs/agent.md),
on a registry of their own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.faults_detected = Counter(
            "gpuheal_faults_detected_total",
            "Faults seen for the first time.",
            ["source", "reason", "severity"],
            registry=r,
        )
        self.inputs_altered = Counter(
            "gpuheal_fault_inputs_normalized_total",
            "Faults whose reported values could not be written as they were (too long, "
            "control characters, not a time): acted on with normalized values, by source "
            "and field.",
            ["source", "field"],
            registry=r,
        )
        self.remediations = Counter(
            "gpuheal_remediations_total",
            "Remediation actions taken, by action and result.",
            ["action", "result"],
            registry=r,
        )
        self.duplicates_suppressed = Counter(
            "gpuheal_duplicates_suppressed_total",
            "Signals for an already handled fault, by the dedupe layer that stopped them.",
            ["layer"],
            registry=r,
        )
        self.pods_evicted = Counter(
            "gpuheal_pods_evicted_total",
            "GPU pod evictions, by result (evicted, blocked, gone, deleted, failed).",
            ["result"],
            registry=r,
        )
        self.events = Counter(
            "gpuheal_events_total",
            "Kubernetes Events, by result (sent, failed, dropped: the queue was full).",
            ["result"],
            registry=r,
        )
        self.informer_decode_errors = Counter(
            "gpuheal_informer_decode_errors_total",
            "Objects an informer skipped because it could not decode them, once per version.",
            ["informer"],
            registry=r,
        )
        self.quarantined_nodes = Gauge(
            "gpuheal_quarantined_nodes", "GPU nodes carrying the gpuheal taint.", registry=r
        )
        self.unmanaged_gpu_nodes = Gauge(
            "gpuheal_unmanaged_gpu_nodes",
            "Nodes with GPUs that the nodeSelector does not match (not opted out with"
            " gpuheal.io/managed=false): their faults are not acted on.",
            registry=r,
        )
        self.held_faults = Gauge(
            "gpuheal_held_faults", "Faults held by the blast-radius breaker.", registry=r
        )
        self.breaker_open = Gauge(
            "gpuheal_breaker_open",
            "1 while the blast-radius breaker refuses new quarantines.",
            registry=r,
        )
        self.leader = Gauge("gpuheal_leader", "1 while this replica holds the lease.", registry=r)
        self.leader_election_errors = Counter(
            "gpuheal_leader_election_errors_total",
            "Lease reads and writes that failed, by reason (Forbidden, NotFound, Timeout, ...).",
            ["reason"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "gpuheal_reconcile_errors_total",
            "Reconciles that failed and will be retried, by reason (Invalid, Forbidden, ...).",
            ["reason"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "gpuheal_queue_depth", "Nodes waiting in the work queue.", registry=r
        )
        self.time_to_quarantine = Histogram(
            "gpuheal_time_to_quarantine_seconds",
            "From the fault's reported time to the taint on the node.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "gpuheal_reconcile_duration_seconds",
            "One reconcile of one node.",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        # Device-level health (docs/controller.md, "Device-level health").
        self.device_report_age = Histogram(
            "gpuheal_device_report_age_seconds",
            "Age of each device health report, observed when its node is reconciled.",
            buckets=(1, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400),
            registry=r,
        )
        self.device_unknown_duration = Histogram(
            "gpuheal_device_unknown_duration_seconds",
            "How long each Unknown device has been Unknown, observed at each reconcile.",
            buckets=(1, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400),
            registry=r,
        )
        self.devices_unknown = Gauge(
            "gpuheal_devices_unknown", "Devices reporting Unknown (or a stale Healthy).", registry=r
        )
        self.devices_suspect = Gauge(
            "gpuheal_devices_suspect",
            "Devices Unknown for longer than the tolerance, marked suspect on their node.",
            registry=r,
        )
        self.devices_quarantined = Gauge(
            "gpuheal_devices_quarantined", "Devices with an open device GPUFault.", registry=r
        )
        self.device_migrations = Counter(
            "gpuheal_device_migrations_total",
            "Evictions of pods holding a bad device, by result (evicted, blocked, gone, failed).",
            ["result"],
            registry=r,
        )
        self.device_releases = Counter(
            "gpuheal_device_releases_total",
            "Devices released after canary + observation.",
            registry=r,
        )
        self.device_false_quarantines = Counter(
            "gpuheal_device_false_quarantines_total",
            "Released devices that never failed a canary, within falseQuarantineSeconds.",
            registry=r,
        )
        # The DCGM source (docs/api.md, "DCGM metrics through Prometheus").
        self.dcgm_samples_dropped = Counter(
            "gpuheal_dcgm_samples_dropped_total",
            "DCGM samples no fault can be made of (NaN, Inf, DCGM blank values, an Xid"
            " that is no Xid), by query and why.",
            ["query", "why"],
            registry=r,
        )
        self.dcgm_findings = Gauge(
            "gpuheal_dcgm_findings",
            "What the DCGM source found on managed nodes at its last poll, by query.",
            ["query"],
            registry=r,
        )
        self.dcgm_poll_errors = Counter(
            "gpuheal_dcgm_poll_errors_total",
            "Failed Prometheus requests of the DCGM source, by reason (connection,"
            " timeout, http, prometheus, response, internal).",
            ["reason"],
            registry=r,
        )
        self.records_collected = Counter(
            "gpuheal_fault_records_collected_total",
            "Closed GPUFault records deleted by retention, by why (age, count).",
            ["why"],
            registry=r,
        )
        self.records_collect_errors = Counter(
            "gpuheal_fault_records_collect_errors_total",
            "Retention deletes that failed (the sweep stops until the next), by reason.",
            ["reason"],
            registry=r,
        )
        self.contact_support = Counter(
            "gpuheal_contact_support_total",
            "Faults flagged contact support: repeated remediations of one node.",
            registry=r,
        )
