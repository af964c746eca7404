"""The controller's configuration: one YAML document, validated at start.

Every problem is reported with the dotted path of the bad key
(`breakerMaxPercent: must be between 0 and 100, got 250`), and the
controller refuses to start. Each key is declared once, as a field below with
its parser (gpuheal/config/keys.py); the top-level keys are grouped by concern
into the classes `Config` is made of, the nested ones are their own sections.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuheal.config.keys import (
    MAX_BODY_BYTES,
    MAX_BURST,
    MAX_CELSIUS,
    MAX_COUNT,
    MAX_DELAY_S,
    MAX_GPUS,
    MAX_NODES,
    MAX_RATE,
    MAX_WINDOW_S,
    MAX_WORKERS,
    ListOf,
    MapOf,
    bool_map,
    boolean,
    enum_of,
    file_path,
    integer,
    load_yaml,
    lowercase_strings,
    mode_map,
    number,
    one_of,
    optional,
    parse_document,
    refuse,
    schemas_of,
    section,
    setting,
    string,
    string_map,
    strings,
)
from gpuheal.config.keys import ConfigError as ConfigError
from gpuheal.config.urls import url
from gpuheal.config.urls import url_origin as url_origin
from gpuheal.config.urls import without_url_secrets as without_url_secrets
from gpuheal.config.xids import xid_rows
from gpuheal.model import (
    DISRUPTION_KEYS,
    DO_NOT_DISRUPT,
    ENVIRONMENT_FACTS,
    GPU_HEALTHY_CONDITION,
    HYGIENE_SIGNAL_KINDS,
    MAINTENANCE_TAINT_KEY,
    SCALE_DOWN_DISABLED,
    Mode,
    Severity,
    Taint,
)
from gpuheal.xid import XidRow

TITLE = "invalid configuration"

effect = one_of("NoSchedule", "NoExecute")

_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def taint_spec(value: object) -> Taint:
    """ "key[=value]:Effect", as kubectl taint writes it."""
    text = string(value)
    head, sep, effect_ = text.rpartition(":")
    key, _, taint_value = head.partition("=")
    if not sep or not key or effect_ not in _TAINT_EFFECTS:
        choices = ", ".join(_TAINT_EFFECTS)
        raise ValueError(f"must be key[=value]:Effect with Effect one of {choices}, got {text!r}")
    return Taint(key=key, effect=effect_, value=taint_value)


def environment_facts(value: object) -> tuple[str, ...]:
    """true (every fact), false (none) or a list of the facts' names."""
    if isinstance(value, bool):
        return ENVIRONMENT_FACTS if value else ()
    names = strings(value)
    unknown = [n for n in names if n not in ENVIRONMENT_FACTS]
    if unknown:
        choices = ", ".join(ENVIRONMENT_FACTS)
        raise ValueError(f"must be true, false or a list of {choices}; got {unknown[0]!r}")
    return names


def taint_specs(value: object) -> tuple[Taint, ...]:
    if not isinstance(value, list):
        raise ValueError(f"must be a list of key[=value]:Effect, got {value!r}")
    return tuple(taint_spec(item) for item in value)


# -- the sections ------------------------------------------------------------------------


# conditions[].message: how a matching condition's message is read.
MESSAGE_IGNORED = "ignored"  # not read: the rule's fault
MESSAGE_KERNEL_LOG = "kernelLog"  # NVIDIA driver lines, one a line (docs/operations.md)


@dataclass(frozen=True)
class ConditionRule:
    """`conditions[]`: map a NodeCondition written by any detector to a fault signal."""

    type: str = setting(string)
    status: str = setting(string, "False")
    reasons: tuple[str, ...] = setting(strings, ())  # empty: any reason
    # Empty: the condition's own reason, else its type (kernelLog: the line's row's).
    fault_reason: str = setting(string, "")
    severity: Severity = setting(enum_of(Severity), Severity.P0)
    # kernelLog: the message holds NVIDIA driver lines (node-problem-detector puts the
    # log lines its rule matched there), classified as the agent classifies them.
    message: str = setting(one_of(MESSAGE_IGNORED, MESSAGE_KERNEL_LOG), MESSAGE_IGNORED)

    def matches(self, type_: str, status: str, reason: str) -> bool:
        return (
            type_ == self.type
            and status == self.status
            and (not self.reasons or reason in self.reasons)
        )


@dataclass(frozen=True)
class NotificationSink:
    """`notificationSinks[]`: a webhook told after each remediation step."""

    url: str = setting(url)  # a secret: logged only as url_origin(url)
    format: str = setting(one_of("json", "slack"), "json")

    @property
    def shown(self) -> str:
        return url_origin(self.url)


