"""The controller's configuration: one YAML document, validated at start.

Every problem is reported with the dotted path of the bad key
(`breaker.maxPercent: must be a number between 0 and 100, got 250`), and the
controller refuses to start. Unknown keys are errors too: a typo must not
silently fall back to a default. Every number is finite (YAML's `.nan` and
`.inf`, and `1e400`, are refused) and within a sane bound: a counter, a size or
a duration past any plausible setting is a typo, not a request.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuheal.model import GPU_HEALTHY_CONDITION, MAINTENANCE_TAINT_KEY, Mode, Severity, Taint


class ConfigError(ValueError):
    """The configuration is invalid; the message names every bad key."""


@dataclass(frozen=True)
class ConditionRule:
    """Map a NodeCondition written by any detector to a fault signal."""

    type: str
    status: str = "False"
    reasons: tuple[str, ...] = ()  # empty: any reason
    fault_reason: str = ""  # empty: the condition's own reason, else its type
    severity: Severity = Severity.P0

    def matches(self, type_: str, status: str, reason: str) -> bool:
        return (
            type_ == self.type
            and status == self.status
            and (not self.reasons or reason in self.reasons)
        )


@dataclass(frozen=True)
class NotificationSink:
    url: str  # a secret: logged only as url_origin(url)
    format: str = "json"  # json | slack

    @property
    def shown(self) -> str:
        return url_origin(self.url)


def url_origin(url: str) -> str:
    """A URL as it may be logged: scheme and host (and port) only.

    Webhook URLs carry their secret anywhere but in the host: a Slack webhook in
    its path (`/services/T.../B.../<secret>`), others in the query or as
    `user:password@`."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:  # a port that is not a number, a bad IPv6 literal
        return "<unparsable URL>"
    if not parts.scheme or not host:
        return "<unparsable URL>"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def without_url_secrets(text: str, url: str) -> str:
    """`text` (an HTTP client's error message, say) with every part of `url` that
    may be secret taken out: any URL on the same host, however the client wrote
    it, becomes the origin; the path, query, fragment and user info, alone (as
    given or percent-encoded either way), become `<redacted>`."""
    origin = url_origin(url)
    parts = urllib.parse.urlsplit(url)
    if parts.hostname:
        on_host = re.compile(
            rf"[a-z][a-z0-9+.-]*://[^\s'\"<>]*?{re.escape(parts.hostname)}[^\s'\"<>)]*",
            re.IGNORECASE,
        )
        text = on_host.sub(origin, text)
    secrets = {parts.path if parts.path != "/" else "", parts.query, parts.fragment}
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at:
        secrets |= {userinfo, *userinfo.split(":", 1)}
    for secret in list(secrets):
        secrets |= {urllib.parse.unquote(secret), urllib.parse.quote(secret, safe="/")}
    for secret in sorted((s for s in secrets if len(s) > 1), key=len, reverse=True):
        text = text.replace(secret, "<redacted>")
    return text


@dataclass(frozen=True)
class LeaderElection:
    enabled: bool = True
    namespace: str = "gpuheal-system"
    name: str = "gpuheal-controller"
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0


