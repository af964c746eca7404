"""The agent's configuration: one YAML document, validated like the controller's
(each key declared once, as a field with its parser: gpuheal/config/keys.py)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from gpuheal.agent.degradation import Limits
from gpuheal.agent.infiniband import Expectations as IbExpectations
from gpuheal.config.keys import (
    MAX_CELSIUS,
    MAX_COUNT,
    MAX_DELAY_S,
    MAX_GPUS,
    boolean,
    file_path,
    file_paths,
    integer,
    load_yaml,
    number,
    one_of,
    parse_document,
    schema_of,
    setting,
    string,
    strings,
)
from gpuheal.config.xids import xid_rows
from gpuheal.values import is_label_key, is_label_value, is_subdomain
from gpuheal.xid import XidRow
from gpuheal.xid.limits import NVLINK_CRC_PER_SECOND, NVLINK_ERRORS, NVLINK_WINDOW_SECONDS

TITLE = "invalid agent configuration"


# Where runtimes keep the config that names NVIDIA's runtime or hook: containerd (and
# nvidia-ctk's drop-in), CRI-O (its drop-in and OCI hooks), Docker, k3s's containerd.
RUNTIME_CONFIGS = (
    "/etc/containerd/config.toml",
    "/etc/containerd/conf.d/*.toml",
    "/etc/crio/crio.conf",
    "/etc/crio/crio.conf.d/*",
    "/usr/share/containers/oci/hooks.d/*.json",
    "/etc/docker/daemon.json",
    "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
)
# nvidia_peermem (GPUDirect RDMA) only where RDMA is used: add it there.
NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset")
_MODULE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PCI_ID = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{4}")


def _strings_that(value: Any, fits: Callable[[str], object], must: str) -> tuple[str, ...]:
    """A list of strings, each of which `fits`; else a ValueError: `must`, and the first
    string that does not."""
    items = strings(value)
    for item in items:
        if not fits(item):
            raise ValueError(f"{must}, got {item!r}")
    return items


def _host_glob(path: str) -> bool:
    parsed = PurePosixPath(path)
    return path.startswith("/") and ".." not in parsed.parts and bool(parsed.name)


def host_globs(value: Any) -> tuple[str, ...]:
    return _strings_that(value, _host_glob, "must be absolute host file paths without '..'")


def module_names(value: Any) -> tuple[str, ...]:
    return _strings_that(
        value, _MODULE.fullmatch, "must be kernel module names (letters, digits, _, -)"
    )


def pci_ids(value: Any) -> tuple[str, ...]:
    return _strings_that(value, _PCI_ID.fullmatch, "must be PCI vendor:device ids like 10de:22a3")


@dataclass(frozen=True)
class Rounds:
    """How probe results become a verdict: rounds, and how long an Xid holds."""

    interval_seconds: float = setting(number(0.05, 3600), 10.0)
    fail_rounds: int = setting(integer(1, MAX_COUNT), 3)
    healthy_rounds: int = setting(integer(1, MAX_COUNT), 3)
    immediate_p0_xid: bool = setting(boolean, False)
    xid_overrides: dict[int, XidRow] = setting(xid_rows, factory=dict, key="xid")
    # How long an Xid (or other kernel event) keeps a GPU faulty; None: until reboot.
    xid_hold_seconds: float | None = setting(number(0, MAX_DELAY_S), None)
    # Other Xids on the same GPU this shortly before one are its context: Xid 45
    # after another Xid follows it, Xid 48 with 63/64 is the drain-and-reset branch.
    xid_context_seconds: float = setting(number(0, 3600), 30.0)
    # Application Xids (NVIDIA: restart the application) are never node faults; this
    # many on one GPU (and only one) within the window are, P1. 0: off.
    application_xids_per_gpu: int = setting(integer(0, MAX_COUNT), 20)
    application_xids_window_seconds: float = setting(number(60, MAX_DELAY_S), 3600.0)


@dataclass(frozen=True)
class Expectations:
    """What the node should have: its GPU count and temperature limits."""

    # Expected GPU count: this value, else the node label, else "whatever is visible".
    expected_gpus: int | None = setting(integer(0, MAX_GPUS), None)
    expected_gpus_label: str = setting(string, "nvidia.com/gpu.count")
    # The node's labels and GPU capacity (what the agent's NVML view is held to) are
    # read again this often: they change with the device plugin and GFD, rarely.
    node_read_seconds: float = setting(number(1, 86400), 300.0)
    temperature_warning_c: int = setting(integer(0, MAX_CELSIUS), 85)
    temperature_critical_c: int = setting(integer(0, MAX_CELSIUS), 95)


@dataclass(frozen=True)
class Probes:
    """The probes and where each reads: NVML, the kernel log, nvidia-smi, the host."""

    nvml_enabled: bool = setting(boolean, True)
    nvml_timeout_seconds: float = setting(number(0.05, 600), 5.0)
    nvml_backend: str = setting(one_of("real", "fake"), "real")
    nvml_fake_spec: Path | None = setting(file_path, None)
    nvml_events: bool = setting(boolean, True)
    kmsg_enabled: bool = setting(boolean, True)
    kmsg_path: Path = setting(file_path, Path("/dev/kmsg"))
    state_path: Path = setting(file_path, Path("/var/lib/gpuheal/agent-state.json"))
    boot_id_path: Path = setting(file_path, Path("/proc/sys/kernel/random/boot_id"))
    smi_enabled: bool = setting(boolean, False)
    smi_command: tuple[str, ...] = setting(strings, ("nvidia-smi",))
    smi_timeout_seconds: float = setting(number(0.05, 600), 10.0)
    env_enabled: bool = setting(boolean, True)
    device_paths: tuple[Path, ...] = setting(
        file_paths, (Path("/dev/nvidiactl"), Path("/dev/nvidia-uvm"))
    )
    driver_version_path: Path = setting(file_path, Path("/proc/driver/nvidia/version"))
    # The start-order facts (docs/agent.md): the host's /proc is procRoot; the runtime's
    # config files are these host paths (globs) under hostRoot.
    host_root: Path = setting(file_path, Path("/"))
    runtime_config_paths: tuple[str, ...] = setting(host_globs, RUNTIME_CONFIGS)
    required_modules: tuple[str, ...] = setting(module_names, NVIDIA_MODULES)
    nvswitch_pci_ids: tuple[str, ...] = setting(pci_ids, ("10de:1af1", "10de:22a3", "10de:2901"))
    env_facts_seconds: float = setting(number(0, 86400), 30.0)


@dataclass(frozen=True)
class Degradation:
    """The degradation signals' thresholds (agent/degradation.py; docs/agent.md,
    "Degradation signals", says where each default comes from)."""

    # PCIe replays a minute above which a GPU is warned of; 0: DCGM's limit for the
    # link's generation and width (ceil(per-lane rate x lanes)).
    pcie_replays_per_minute: float = setting(number(0, 1e9), 0.0)
    # A PCIe link below the card's width (or, busy, its generation) this long.
    pcie_link_seconds: float = setting(number(0, 86400), 60.0)
    nvlink_crc_per_second: float = setting(number(0.001, 1e9), NVLINK_CRC_PER_SECOND)
    # NVLink replays and recoveries within nvlinkWindowSeconds that are a fault; 0: off.
    nvlink_replay_errors: int = setting(integer(0, 1_000_000), NVLINK_ERRORS)
    nvlink_recovery_errors: int = setting(integer(0, 1_000_000), NVLINK_ERRORS)
    nvlink_window_seconds: float = setting(number(60, 86400), NVLINK_WINDOW_SECONDS)
    # A hardware clock slowdown held this share of this window is a fault.
    slowdown_window_seconds: float = setting(number(60, 86400), 600.0)
    slowdown_share: float = setting(number(0.01, 1), 0.6)
    # How long a GPU may wait for its NVSwitch fabric registration (after boot).
    fabric_grace_seconds: float = setting(number(0, 86400), 300.0)
    power_over_limit_ratio: float = setting(number(1, 10), 1.1)
    expect_persistence_mode: bool = setting(boolean, True)
    # An NVML call hung this long: the driver is unresponsive, a fault. 0: never.
    driver_hang_seconds: float = setting(number(0, 86400), 60.0)

    def limits(self) -> Limits:
        """The judge's limits: each of Limits' fields is the key of the same name."""
        return Limits(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Limits)})


def link_layers(value: Any) -> tuple[str, ...]:
    return _strings_that(
        value, lambda v: v in ("InfiniBand", "Ethernet"), "must be InfiniBand or Ethernet (RoCE)"
    )


@dataclass(frozen=True)
class Network:
    """The node's InfiniBand and RoCE ports (agent/infiniband.py; docs/agent.md, "The
    node's network")."""

    ib_enabled: bool = setting(boolean, True)
    ib_sysfs_path: Path = setting(file_path, Path("/sys/class/infiniband"))
    ib_link_layers: tuple[str, ...] = setting(link_layers, ("InfiniBand",))
    # What the node should have (0: not judged): HCAs, ports up, each port's rate.
    ib_expected_hcas: int = setting(integer(0, MAX_GPUS), 0)
    ib_expected_ports: int = setting(integer(0, MAX_GPUS), 0)
    ib_expected_rate_gbps: float = setting(number(0, 100_000), 0.0)
    ib_port_down_seconds: float = setting(number(0, 86400), 240.0)
    ib_flaps: int = setting(integer(0, MAX_COUNT), 3)
    ib_flap_window_seconds: float = setting(number(60, 7 * 86400), 3600.0)

    def ib_expectations(self) -> IbExpectations:
        return IbExpectations(
            link_layers=self.ib_link_layers,
            hcas=self.ib_expected_hcas,
            ports=self.ib_expected_ports,
            rate_gbps=self.ib_expected_rate_gbps,
            port_down_seconds=self.ib_port_down_seconds,
            flaps=self.ib_flaps,
            flap_window_seconds=self.ib_flap_window_seconds,
        )