@dataclass(frozen=True)
class LeaderElection:
    enabled: bool = setting(boolean, True)
    namespace: str = setting(string, "gpuheal-system")
    name: str = setting(string, "gpuheal-controller")
    lease_seconds: float = setting(number(1, 3600), 15.0)
    renew_deadline_seconds: float = setting(number(0.5, 3600), 10.0)
    retry_period_seconds: float = setting(number(0.1, 3600), 2.0)


@dataclass(frozen=True)
class DeviceHealthConfig:
    """Device-level health from Pod allocatedResourcesStatus (docs/controller.md)."""

    enabled: bool = setting(boolean, True)
    # A Healthy report not renewed for this long counts as Unknown; 0: never.
    heartbeat_seconds: float = setting(number(0, MAX_DELAY_S), 0.0)
    # Unknown for less than this: an Event and a metric; longer: the device is suspect.
    unknown_tolerance_seconds: float = setting(number(0, MAX_DELAY_S), 300.0)
    # A device quarantine lasts at least this long without a fresh Healthy report;
    # a failed canary extends it by as much.
    quarantine_seconds: float = setting(number(0, MAX_DELAY_S), 3600.0)
    # Below this fraction of healthy devices the whole node is quarantined.
    min_healthy_fraction: float = setting(number(0, 1), 0.5)
    # This many device faults on one node within the window: the whole node.
    escalate_after_faults: int = setting(integer(1, MAX_COUNT), 3)
    escalation_window_seconds: float = setting(number(0, MAX_WINDOW_S), 86400.0)
    # The same device failing again this soon after its release: the whole node.
    repeat_window_seconds: float = setting(number(0, MAX_WINDOW_S), 7 * 86400.0)
    # A device health message containing one of these (any case): the whole node.
    whole_node_reasons: tuple[str, ...] = setting(
        lowercase_strings, ("fallen off the bus", "nvlink", "fabric")
    )
    # Evictions of pods holding bad devices, per node.
    evictions_per_minute: float = setting(number(0.01, MAX_RATE), 6.0)
    eviction_burst: int = setting(integer(1, MAX_BURST), 2)
    canary_image: str = setting(string, "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04")
    canary_command: tuple[str, ...] = setting(strings, ("nvidia-smi",))
    canary_namespace: str = setting(string, "gpuheal-system")
    canary_timeout_seconds: float = setting(number(1, 86400), 300.0)
    # A DRA device's canary claims it through the DeviceClass for its kind (the
    # driver's `type`: NVIDIA's chart installs gpu.nvidia.com and mig.nvidia.com).
    canary_device_classes: Mapping[str, str] = setting(
        string_map, factory=lambda: {"gpu": "gpu.nvidia.com", "mig": "mig.nvidia.com"}
    )
    # Healthy after a passed canary for this long: the device is released.
    observation_seconds: float = setting(number(0, MAX_DELAY_S), 600.0)
    # Released this soon after its quarantine, with no canary failure: a false quarantine.
    false_quarantine_seconds: float = setting(number(0, MAX_WINDOW_S), 3600.0)
    # A bad DRA device's fence: a DeviceTaintRule of this effect on exactly that device
    # while its fault is open. NoSchedule: no new claim gets it, and gpuheal moves the
    # pods on it (Eviction API: budgets hold). NoExecute: kube-controller-manager
    # deletes them itself (no budget holds). off: no rule (the annotation alone).
    fence: str = setting(one_of("NoSchedule", "NoExecute", "off"), "NoSchedule")
    # After its release, a DRA device stays this long under a NoSchedule probation taint
    # (gpuheal.io/probation) only tolerating workloads pass: production load returns in
    # stages. A fault meanwhile takes it straight back to quarantine. 0: none.
    probation_seconds: float = setting(number(0, MAX_DELAY_S), 1800.0)


@dataclass(frozen=True)
class PoolConfig:
    """What every node of one GPU pool should look like (the health gate, `audit`)."""

    # GPUs each node should offer; None: the node's expectedGpusLabel, if any.
    gpus_per_node: int | None = setting(integer(0, MAX_GPUS), None)
    # The resource those GPUs are offered as (nvidia.com/gpu, or a MIG resource).
    resource: str = setting(string, "nvidia.com/gpu")
    # "": the version most nodes of the pool run.
    driver_version: str = setting(string, "")
    cuda_version: str = setting(string, "")
    vbios_version: str = setting(string, "")
    # `gpuheal audit`: labels ("*": any value) and taints this pool's nodes must carry,
    # on top of the fleet-wide ones in PoolsConfig.
    expected_labels: Mapping[str, str] = setting(string_map, factory=dict)
    expected_taints: tuple[Taint, ...] = setting(taint_specs, ())