@dataclass(frozen=True)
class DeviceHealthConfig:
    """Device-level health from Pod allocatedResourcesStatus (docs/controller.md)."""

    enabled: bool = True
    # A Healthy report not renewed for this long counts as Unknown; 0: never.
    heartbeat_seconds: float = 0.0
    # Unknown for less than this: an Event and a metric; longer: the device is suspect.
    unknown_tolerance_seconds: float = 300.0
    # A device quarantine lasts at least this long without a fresh Healthy report;
    # a failed canary extends it by as much.
    quarantine_seconds: float = 3600.0
    # Below this fraction of healthy devices the whole node is quarantined.
    min_healthy_fraction: float = 0.5
    # This many device faults on one node within the window: the whole node.
    escalate_after_faults: int = 3
    escalation_window_seconds: float = 86400.0
    # The same device failing again this soon after its release: the whole node.
    repeat_window_seconds: float = 7 * 86400.0
    # A device health message containing one of these (any case): the whole node.
    whole_node_reasons: tuple[str, ...] = ("fallen off the bus", "nvlink", "fabric")
    # Evictions of pods holding bad devices, per node.
    evictions_per_minute: float = 6.0
    eviction_burst: int = 2
    canary_image: str = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
    canary_command: tuple[str, ...] = ("nvidia-smi",)
    canary_namespace: str = "gpuheal-system"
    canary_timeout_seconds: float = 300.0
    # Healthy after a passed canary for this long: the device is released.
    observation_seconds: float = 600.0
    # Released this soon after its quarantine, with no canary failure: a false quarantine.
    false_quarantine_seconds: float = 3600.0
    # This many faults of one node within the window: flagged "contact support".
    contact_support_after: int = 3
    contact_support_window_seconds: float = 3 * 86400.0


@dataclass(frozen=True)
class PoolConfig:
    """What every node of one GPU pool should look like (the health gate, `audit`)."""

    # GPUs each node should offer; None: the node's expectedGpusLabel, if any.
    gpus_per_node: int | None = None
    # The resource those GPUs are offered as (nvidia.com/gpu, or a MIG resource).
    resource: str = "nvidia.com/gpu"
    # "": the version most nodes of the pool run.
    driver_version: str = ""
    cuda_version: str = ""
    # `gpuheal audit`: labels ("*": any value) and taints this pool's nodes must carry,
    # on top of the fleet-wide ones in PoolsConfig.
    expected_labels: Mapping[str, str] = field(default_factory=dict)
    expected_taints: tuple[Taint, ...] = ()


@dataclass(frozen=True)
class PoolsConfig:
    # The node label naming a node's pool; then the fallbacks, in order.
    label: str = "gpuheal.io/pool"
    fallback_labels: tuple[str, ...] = ("nvidia.com/gpu.product",)
    # GPU feature discovery's per-node GPU count.
    expected_gpus_label: str = "nvidia.com/gpu.count"
    by_name: Mapping[str, PoolConfig] = field(default_factory=dict)
    # `gpuheal audit`: labels ("*": any value) and taints every GPU node must carry.
    expected_labels: Mapping[str, str] = field(default_factory=dict)
    expected_taints: tuple[Taint, ...] = ()
    # Node labels naming a node's rack, first present wins (`gpuheal doctor`'s neighbours).
    rack_labels: tuple[str, ...] = ("topology.kubernetes.io/rack", "rack")


@dataclass(frozen=True)
class HealthGateConfig:
    """Checks a node passes before it is returned (docs/operations.md)."""

    # The controller's recovery runs the gate before it removes the fault taint.
    on_recovery: bool = True
    # The device-plugin pod on the node: found by these labels, in these namespaces
    # (empty: any). Not required: a node without one passes this check.
    device_plugin_selector: Mapping[str, str] = field(
        default_factory=lambda: {"app": "nvidia-device-plugin-daemonset"}
    )
    device_plugin_namespaces: tuple[str, ...] = ()
    device_plugin_required: bool = False
    # A diagnostics result (gpuheal.io/diagnostics) must be present, passing and fresh.
    diagnostics_required: bool = False
    diagnostics_max_age_seconds: float = 86400.0


@dataclass(frozen=True)
class MaintenanceConfig:
    taint_key: str = MAINTENANCE_TAINT_KEY
    taint_effect: str = "NoSchedule"
    # How GPU workloads are told to checkpoint: annotate | webhook | none.
    checkpoint: str = "annotate"
    checkpoint_webhook_url: str = ""
    # How long GPU pods get to leave on their own before the drain.
    checkpoint_wait_seconds: float = 300.0
    drain_timeout_seconds: float = 1800.0
    eviction_retry_seconds: float = 5.0