@dataclass(frozen=True)
class Reporting:
    """What the agent publishes besides its verdict: GPU processes, metrics."""

    # Where the host's /proc is seen (/proc with hostPID; else the host's /proc mounted):
    # a GPU process's /proc/<pid>/cgroup names its pod.
    proc_root: Path = setting(file_path, Path("/proc"))
    # GPU compute processes are listed at most this often (they change often); 0: never.
    process_report_seconds: float = setting(number(0, 86400), 60.0)
    # At most this many processes in the annotation; the rest are left out (and logged).
    process_report_max: int = setting(integer(1, 10_000), 64)
    metrics_port: int = setting(integer(0, 65535), 9101)


def label_keys(value: Any) -> tuple[str, ...]:
    keys = strings(value)
    bad = [k for k in keys if not is_label_key(k)]
    if bad:
        raise ValueError(f"not label keys: {', '.join(map(repr, bad))}")
    return keys


def pod_selectors(value: Any) -> tuple[dict[str, str], ...]:
    """Equality label selectors, one map each: [{app: nvidia-device-plugin-daemonset}]."""
    if not isinstance(value, list):
        raise ValueError(f"must be a list of label maps, got {value!r}")
    found = []
    for item in value:
        if not isinstance(item, dict) or not item:
            raise ValueError(f"each selector must be a non-empty map of labels, got {item!r}")
        for k, v in item.items():
            if not (isinstance(k, str) and isinstance(v, str)) or not (
                is_label_key(k) and is_label_value(v)
            ):
                raise ValueError(f"not a label and value: {k!r}: {v!r}")
        found.append(dict(item))
    return tuple(found)