@dataclass(frozen=True)
class PoolsConfig:
    # The node label naming a node's pool; then the fallbacks, in order.
    label: str = setting(string, "gpuheal.io/pool")
    fallback_labels: tuple[str, ...] = setting(strings, ("nvidia.com/gpu.product",))
    # GPU feature discovery's per-node GPU count.
    expected_gpus_label: str = setting(string, "nvidia.com/gpu.count")
    by_name: Mapping[str, PoolConfig] = setting(MapOf(PoolConfig, entry="pool"), factory=dict)
    # `gpuheal audit`: labels ("*": any value) and taints every GPU node must carry.
    expected_labels: Mapping[str, str] = setting(string_map, factory=dict)
    expected_taints: tuple[Taint, ...] = setting(taint_specs, ())
    # Node labels naming a node's rack, first present wins (`gpuheal doctor`'s neighbours).
    rack_labels: tuple[str, ...] = setting(strings, ("topology.kubernetes.io/rack", "rack"))


# The validation Job's default image: DCGM's (dcgmi); a pool's NCCL test needs an
# image with nccl-tests' all_reduce_perf too (healthGate.validation.byPool.<pool>.image).
DEFAULT_VALIDATION_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:3.3.9-1-ubuntu22.04"


@dataclass(frozen=True)
class PoolValidationConfig:
    """One pool's validation, over healthGate.validation's keys (unset: those)."""

    image: str | None = setting(optional(string), None)
    command: tuple[str, ...] | None = setting(optional(strings), None)
    dcgm_level: int | None = setting(optional(integer(1, 4)), None)
    nccl_min_bus_bandwidth_gbps: float | None = setting(
        optional(number(0, 100_000)), None, key="ncclMinBusBandwidthGBps"
    )
    env: Mapping[str, str] = setting(string_map, factory=dict)


@dataclass(frozen=True)
class ValidationConfig:
    """A Job on the node that runs the GPUs (DCGM diagnostics, NCCL all-reduce) before
    the controller's recovery returns it (docs/operations.md, "Validation")."""

    # Off by default: the Job needs an image with the tools pulled onto GPU nodes, and
    # a cluster without one would hold every recovered node until the timeout.
    enabled: bool = setting(boolean, False)
    namespace: str = setting(string, "gpuheal-system")
    image: str = setting(string, DEFAULT_VALIDATION_IMAGE)
    # Empty: the built-in script (dcgmi diag at dcgmLevel, then NCCL if its threshold is set).
    command: tuple[str, ...] = setting(strings, ())
    dcgm_level: int = setting(integer(1, 4), 2)
    # All-reduce bus bandwidth a multi-GPU node must reach; 0: no NCCL test.
    nccl_min_bus_bandwidth_gbps: float = setting(
        number(0, 100_000), 0.0, key="ncclMinBusBandwidthGBps"
    )
    env: Mapping[str, str] = setting(string_map, factory=dict)
    # The Job's activeDeadlineSeconds, and how long the gate waits for its result.
    timeout_seconds: float = setting(number(1, 86400), 1800.0)
    # A pod the scheduler still cannot place after this long ends the attempt (a
    # taint that lingers a moment, e.g. not-ready after a reboot, must not).
    schedule_timeout_seconds: float = setting(number(1, 86400), 300.0)
    # After a failed attempt the node stays out this long before the next one.
    retry_seconds: float = setting(number(1, MAX_DELAY_S), 3600.0)
    # A finished Job the controller could not delete goes by itself after this long.
    ttl_seconds_after_finished: int = setting(integer(0, 30 * 86400), 3600)
    by_pool: Mapping[str, PoolValidationConfig] = setting(
        MapOf(PoolValidationConfig, entry="pool"), factory=dict
    )


@dataclass(frozen=True)
class HealthGateConfig:
    """Checks a node passes before it is returned (docs/operations.md)."""

    # The controller's recovery runs the gate before it removes the fault taint.
    on_recovery: bool = setting(boolean, True)
    # The device-plugin pod on the node: found by these labels, in these namespaces
    # (empty: any). Not required: a node without one passes this check.
    device_plugin_selector: Mapping[str, str] = setting(
        string_map, factory=lambda: {"app": "nvidia-device-plugin-daemonset"}
    )
    device_plugin_namespaces: tuple[str, ...] = setting(strings, ())
    device_plugin_required: bool = setting(boolean, False)
    # A diagnostics result (gpuheal.io/diagnostics) must be present, passing and fresh.
    diagnostics_required: bool = setting(boolean, False)
    diagnostics_max_age_seconds: float = setting(number(1, MAX_DELAY_S), 86400.0)
    # The agent's start-order facts (gpuheal.io/node-environment) that must be known:
    # with them, "unknown" (or no report) fails too. A bad fact fails either way.
    environment_required: tuple[str, ...] = setting(environment_facts, ())
    # Facts the gate does not look at, for fleets that run without them (GKE's GPU nodes
    # have no NVIDIA container runtime; some run no persistence daemon).
    environment_ignored: tuple[str, ...] = setting(environment_facts, ())
    validation: ValidationConfig = section(ValidationConfig)