@dataclass(frozen=True)
class ApprovalConfig:
    """A person approves a fault's plan before its first taint or eviction."""

    required: bool = False
    # Fault reason -> required, over `required`.
    by_reason: Mapping[str, bool] = field(default_factory=dict)
    # An unanswered plan ends (record Failed, `approval-expired`) after this long.
    expiry_seconds: float = 3600.0

    def required_for(self, reason: str) -> bool:
        return self.by_reason.get(reason, self.required)


@dataclass(frozen=True)
class RetentionConfig:
    """Closed GPUFault records are deleted, by age and by a count per node; open
    ones never (docs/controller.md, "Retention")."""

    enabled: bool = True
    # A closed record older than this (since it was closed) is deleted.
    resolved_max_age_seconds: float = 30 * 86400.0
    # At most this many closed records per node: the newest are kept.
    per_node_max: int = 50
    # How often the leader looks for records to delete (in its informer cache).
    interval_seconds: float = 600.0
    # Deletes are paced: the API server is shared with remediation.
    deletes_per_second: float = 20.0


@dataclass(frozen=True)
class Config:
    # Which nodes are GPU nodes we manage (label equality, all must match).
    node_selector: Mapping[str, str] = field(
        default_factory=lambda: {"nvidia.com/gpu.present": "true"}
    )
    mode: Mode = Mode.FULL
    mode_by_reason: Mapping[str, Mode] = field(default_factory=dict)
    taint_effect: str = "NoSchedule"
    # Resource names that make a pod a GPU pod; a trailing * matches a prefix (MIG).
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-*")
    protected_namespaces: tuple[str, ...] = ("kube-system",)
    eviction_retry_base_seconds: float = 2.0
    eviction_retry_max_seconds: float = 60.0
    # Delete a pod whose eviction stays blocked this long; None: never delete.
    eviction_delete_after_seconds: float | None = None
    rate_limit_per_second: float = 2.0
    rate_limit_burst: int = 2
    breaker_max_nodes: int = 10
    breaker_max_percent: float = 10.0
    recovery_window_seconds: float = 300.0
    cooldown_seconds: float = 600.0
    dedupe_ttl_seconds: float = 3600.0
    hold_retry_seconds: float = 10.0
    conditions: tuple[ConditionRule, ...] = (
        ConditionRule(type=GPU_HEALTHY_CONDITION, status="False"),
    )
    # A P1 fault still present after this long is handled as P0.
    p1_escalation_seconds: float = 600.0
    # A P1 fault's node is tainted NoSchedule while it is watched (within the breaker).
    p1_taint: bool = False
    # External signals (alerts, manual requests) stay active this long after they were
    # last seen, unless resolved: longer than Alertmanager's repeat_interval.
    external_signal_ttl_seconds: float = 6 * 3600.0
    # A resolved alert withdraws its signal; off: the signal stays until it expires.
    resolved_alert_clears: bool = False
    # Every managed node is reconciled from the caches this often, whatever the events.
    resync_seconds: float = 300.0
    # Alert labels that name the node, in order; "instance" is matched to node addresses.
    alert_node_labels: tuple[str, ...] = ("node", "Hostname", "hostname", "instance")
    # The API's bearer token(s), one a line, from a mounted Secret file; re-read when
    # the file changes. None: every request that needs a token is refused.
    api_token_file: Path | None = None
    api_max_body_bytes: int = 1 << 20
    # The budget of each token; clients without a valid one share a small one per address.
    api_client_rate_per_second: float = 20.0
    api_client_burst: int = 40
    # GET /api/v1/faults (node and pod names) without a token: for a trusted network only.
    api_open_reads: bool = False
    # Webhook sinks told after each remediation step: {url, format: json|slack}.
    notification_sinks: tuple[NotificationSink, ...] = ()
    # Optional DCGM source: dcgm-exporter series queried from this Prometheus.
    dcgm_prometheus_url: str | None = None
    dcgm_interval_seconds: float = 30.0
    dcgm_temperature_warning_c: int = 85
    dcgm_temperature_critical_c: int = 95
    workers: int = 4
    watch_timeout_seconds: int = 300
    watch_inactivity_seconds: float = 90.0
    leader_election: LeaderElection = field(default_factory=LeaderElection)
    device_health: DeviceHealthConfig = field(default_factory=DeviceHealthConfig)
    pools: PoolsConfig = field(default_factory=PoolsConfig)
    health_gate: HealthGateConfig = field(default_factory=HealthGateConfig)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    approval: ApprovalConfig = field(default_factory=ApprovalConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)

    def mode_for(self, reason: str) -> Mode:
        return self.mode_by_reason.get(reason, self.mode)

    def is_gpu_resource(self, name: str) -> bool:
        return any(
            name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern
            for pattern in self.gpu_resources
        )


