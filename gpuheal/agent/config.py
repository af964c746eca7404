"""The agent's configuration: one YAML document, validated like the controller's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuheal.config import (
    MAX_CELSIUS,
    MAX_COUNT,
    MAX_DELAY_S,
    MAX_GPUS,
    ConfigError,
    boolean,
    enum_of,
    fields_of,
    integer,
    load_yaml,
    number,
    string,
    strings,
)
from gpuheal.model import Severity
from gpuheal.xid import Action, XidRow


@dataclass(frozen=True)
class AgentConfig:
    interval_seconds: float = 10.0
    fail_rounds: int = 3
    healthy_rounds: int = 3
    immediate_p0_xid: bool = False
    # Expected GPU count: this value, else the node label, else "whatever is visible".
    expected_gpus: int | None = None
    expected_gpus_label: str = "nvidia.com/gpu.count"
    temperature_warning_c: int = 85
    temperature_critical_c: int = 95
    nvml_enabled: bool = True
    nvml_timeout_seconds: float = 5.0
    nvml_backend: str = "real"  # real | fake
    nvml_fake_spec: Path | None = None
    nvml_events: bool = True
    kmsg_enabled: bool = True
    kmsg_path: Path = Path("/dev/kmsg")
    state_path: Path = Path("/var/lib/gpuheal/agent-state.json")
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")
    smi_enabled: bool = False
    smi_command: tuple[str, ...] = ("nvidia-smi",)
    smi_timeout_seconds: float = 10.0
    env_enabled: bool = True
    device_paths: tuple[Path, ...] = (Path("/dev/nvidiactl"), Path("/dev/nvidia-uvm"))
    driver_version_path: Path = Path("/proc/driver/nvidia/version")
    xid_overrides: dict[int, XidRow] = field(default_factory=dict)
    # How long an Xid (or other kernel event) keeps a GPU faulty; None: until reboot.
    xid_hold_seconds: float | None = None
    metrics_port: int = 9101
    # Where the host's /proc is seen (/proc with hostPID; else the host's /proc mounted):
    # a GPU process's /proc/<pid>/cgroup names its pod.
    proc_root: Path = Path("/proc")
    # GPU compute processes are listed at most this often (they change often); 0: never.
    process_report_seconds: float = 60.0
    # At most this many processes in the annotation; the rest are left out (and logged).
    process_report_max: int = 64


def _path(value: Any) -> Path:
    return Path(string(value))


def _paths(value: Any) -> tuple[Path, ...]:
    return tuple(Path(p) for p in strings(value))


def _backend(value: Any) -> str:
    if value not in ("real", "fake"):
        raise ValueError(f"must be real or fake, got {value!r}")
    return str(value)


def _xid_rows(value: Any) -> dict[int, XidRow]:
    if not isinstance(value, dict):
        raise ValueError(f"must be a map of Xid number to row, got {type(value).__name__}")
    rows: dict[int, XidRow] = {}
    for key, row in value.items():
        try:
            if isinstance(key, bool) or not isinstance(key, int | str):
                raise TypeError(key)
            xid = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"key {key!r} is not an Xid number") from None
        if not isinstance(row, dict) or not {"reason", "severity"} <= row.keys():
            raise ValueError(f"[{key}] needs reason and severity")
        rows[xid] = XidRow(
            reason=string(row["reason"]),
            severity=enum_of(Severity)(row["severity"]),
            action=Action(row.get("action", "none")),
            description=str(row.get("description", "set by config")),
        )
    return rows


_SCHEMA: dict[str, tuple[str, Any]] = {
    "intervalSeconds": ("interval_seconds", number(0.05, 3600)),
    "failRounds": ("fail_rounds", integer(1, MAX_COUNT)),
    "healthyRounds": ("healthy_rounds", integer(1, MAX_COUNT)),
    "immediateP0Xid": ("immediate_p0_xid", boolean),
    "expectedGpus": ("expected_gpus", integer(0, MAX_GPUS)),
    "expectedGpusLabel": ("expected_gpus_label", string),
    "temperatureWarningC": ("temperature_warning_c", integer(0, MAX_CELSIUS)),
    "temperatureCriticalC": ("temperature_critical_c", integer(0, MAX_CELSIUS)),
    "nvmlEnabled": ("nvml_enabled", boolean),
    "nvmlTimeoutSeconds": ("nvml_timeout_seconds", number(0.05, 600)),
    "nvmlBackend": ("nvml_backend", _backend),
    "nvmlFakeSpec": ("nvml_fake_spec", _path),
    "nvmlEvents": ("nvml_events", boolean),
    "kmsgEnabled": ("kmsg_enabled", boolean),
    "kmsgPath": ("kmsg_path", _path),
    "statePath": ("state_path", _path),
    "bootIdPath": ("boot_id_path", _path),
    "smiEnabled": ("smi_enabled", boolean),
    "smiCommand": ("smi_command", strings),
    "smiTimeoutSeconds": ("smi_timeout_seconds", number(0.05, 600)),
    "envEnabled": ("env_enabled", boolean),
    "devicePaths": ("device_paths", _paths),
    "driverVersionPath": ("driver_version_path", _path),
    "xid": ("xid_overrides", _xid_rows),
    "xidHoldSeconds": ("xid_hold_seconds", number(0, MAX_DELAY_S)),
    "metricsPort": ("metrics_port", integer(0, 65535)),
    "procRoot": ("proc_root", _path),
    "processReportSeconds": ("process_report_seconds", number(0, 86400)),
    "processReportMax": ("process_report_max", integer(1, 10_000)),
}


def parse_agent_config(raw: Any) -> AgentConfig:
    errors: list[str] = []
    values = fields_of({} if raw is None else raw, _SCHEMA, "", errors)
    if not errors:
        config = AgentConfig(**values)
        if config.nvml_backend == "fake" and config.nvml_fake_spec is None:
            errors.append("nvmlFakeSpec: required when nvmlBackend is fake")
        if config.temperature_critical_c < config.temperature_warning_c:
            errors.append("temperatureCriticalC: must be >= temperatureWarningC")
    if errors:
        raise ConfigError("invalid agent configuration:\n  " + "\n  ".join(errors))
    return config


def load_agent_config(path: Path | None) -> AgentConfig:
    return AgentConfig() if path is None else parse_agent_config(load_yaml(path))