@dataclass(frozen=True)
class MaintenanceConfig:
    taint_key: str = setting(string, MAINTENANCE_TAINT_KEY)
    taint_effect: str = setting(effect, "NoSchedule")
    # How GPU workloads are told to checkpoint.
    checkpoint: str = setting(one_of("annotate", "webhook", "none"), "annotate")
    checkpoint_webhook_url: str = setting(url, "")
    # How long GPU pods get to leave on their own before the drain.
    checkpoint_wait_seconds: float = setting(number(0, MAX_DELAY_S), 300.0)
    drain_timeout_seconds: float = setting(number(1, MAX_DELAY_S), 1800.0)
    eviction_retry_seconds: float = setting(number(0.1, 3600), 5.0)
    # How often the leader looks for `gpuheal maintenance` requests in its node cache
    # (no request to the API server) and how often it records a request's progress.
    poll_seconds: float = setting(number(0.1, 60), 1.0)


@dataclass(frozen=True)
class ApprovalConfig:
    """A person approves a fault's plan before its first taint or eviction."""

    required: bool = setting(boolean, False)
    # Fault reason -> required, over `required`.
    by_reason: Mapping[str, bool] = setting(bool_map, factory=dict)
    # An unanswered plan ends (record Failed, `approval-expired`) after this long.
    expiry_seconds: float = setting(number(1, MAX_DELAY_S), 3600.0)

    def required_for(self, reason: str) -> bool:
        return self.by_reason.get(reason, self.required)


def severities(value: object) -> tuple[Severity, ...]:
    """A list of P0/P1: the severities a fault is acted on with (P2 is only observed)."""
    found = tuple(enum_of(Severity)(v) for v in strings(value))
    if Severity.P2 in found:
        raise ValueError("P2 faults are only observed, never drained: use P0 or P1")
    return found


@dataclass(frozen=True)
class CheckpointConfig:
    """The drain asks a matching fault's GPU pods to checkpoint and waits (up to
    waitSeconds) before it evicts them: the protocol of `maintenance start`
    (docs/controller.md, "Checkpoint before eviction"). Off: both lists empty."""

    # Faults with one of these reasons, or of one of these severities, wait.
    reasons: tuple[str, ...] = setting(strings, ())
    severities: tuple[Severity, ...] = setting(severities, ())
    # These reasons move at once whatever their severity (a GPU off the bus cannot
    # save anything): an exception to `severities`.
    immediate_reasons: tuple[str, ...] = setting(strings, ())
    # How long a pod gets from the request to its eviction, unless it says done sooner.
    wait_seconds: float = setting(number(0, MAX_DELAY_S), 300.0)

    def applies(self, reason: str, severity: Severity) -> bool:
        """Are this fault's GPU pods asked to checkpoint before they are evicted?"""
        if reason in self.immediate_reasons:
            return False
        return reason in self.reasons or severity in self.severities


@dataclass(frozen=True)
class RetentionConfig:
    """Closed GPUFault records are deleted, by age and by a count per node; open
    ones never (docs/controller.md, "Retention")."""

    enabled: bool = setting(boolean, True)
    # A closed record older than this (since it was closed) is deleted.
    resolved_max_age_seconds: float = setting(number(60, MAX_WINDOW_S), 30 * 86400.0)
    # At most this many closed records per node: the newest are kept.
    per_node_max: int = setting(integer(1, MAX_COUNT), 50)
    # How often the leader looks for records to delete (in its informer cache).
    interval_seconds: float = setting(number(1, 86400), 600.0)
    # Deletes are paced: the API server is shared with remediation.
    deletes_per_second: float = setting(number(0.1, 1000), 20.0)


def repair_actions(value: object) -> dict[str, str]:
    """Fault reason -> the repair for it (`reset-gpu`, `reboot`, `replace` or `none`),
    over the Xid catalogue's recommended action."""
    found = string_map(value)
    parse = one_of(*REPAIR_CHOICES)
    return {reason: parse(action) for reason, action in found.items()}


REPAIR_CHOICES = ("reset-gpu", "reboot", "replace", "none")


def approved_repairs(value: object) -> tuple[str, ...]:
    """The repairs (`reset-gpu`, `reboot`) a person approves before each attempt."""
    parse = one_of("reset-gpu", "reboot")
    return tuple(dict.fromkeys(parse(v) for v in strings(value)))


@dataclass(frozen=True)
class ReplaceConfig:
    """The provider hook that replaces a node (docs/controller.md, "Repair"): a
    webhook or a command the controller calls, once per attempt. Neither: off."""

    webhook: str = setting(url, "")  # a secret: logged only as url_origin(webhook)
    # argv; the call's JSON on stdin, its idempotency key in GPUHEAL_IDEMPOTENCY_KEY.
    command: tuple[str, ...] = setting(strings, ())
    timeout_seconds: float = setting(number(1, 600), 30.0)
    # Failed calls: retried after retryBaseSeconds, doubling, up to maxAttempts calls.
    max_attempts: int = setting(integer(1, 20), 3)
    retry_base_seconds: float = setting(number(0.1, MAX_DELAY_S), 60.0)

    @property
    def configured(self) -> bool:
        return bool(self.webhook or self.command)