# Schema helpers, shared with the agent's config: each parser raises ValueError
# with a short reason; `fields_of` adds the dotted key path.
def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


# Upper bounds for durations (seconds): a delay or timeout, and a window of history.
MAX_DELAY_S = 30 * 86400.0
MAX_WINDOW_S = 365 * 86400.0
MAX_WORKERS = 64
MAX_NODES = 1_000_000  # more than any cluster holds
MAX_RATE = 1_000_000.0  # per second (per minute for device evictions): "unlimited"
MAX_BURST = 1_000_000
MAX_BODY_BYTES = 64 << 20
MAX_CELSIUS = 200
MAX_COUNT = 1000  # faults, rounds: "after this many" thresholds
MAX_GPUS = 1024  # per node, MIG instances included


def number(low: float, high: float) -> Any:
    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"must be between {low:g} and {high:g}, got {value!r}")
        return float(value)

    return parse


def integer(low: int, high: int) -> Any:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"must be a map of strings to strings, got {value!r}")
    return dict(value)


def enum_of(kind: type[Mode] | type[Severity]) -> Any:
    def parse(value: Any) -> Any:
        try:
            return kind(value)
        except ValueError:
            choices = ", ".join(m.value for m in kind)
            raise ValueError(f"must be one of {choices}, got {value!r}") from None

    return parse


def mode_map(value: Any) -> dict[str, Mode]:
    raw = string_map(value)
    return {reason: enum_of(Mode)(mode) for reason, mode in raw.items()}


def bool_map(value: Any) -> dict[str, bool]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, bool) for k, v in value.items()
    ):
        raise ValueError(f"must be a map of strings to true or false, got {value!r}")
    return dict(value)


def effect(value: Any) -> str:
    if value not in ("NoSchedule", "NoExecute"):
        raise ValueError(f"must be NoSchedule or NoExecute, got {value!r}")
    return str(value)


def optional(parse: Any) -> Any:
    return lambda value: None if value is None else parse(value)


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be an http(s) URL, got {type(value).__name__}")
    # The value is not echoed: a webhook URL is a secret (a typo'd one too).
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"must be an http(s) URL, got {len(value)} characters without http(s)://")
    if url_origin(value) == "<unparsable URL>":
        raise ValueError(f"must be an http(s) URL with a host, got {len(value)} characters")
    return value


def _sink_format(value: Any) -> str:
    if value not in ("json", "slack"):
        raise ValueError(f"must be json or slack, got {value!r}")
    return str(value)