def namespace_name(value: Any) -> str:
    name = string(value)
    if len(name) > 63 or not is_subdomain(name) or "." in name:
        raise ValueError(f"not a namespace name: {name!r}")
    return name


@dataclass(frozen=True)
class Repairs:
    """Repairs the controller may request on this node (docs/agent.md, "Repairs").
    Off by default: the agent then never reads a request."""

    repair_enabled: bool = setting(boolean, False)
    # How often a faulty node's agent looks for a request on its Node.
    repair_poll_seconds: float = setting(number(0.05, 3600), 10.0)
    # The reset: `<command> -r -i <GPU UUID>` (pynvml has no reset call).
    repair_reset_command: tuple[str, ...] = setting(strings, ("nvidia-smi",))
    repair_reset_timeout_seconds: float = setting(number(1, 3600), 120.0)
    # The GPU's daemons, stopped before the reset and back after (policy/daemons.py):
    # the GPU Operator's deploy labels paused on this node, the pods (in one
    # namespace, on this node) that must be gone first, the pods deleted after the
    # reset (a device plugin not under the operator), and the bound on each wait.
    repair_daemon_namespace: str = setting(namespace_name, "")
    repair_pause_labels: tuple[str, ...] = setting(label_keys, ())
    repair_daemon_pods: tuple[dict[str, str], ...] = setting(pod_selectors, ())
    repair_restart_pods: tuple[dict[str, str], ...] = setting(pod_selectors, ())
    repair_daemon_timeout_seconds: float = setting(number(1, 3600), 300.0)
    # The reboot: none (refused), a sentinel file a reboot daemon such as kured acts
    # on, or a command (run in the host's namespaces by the chart's hostPID pod).
    repair_reboot_method: str = setting(one_of("none", "sentinel", "command"), "none")
    repair_reboot_sentinel: Path = setting(file_path, Path("/var/run/reboot-required"))
    repair_reboot_command: tuple[str, ...] = setting(strings, ())


@dataclass(frozen=True)
class AgentConfig(Rounds, Expectations, Probes, Degradation, Network, Reporting, Repairs):
    """The whole document: every key is at the top level."""


SCHEMA = schema_of(AgentConfig)


def parse_agent_config(raw: Any) -> AgentConfig:
    return parse_document(AgentConfig, raw, TITLE, _cross_checks)


def _cross_checks(config: AgentConfig) -> list[str]:
    problems = []
    if config.nvml_backend == "fake" and config.nvml_fake_spec is None:
        problems.append("nvmlFakeSpec: required when nvmlBackend is fake")
    if config.temperature_critical_c < config.temperature_warning_c:
        problems.append("temperatureCriticalC: must be >= temperatureWarningC")
    if (config.repair_daemon_pods or config.repair_restart_pods) and not (
        config.repair_daemon_namespace
    ):
        problems.append(
            "repairDaemonNamespace: required with repairDaemonPods or repairRestartPods"
        )
    if config.repair_reboot_method == "command" and not config.repair_reboot_command:
        problems.append("repairRebootCommand: required when repairRebootMethod is command")
    return problems


def load_agent_config(path: Path | None) -> AgentConfig:
    return AgentConfig() if path is None else parse_agent_config(load_yaml(path))