@dataclass(frozen=True)
class RepairConfig:
    """After the drain, the recommended repair of a fault the node's agent reported:
    a GPU reset or a reboot, carried out by the agent on the controller's request
    (docs/controller.md, "Repair"). Off by default."""

    enabled: bool = setting(boolean, False)
    # propose: the record says what would be done, nothing is asked of the agent.
    mode: str = setting(one_of("propose", "act"), "propose")
    # Repairs in flight at once, cluster-wide (and never more than the breaker allows).
    max_concurrent: int = setting(integer(0, MAX_COUNT), 2)
    # The ladder of one fault: this many resets, then this many reboots, then a person.
    reset_attempts: int = setting(integer(0, 10), 2)
    reboot_attempts: int = setting(integer(0, 10), 1)
    # At most this many repair requests per node within windowSeconds (all its faults).
    max_attempts_per_node: int = setting(integer(1, 100), 4)
    window_seconds: float = setting(number(60, MAX_WINDOW_S), 86400.0)
    # A request with no result after this long counts as a failed attempt.
    result_timeout_seconds: float = setting(number(1, MAX_DELAY_S), 900.0)
    # How often the node's reboot method acts on a request: kured looks for its
    # sentinel every --period (1h by default). A reboot's result waits this much
    # longer than resultTimeoutSeconds: a reboot answered late is not a failed one.
    reboot_period_seconds: float = setting(number(0, MAX_DELAY_S), 3600.0)
    # A repair said done whose fault is still reported this long after: ineffective.
    settle_seconds: float = setting(number(0, MAX_DELAY_S), 300.0)
    # Fault reason -> reset-gpu | reboot | none, over the Xid catalogue's action.
    action_by_reason: Mapping[str, str] = setting(repair_actions, factory=dict)
    # These repairs wait for a person's `gpuheal approve` before each attempt; an
    # unanswered one ends after approval.expirySeconds (a person is asked instead).
    approval: tuple[str, ...] = setting(approved_repairs, ())
    # The node replaced through the provider's hook: after the ladder instead of
    # contact support, or for the reasons actionByReason maps to `replace`.
    replace: ReplaceConfig = section(ReplaceConfig)

    @property
    def acts(self) -> bool:
        return self.enabled and self.mode == "act"

    def result_timeout(self, action: str) -> float:
        """How long a request of `action` waits for the agent's result."""
        if action == "reboot":
            return self.result_timeout_seconds + self.reboot_period_seconds
        return self.result_timeout_seconds

    def approval_for(self, action: str) -> bool:
        return action in self.approval


@dataclass(frozen=True)
class ApplicationXidsConfig:
    """Application Xids (NVIDIA: restart the application) are no node fault one by one;
    this many of them on one GPU within dcgm-exporter's XID window are one
    (`RepeatedApplicationXids`, P1). Read from DCGM_EXP_XID_ERRORS_COUNT, which
    dcgm-exporter exports only when its counters file lists it (docs/deploy.md)."""

    # Application Xids per GPU within the exporter's window (5 min by default); 0: never.
    per_gpu: int = setting(integer(0, MAX_COUNT), 10)


# -- the top-level keys, by concern ------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """Which nodes and pods are ours."""

    # Which nodes are GPU nodes we manage (label equality, all must match).
    node_selector: Mapping[str, str] = setting(
        string_map, factory=lambda: {"nvidia.com/gpu.present": "true"}
    )
    # Resource names that make a pod a GPU pod; a trailing * matches a prefix (MIG).
    gpu_resources: tuple[str, ...] = setting(strings, ("nvidia.com/gpu", "nvidia.com/mig-*"))
    # DRA drivers whose devices are GPUs: their ResourceSlices' GPU and MIG devices
    # count as a node's GPUs, and a pod whose claims were given one is a GPU pod.
    gpu_drivers: tuple[str, ...] = setting(strings, ("gpu.nvidia.com",))
    protected_namespaces: tuple[str, ...] = setting(strings, ("kube-system",))

    def is_gpu_resource(self, name: str) -> bool:
        return any(
            name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern
            for pattern in self.gpu_resources
        )

    def gpu_count(self, resources: Iterable[tuple[str, int]]) -> int:
        """The GPUs in a resource list: every GPU resource (whole GPUs and MIG
        profiles) counts. The controller and every command count a node's this way."""
        return sum(n for name, n in resources if self.is_gpu_resource(name))