_TOP: dict[str, tuple[str, Any]] = {
    "nodeSelector": ("node_selector", string_map),
    "mode": ("mode", enum_of(Mode)),
    "modeByReason": ("mode_by_reason", mode_map),
    "taintEffect": ("taint_effect", effect),
    "gpuResources": ("gpu_resources", strings),
    "protectedNamespaces": ("protected_namespaces", strings),
    "evictionRetryBaseSeconds": ("eviction_retry_base_seconds", number(0.01, 3600)),
    "evictionRetryMaxSeconds": ("eviction_retry_max_seconds", number(0.01, 86400)),
    "evictionDeleteAfterSeconds": (
        "eviction_delete_after_seconds",
        optional(number(0, MAX_DELAY_S)),
    ),
    "rateLimitPerSecond": ("rate_limit_per_second", number(0.001, MAX_RATE)),
    "rateLimitBurst": ("rate_limit_burst", integer(1, MAX_BURST)),
    "breakerMaxNodes": ("breaker_max_nodes", integer(0, MAX_NODES)),
    "breakerMaxPercent": ("breaker_max_percent", number(0, 100)),
    "recoveryWindowSeconds": ("recovery_window_seconds", number(0, MAX_DELAY_S)),
    "cooldownSeconds": ("cooldown_seconds", number(0, MAX_DELAY_S)),
    "dedupeTtlSeconds": ("dedupe_ttl_seconds", number(0, MAX_DELAY_S)),
    "holdRetrySeconds": ("hold_retry_seconds", number(0.01, 3600)),
    "workers": ("workers", integer(1, MAX_WORKERS)),
    "p1EscalationSeconds": ("p1_escalation_seconds", number(0, MAX_DELAY_S)),
    "p1Taint": ("p1_taint", boolean),
    "externalSignalTtlSeconds": ("external_signal_ttl_seconds", number(1, MAX_DELAY_S)),
    "resolvedAlertClears": ("resolved_alert_clears", boolean),
    "resyncSeconds": ("resync_seconds", number(1, 86400)),
    "alertNodeLabels": ("alert_node_labels", strings),
    "apiTokenFile": ("api_token_file", lambda v: Path(string(v))),
    "dcgmPrometheusUrl": ("dcgm_prometheus_url", _url),
    "dcgmIntervalSeconds": ("dcgm_interval_seconds", number(0.5, 3600)),
    "dcgmTemperatureWarningC": ("dcgm_temperature_warning_c", integer(0, MAX_CELSIUS)),
    "dcgmTemperatureCriticalC": ("dcgm_temperature_critical_c", integer(0, MAX_CELSIUS)),
    "apiMaxBodyBytes": ("api_max_body_bytes", integer(1024, MAX_BODY_BYTES)),
    "apiClientRatePerSecond": ("api_client_rate_per_second", number(0.01, MAX_RATE)),
    "apiClientBurst": ("api_client_burst", integer(1, MAX_BURST)),
    "apiOpenReads": ("api_open_reads", boolean),
    "watchTimeoutSeconds": ("watch_timeout_seconds", integer(1, 3600)),
    "watchInactivitySeconds": ("watch_inactivity_seconds", number(1, 3600)),
}

_CONDITION: dict[str, tuple[str, Any]] = {
    "type": ("type", string),
    "status": ("status", string),
    "reasons": ("reasons", strings),
    "faultReason": ("fault_reason", string),
    "severity": ("severity", enum_of(Severity)),
}


_SINK: dict[str, tuple[str, Any]] = {
    "url": ("url", _url),
    "format": ("format", _sink_format),
}

_LEADER: dict[str, tuple[str, Any]] = {
    "enabled": ("enabled", boolean),
    "namespace": ("namespace", string),
    "name": ("name", string),
    "leaseSeconds": ("lease_seconds", number(1, 3600)),
    "renewDeadlineSeconds": ("renew_deadline_seconds", number(0.5, 3600)),
    "retryPeriodSeconds": ("retry_period_seconds", number(0.1, 3600)),
}