@dataclass(frozen=True)
class Remediation:
    """What is done about a fault, and when."""

    mode: Mode = setting(enum_of(Mode), Mode.FULL)
    mode_by_reason: Mapping[str, Mode] = setting(mode_map, factory=dict)
    taint_effect: str = setting(effect, "NoSchedule")
    # A P1 fault still present after this long is handled as P0.
    p1_escalation_seconds: float = setting(number(0, MAX_DELAY_S), 600.0)
    # A P1 fault's node is tainted NoSchedule while it is watched (within the breaker).
    p1_taint: bool = setting(boolean, False)
    recovery_window_seconds: float = setting(number(0, MAX_DELAY_S), 300.0)
    cooldown_seconds: float = setting(number(0, MAX_DELAY_S), 600.0)
    dedupe_ttl_seconds: float = setting(number(0, MAX_DELAY_S), 3600.0)
    hold_retry_seconds: float = setting(number(0.01, 3600), 10.0)
    approval: ApprovalConfig = section(ApprovalConfig)
    checkpoint: CheckpointConfig = section(CheckpointConfig)
    # Webhook sinks told after each remediation step.
    notification_sinks: tuple[NotificationSink, ...] = setting(ListOf(NotificationSink), ())

    def mode_for(self, reason: str) -> Mode:
        return self.mode_by_reason.get(reason, self.mode)


@dataclass(frozen=True)
class Eviction:
    """How the pods of a quarantined node are evicted."""

    eviction_retry_base_seconds: float = setting(number(0.01, 3600), 2.0)
    eviction_retry_max_seconds: float = setting(number(0.01, 86400), 60.0)
    # Delete a pod whose eviction stays blocked this long; None: never delete.
    eviction_delete_after_seconds: float | None = setting(optional(number(0, MAX_DELAY_S)), None)


@dataclass(frozen=True)
class Pace:
    """How fast, and how many nodes at once: the rate limit and the blast-radius breaker."""

    rate_limit_per_second: float = setting(number(0.001, MAX_RATE), 2.0)
    rate_limit_burst: int = setting(integer(1, MAX_BURST), 2)
    breaker_max_nodes: int = setting(integer(0, MAX_NODES), 10)
    breaker_max_percent: float = setting(number(0, 100), 10.0)


@dataclass(frozen=True)
class Signals:
    """Where faults come from besides the agent: conditions, alerts, DCGM."""

    conditions: tuple[ConditionRule, ...] = setting(
        ListOf(ConditionRule), (ConditionRule(type=GPU_HEALTHY_CONDITION, status="False"),)
    )
    # External signals (alerts, manual requests) stay active this long after they were
    # last seen, unless resolved: longer than Alertmanager's repeat_interval.
    external_signal_ttl_seconds: float = setting(number(1, MAX_DELAY_S), 6 * 3600.0)
    # A resolved alert withdraws its signal; off: the signal stays until it expires.
    resolved_alert_clears: bool = setting(boolean, False)
    # Alert labels that name the node, in order; "instance" is matched to node addresses.
    alert_node_labels: tuple[str, ...] = setting(
        strings, ("node", "Hostname", "hostname", "instance")
    )
    # Optional DCGM source: dcgm-exporter series queried from this Prometheus.
    dcgm_prometheus_url: str | None = setting(url, None)
    dcgm_interval_seconds: float = setting(number(0.5, 3600), 30.0)
    dcgm_temperature_warning_c: int = setting(integer(0, MAX_CELSIUS), 85)
    dcgm_temperature_critical_c: int = setting(integer(0, MAX_CELSIUS), 95)
    # A hardware clock slowdown held 60 % of this window is a fault (as the agent's).
    dcgm_slowdown_window_seconds: float = setting(number(20, 86400), 600.0)
    # Overrides of NVIDIA's Xid catalogue (the agent's `xid` key): every controller
    # source (DCGM, Alertmanager, the manual API) classifies through them first.
    xid_overrides: Mapping[int, XidRow] = setting(xid_rows, factory=dict, key="xid")
    application_xids: ApplicationXidsConfig = section(ApplicationXidsConfig)


@dataclass(frozen=True)
class HttpApi:
    """The HTTP API: its tokens and limits (docs/api.md)."""

    # The API's bearer token(s), one a line, from a mounted Secret file; re-read when
    # the file changes. None: every request that needs a token is refused.
    api_token_file: Path | None = setting(file_path, None)
    api_max_body_bytes: int = setting(integer(1024, MAX_BODY_BYTES), 1 << 20)
    # The budget of each token; clients without a valid one share a small one per address.
    api_client_rate_per_second: float = setting(number(0.01, MAX_RATE), 20.0)
    api_client_burst: int = setting(integer(1, MAX_BURST), 40)
    # GET /api/v1/faults (node and pod names) without a token: for a trusted network only.
    api_open_reads: bool = setting(boolean, False)
    # The console's view-only tokens, one a line (apiTokenFile's tokens may act).
    console_view_token_file: Path | None = setting(file_path, None)
    # Mark the console's session cookie Secure: on when it is served behind TLS.
    console_secure_cookie: bool = setting(boolean, False)


@dataclass(frozen=True)
class Runtime:
    """The controller process: workers, watches, resync and the lease."""

    workers: int = setting(integer(1, MAX_WORKERS), 4)
    watch_timeout_seconds: int = setting(integer(1, 3600), 300)
    watch_inactivity_seconds: float = setting(number(1, 3600), 90.0)
    # Every managed node is reconciled from the caches this often, whatever the events.
    resync_seconds: float = setting(number(1, 86400), 300.0)
    leader_election: LeaderElection = section(LeaderElection)


def disruption_keys(value: object) -> tuple[str, ...]:
    """The autoscaler annotations to set on a node under work (model.DISRUPTION_KEYS:
    the ones whose meaning gpuheal knows, and which its caches keep)."""
    parse = one_of(*DISRUPTION_KEYS)
    return tuple(dict.fromkeys(parse(v) for v in strings(value)))


@dataclass(frozen=True)
class AutoscalersConfig:
    """Cluster Autoscaler and Karpenter see a drained, quarantined node as idle and
    may remove it: while a repair, the health gate (its validation included) or a
    roll-out step is in progress on a node, the controller sets these annotations
    on it ("true"), and removes the ones it set when the step ends
    (docs/controller.md, "Autoscalers"). Empty: none."""

    do_not_disrupt: tuple[str, ...] = setting(
        disruption_keys, (SCALE_DOWN_DISABLED, DO_NOT_DISRUPT)
    )


def hygiene_signals(value: object) -> dict[str, Severity]:
    """The hygiene findings that are fault signals, each with its severity: only the
    ones that leave a node's GPUs unusable (model.HYGIENE_SIGNAL_KINDS)."""
    kind = one_of(*HYGIENE_SIGNAL_KINDS)
    return {kind(k): enum_of(Severity)(v) for k, v in string_map(value).items()}


@dataclass(frozen=True)
class RolloutsConfig:
    """GPURollouts (`gpuheal rollout start`), driven by the leader (docs/controller.md,
    "Roll-outs")."""

    # A pass over each roll-out in progress at least this often (at once after a
    # pass that moved a node): each costs a LIST of the GPU nodes and a GET.
    poll_seconds: float = setting(number(0.1, 600), 5.0)


@dataclass(frozen=True)
class HygieneConfig:
    """Fleet hygiene (gpuheal/policy/hygiene.py, `gpuheal audit`'s checks): run by
    every controller replica from its caches and exported as gpuheal_hygiene_findings
    (docs/controller.md, "Fleet hygiene")."""

    interval_seconds: float = setting(number(1, 3600), 60.0)
    # Findings that are fault signals (source `hygiene/<kind>`), with their severity.
    # None by default: a node whose GPUs cannot be allocated takes no new GPU pods
    # anyway, and its running pods may be fine; draining them is for you to choose.
    signals: Mapping[str, Severity] = setting(hygiene_signals, factory=dict)
    # A finding becomes a signal once it has lasted this long (a device plugin restarting
    # after a driver upgrade is not one).
    signal_after_seconds: float = setting(number(0, MAX_DELAY_S), 600.0)
    # A GPU pod still Terminating this long past its grace period is a leak (the
    # command's --stuck-after, whose default this is).
    stuck_after_seconds: float = setting(number(0, MAX_DELAY_S), 60.0)
    # A node Ready for less than this may still be starting its device plugin: no
    # device-plugin-missing finding yet.
    device_plugin_grace_seconds: float = setting(number(0, MAX_DELAY_S), 300.0)


@dataclass(frozen=True)
class RepeatOffendersConfig:
    """Nodes whose faults recur (policy/offenders.py, docs/controller.md, "Repeat
    offenders"): the node's `faults`-th fault within the window, device faults
    included, flags contact support, and the node is held out after it until a
    person releases it."""

    # Meta's study of its clusters (arXiv 2410.21680) found such "lemon" nodes
    # behind a large share of large jobs' failures: three in three days is past chance.
    faults: int = setting(integer(1, MAX_COUNT), 3)
    window_seconds: float = setting(number(0, MAX_WINDOW_S), 3 * 86400.0)
    # Off: flagged and told, then returned as any other node once the gate passes.
    hold: bool = setting(boolean, True)