_DEVICE_HEALTH: dict[str, tuple[str, Any]] = {
    "enabled": ("enabled", boolean),
    "heartbeatSeconds": ("heartbeat_seconds", number(0, MAX_DELAY_S)),
    "unknownToleranceSeconds": ("unknown_tolerance_seconds", number(0, MAX_DELAY_S)),
    "quarantineSeconds": ("quarantine_seconds", number(0, MAX_DELAY_S)),
    "minHealthyFraction": ("min_healthy_fraction", number(0, 1)),
    "escalateAfterFaults": ("escalate_after_faults", integer(1, MAX_COUNT)),
    "escalationWindowSeconds": ("escalation_window_seconds", number(0, MAX_WINDOW_S)),
    "repeatWindowSeconds": ("repeat_window_seconds", number(0, MAX_WINDOW_S)),
    "wholeNodeReasons": ("whole_node_reasons", lambda v: tuple(r.lower() for r in strings(v))),
    "evictionsPerMinute": ("evictions_per_minute", number(0.01, MAX_RATE)),
    "evictionBurst": ("eviction_burst", integer(1, MAX_BURST)),
    "canaryImage": ("canary_image", string),
    "canaryCommand": ("canary_command", strings),
    "canaryNamespace": ("canary_namespace", string),
    "canaryTimeoutSeconds": ("canary_timeout_seconds", number(1, 86400)),
    "observationSeconds": ("observation_seconds", number(0, MAX_DELAY_S)),
    "falseQuarantineSeconds": ("false_quarantine_seconds", number(0, MAX_WINDOW_S)),
    "contactSupportAfter": ("contact_support_after", integer(1, MAX_COUNT)),
    "contactSupportWindowSeconds": (
        "contact_support_window_seconds",
        number(0, MAX_WINDOW_S),
    ),
}


def _checkpoint(value: Any) -> str:
    if value not in ("annotate", "webhook", "none"):
        raise ValueError(f"must be annotate, webhook or none, got {value!r}")
    return str(value)


_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def taint_spec(value: Any) -> Taint:
    """ "key[=value]:Effect", as kubectl taint writes it."""
    text = string(value)
    head, sep, effect_ = text.rpartition(":")
    key, _, taint_value = head.partition("=")
    if not sep or not key or effect_ not in _TAINT_EFFECTS:
        choices = ", ".join(_TAINT_EFFECTS)
        raise ValueError(f"must be key[=value]:Effect with Effect one of {choices}, got {text!r}")
    return Taint(key=key, effect=effect_, value=taint_value)


def taint_specs(value: Any) -> tuple[Taint, ...]:
    if not isinstance(value, list):
        raise ValueError(f"must be a list of key[=value]:Effect, got {value!r}")
    return tuple(taint_spec(item) for item in value)


_POOL: dict[str, tuple[str, Any]] = {
    "gpusPerNode": ("gpus_per_node", integer(0, MAX_GPUS)),
    "resource": ("resource", string),
    "driverVersion": ("driver_version", string),
    "cudaVersion": ("cuda_version", string),
    "expectedLabels": ("expected_labels", string_map),
    "expectedTaints": ("expected_taints", taint_specs),
}

_POOLS: dict[str, tuple[str, Any]] = {
    "label": ("label", string),
    "fallbackLabels": ("fallback_labels", strings),
    "expectedGpusLabel": ("expected_gpus_label", string),
    "byName": ("by_name", lambda v: _map(v, "pool name to pool")),  # entries: _POOL
    "expectedLabels": ("expected_labels", string_map),
    "expectedTaints": ("expected_taints", taint_specs),
    "rackLabels": ("rack_labels", strings),
}

_HEALTH_GATE: dict[str, tuple[str, Any]] = {
    "onRecovery": ("on_recovery", boolean),
    "devicePluginSelector": ("device_plugin_selector", string_map),
    "devicePluginNamespaces": ("device_plugin_namespaces", strings),
    "devicePluginRequired": ("device_plugin_required", boolean),
    "diagnosticsRequired": ("diagnostics_required", boolean),
    "diagnosticsMaxAgeSeconds": ("diagnostics_max_age_seconds", number(1, MAX_DELAY_S)),
}

_MAINTENANCE: dict[str, tuple[str, Any]] = {
    "taintKey": ("taint_key", string),
    "taintEffect": ("taint_effect", effect),
    "checkpoint": ("checkpoint", _checkpoint),
    "checkpointWebhookUrl": ("checkpoint_webhook_url", _url),
    "checkpointWaitSeconds": ("checkpoint_wait_seconds", number(0, MAX_DELAY_S)),
    "drainTimeoutSeconds": ("drain_timeout_seconds", number(1, MAX_DELAY_S)),
    "evictionRetrySeconds": ("eviction_retry_seconds", number(0.1, 3600)),
}


_APPROVAL: dict[str, tuple[str, Any]] = {
    "required": ("required", boolean),
    "byReason": ("by_reason", bool_map),
    "expirySeconds": ("expiry_seconds", number(1, MAX_DELAY_S)),
}


_RETENTION: dict[str, tuple[str, Any]] = {
    "enabled": ("enabled", boolean),
    "resolvedMaxAgeSeconds": ("resolved_max_age_seconds", number(60, MAX_WINDOW_S)),
    "perNodeMax": ("per_node_max", integer(1, MAX_COUNT)),
    "intervalSeconds": ("interval_seconds", number(1, 86400)),
    "deletesPerSecond": ("deletes_per_second", number(0.1, 1000)),
}


# The sections parse_config reads apart from _TOP, and every section's keys by
# its place in the document: docs/controller.md has one table per section with
# exactly these keys (tests/unit/test_config_docs.py).
NESTED = (
    "conditions",
    "notificationSinks",
    "leaderElection",
    "deviceHealth",
    "pools",
    "healthGate",
    "maintenance",
    "approval",
    "retention",
)
SCHEMAS: dict[str, dict[str, tuple[str, Any]]] = {
    "": _TOP,
    "conditions[]": _CONDITION,
    "notificationSinks[]": _SINK,
    "leaderElection": _LEADER,
    "deviceHealth": _DEVICE_HEALTH,
    "pools": _POOLS,
    "pools.byName.<pool>": _POOL,
    "healthGate": _HEALTH_GATE,
    "maintenance": _MAINTENANCE,
    "approval": _APPROVAL,
    "retention": _RETENTION,
}


def _map(value: Any, what: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"must be a map of {what}, got {type(value).__name__}")
    return value


def _pools(raw: Any, errors: list[str]) -> PoolsConfig:
    values = fields_of(raw, _POOLS, "pools", errors)
    by_name = values.get("by_name", {})
    values["by_name"] = {
        str(name): PoolConfig(**fields_of(pool, _POOL, f"pools.byName.{name}", errors))
        for name, pool in by_name.items()
    }
    return PoolsConfig(**values)