@dataclass(frozen=True)
class SweepConfig:
    """Active checks on idle nodes (controller/sweep.py, docs/operations.md, "The
    idle-node sweep"): the validation Job (healthGate.validation's image, command and
    NCCL threshold) on GPU nodes that hold no GPU pods, fenced only while it runs."""

    # Off by default: the Job needs the validation image on the GPU nodes, and each
    # check holds a node's GPUs for up to timeoutSeconds.
    enabled: bool = setting(boolean, False)
    # A node is checked at most this often (from the end of its last check).
    interval_hours: float = setting(number(1, 24 * 365), 168.0)
    # Checks running at once, fleet-wide: each holds one idle node out.
    max_concurrent: int = setting(integer(1, 1000), 2)
    # The pools swept (empty: every pool).
    pools: tuple[str, ...] = setting(strings, ())
    # DCGM's diagnostic level for the sweep: 3 finds what a short run does not (the
    # memory and stress tests), and an idle node can spare the time.
    dcgm_level: int = setting(integer(1, 4), 3)
    # A check with no result by then ends: a running one as a failure (a hang on the
    # GPUs), one that never started as an error, not a fault.
    timeout_seconds: float = setting(number(60, 86400), 3600.0)
    # How often the leader looks (a pending GPU pod also wakes it at once).
    pass_seconds: float = setting(number(1, 3600), 30.0)


@dataclass(frozen=True)
class Config(Scope, Remediation, Eviction, Pace, Signals, HttpApi, Runtime):
    """The whole document: the top-level keys of each concern, and the sections."""

    device_health: DeviceHealthConfig = section(DeviceHealthConfig)
    pools: PoolsConfig = section(PoolsConfig)
    health_gate: HealthGateConfig = section(HealthGateConfig)
    maintenance: MaintenanceConfig = section(MaintenanceConfig)
    retention: RetentionConfig = section(RetentionConfig)
    repair: RepairConfig = section(RepairConfig)
    autoscalers: AutoscalersConfig = section(AutoscalersConfig)
    hygiene: HygieneConfig = section(HygieneConfig)
    rollouts: RolloutsConfig = section(RolloutsConfig)
    sweep: SweepConfig = section(SweepConfig)
    repeat_offenders: RepeatOffendersConfig = section(RepeatOffendersConfig)


# Every section's keys by its place in the document ("": the top level).
SCHEMAS = schemas_of(Config)


def parse_config(raw: object) -> Config:
    """Validate a decoded YAML document; raise ConfigError naming every bad key."""
    return parse_document(Config, raw, TITLE, _cross_checks)


def _cross_checks(config: Config) -> list[str]:
    errors = []
    if config.eviction_retry_max_seconds < config.eviction_retry_base_seconds:
        errors.append("evictionRetryMaxSeconds: must be >= evictionRetryBaseSeconds")
    both = sorted(set(config.checkpoint.reasons) & set(config.checkpoint.immediate_reasons))
    if both:
        errors.append(
            f"checkpoint.immediateReasons: {', '.join(both)} also in checkpoint.reasons; "
            "a reason either waits or moves at once"
        )
    m = config.maintenance
    if m.checkpoint == "webhook" and not m.checkpoint_webhook_url:
        errors.append("maintenance.checkpointWebhookUrl: required when checkpoint is webhook")
    hook = config.repair.replace
    if hook.webhook and hook.command:
        errors.append("repair.replace: a webhook or a command, not both")
    replaced = sorted(r for r, a in config.repair.action_by_reason.items() if a == "replace")
    if replaced and not hook.configured:
        errors.append(
            f"repair.actionByReason: {', '.join(replaced)} mapped to replace, but "
            "repair.replace has no webhook or command"
        )
    gate = config.health_gate
    both = sorted(set(gate.environment_required) & set(gate.environment_ignored))
    if both:
        errors.append(
            f"healthGate.environmentIgnored: {', '.join(both)} also in environmentRequired"
        )
    le = config.leader_election
    if not le.retry_period_seconds < le.renew_deadline_seconds < le.lease_seconds:
        errors.append(
            "leaderElection: need retryPeriodSeconds < renewDeadlineSeconds < leaseSeconds"
        )
    return errors


def load_config(path: Path | None, *, check_files: bool = False) -> Config:
    """Read and validate the YAML file at `path`; None gives the defaults.

    `check_files`: also read the files the config names that the controller
    reads (`apiTokenFile`), as its start and reload do; the operator commands
    share the document but not the files."""
    config = Config() if path is None else parse_config(load_yaml(path))
    if check_files:
        refuse(TITLE, _file_checks(config))
    return config


def _file_checks(config: Config) -> list[str]:
    errors = []
    if config.api_token_file is not None:
        try:
            config.api_token_file.read_bytes()
        except OSError as err:
            errors.append(f"apiTokenFile: cannot read {config.api_token_file}: {err.strerror}")
    if config.console_view_token_file is not None:
        try:
            config.console_view_token_file.read_bytes()
        except OSError as err:
            errors.append(
                f"consoleViewTokenFile: cannot read {config.console_view_token_file}: "
                f"{err.strerror}"
            )
    return errors