def fields_of(
    raw: Any, schema: dict[str, tuple[str, Any]], path: str, errors: list[str]
) -> dict[str, Any]:
    if not isinstance(raw, dict):
        errors.append(f"{path or '<root>'}: must be a map, got {type(raw).__name__}")
        return {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in schema:
            known = ", ".join(sorted(schema))
            errors.append(f"{where}: unknown key (known: {known})")
            continue
        name, parse = schema[key]
        try:
            out[name] = parse(value)
        except ValueError as err:
            errors.append(f"{where}: {err}")
    return out


def _list_of(
    raw: dict[str, Any],
    key: str,
    schema: dict[str, tuple[str, Any]],
    required: str,
    errors: list[str],
) -> list[dict[str, Any]] | None:
    """Parse a list of maps under `key`; None when the key is absent."""
    if key not in raw:
        return None
    items = raw[key]
    if not isinstance(items, list):
        errors.append(f"{key}: must be a list, got {type(items).__name__}")
        return []
    parsed = []
    for i, item in enumerate(items):
        fields = fields_of(item, schema, f"{key}[{i}]", errors)
        if isinstance(item, dict) and required not in item:
            errors.append(f"{key}[{i}].{required}: required")
        elif schema[required][0] in fields:
            parsed.append(fields)
    return parsed


def parse_config(raw: Any) -> Config:
    """Validate a decoded YAML document; raise ConfigError naming every bad key."""
    errors: list[str] = []
    raw = {} if raw is None else raw
    top = {k: v for k, v in raw.items() if k not in NESTED} if isinstance(raw, dict) else raw
    values = fields_of(top, _TOP, "", errors)
    if isinstance(raw, dict):
        rules = _list_of(raw, "conditions", _CONDITION, "type", errors)
        if rules is not None:
            values["conditions"] = tuple(ConditionRule(**r) for r in rules)
        sinks = _list_of(raw, "notificationSinks", _SINK, "url", errors)
        if sinks is not None:
            values["notification_sinks"] = tuple(NotificationSink(**r) for r in sinks)
        if "leaderElection" in raw:
            values["leader_election"] = LeaderElection(
                **fields_of(raw["leaderElection"], _LEADER, "leaderElection", errors)
            )
        if "deviceHealth" in raw:
            values["device_health"] = DeviceHealthConfig(
                **fields_of(raw["deviceHealth"], _DEVICE_HEALTH, "deviceHealth", errors)
            )
        if "pools" in raw:
            values["pools"] = _pools(raw["pools"], errors)
        if "healthGate" in raw:
            values["health_gate"] = HealthGateConfig(
                **fields_of(raw["healthGate"], _HEALTH_GATE, "healthGate", errors)
            )
        if "maintenance" in raw:
            values["maintenance"] = MaintenanceConfig(
                **fields_of(raw["maintenance"], _MAINTENANCE, "maintenance", errors)
            )
        if "approval" in raw:
            values["approval"] = ApprovalConfig(
                **fields_of(raw["approval"], _APPROVAL, "approval", errors)
            )
        if "retention" in raw:
            values["retention"] = RetentionConfig(
                **fields_of(raw["retention"], _RETENTION, "retention", errors)
            )
    if not errors:
        config = Config(**values)
        errors.extend(_cross_checks(config))
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    return config


def _cross_checks(config: Config) -> list[str]:
    errors = []
    if config.eviction_retry_max_seconds < config.eviction_retry_base_seconds:
        errors.append("evictionRetryMaxSeconds: must be >= evictionRetryBaseSeconds")
    m = config.maintenance
    if m.checkpoint == "webhook" and not m.checkpoint_webhook_url:
        errors.append("maintenance.checkpointWebhookUrl: required when checkpoint is webhook")
    le = config.leader_election
    if not le.retry_period_seconds < le.renew_deadline_seconds < le.lease_seconds:
        errors.append(
            "leaderElection: need retryPeriodSeconds < renewDeadlineSeconds < leaseSeconds"
        )
    return errors


def load_yaml(path: Path) -> Any:
    """Read a YAML file; ConfigError (not a traceback) when it is unreadable or broken."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from err
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(err)}") from err


def _yaml_problem(err: yaml.YAMLError) -> str:
    """What is wrong and where, without the excerpt of the line PyYAML quotes:
    that line may hold a webhook URL or another secret."""
    if not isinstance(err, yaml.MarkedYAMLError):
        return str(err)  # a reader error: a character and its position
    where = err.problem_mark or err.context_mark
    at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
    return " ".join(p for p in (err.context, err.problem) if p) + at


def load_config(path: Path | None, *, check_files: bool = False) -> Config:
    """Read and validate the YAML file at `path`; None gives the defaults.

    `check_files`: also read the files the config names that the controller
    reads (`apiTokenFile`), as its start and reload do; the operator commands
    share the document but not the files."""
    config = Config() if path is None else parse_config(load_yaml(path))
    if check_files:
        errors = _file_checks(config)
        if errors:
            raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    return config


def _file_checks(config: Config) -> list[str]:
    errors = []
    if config.api_token_file is not None:
        try:
            config.api_token_file.read_bytes()
        except OSError as err:
            errors.append(f"apiTokenFile: cannot read {config.api_token_file}: {err.strerror}")
    return errors
