"""Environment checks from the onboarding runbooks: warnings, never faults.

Besides the device nodes and the driver version, the probe finds the start-order
facts the runbooks check after a reboot, for the health gate (policy/environment.py
holds their format): the driver's kernel modules loaded, the persistence daemon
running, Fabric Manager running where there are NVSwitches, and the container
runtime configured with NVIDIA's runtime. Each is read from the host's files; one
it cannot read is "unknown", never bad.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuheal.agent.findings import ProbeResult
from gpuheal.policy.environment import (
    FABRIC_MANAGER,
    MISSING,
    MODULES,
    NOT_NEEDED,
    OK,
    PERSISTENCED,
    RUNTIME_HOOK,
    STOPPED,
    UNKNOWN,
    Fact,
    describe,
    encode,
)

log = logging.getLogger(__name__)

PROBE = "env"

# /proc/<pid>/comm holds at most 15 characters (TASK_COMM_LEN): "nv-fabricmanage".
_COMM_LEN = 15
PERSISTENCED_PROCESS = "nvidia-persistenced"
FABRIC_MANAGER_PROCESS = "nv-fabricmanager"
# PID 2 is the kernel's thread creator; kernel threads are seen only in the host's
# PID namespace, so it tells the host's /proc from a container's own.
_HOST_PID_2 = "kthreadd"
# A runtime config naming one of these routes containers through NVIDIA's runtime
# (containerd's BinaryName, CRI-O's runtime_path, Docker's runtimes) or its OCI hook.
RUNTIME_NEEDLES = ("nvidia-container-runtime", "nvidia-container-toolkit")
_MAX_CONFIG_BYTES = 1 << 20


_DRIVER_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(?P<version>\d+\.\d+(?:\.\d+)?)")


def read_driver_version(path: Path) -> str:
    """The driver's version from /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX
    x86_64 Kernel Module  575.57.08  …"), "" when unreadable."""
    try:
        match = _DRIVER_VERSION.search(path.read_text(errors="replace"))
    except OSError:
        return ""
    return match.group("version") if match else ""


def check_environment(device_paths: Sequence[Path], driver_version_path: Path) -> ProbeResult:
    warnings = [f"{path} is missing" for path in device_paths if not path.exists()]
    try:
        if not driver_version_path.read_text().strip():
            warnings.append(f"{driver_version_path} is empty: driver version unreadable")
    except OSError as err:
        warnings.append(f"driver version unreadable at {driver_version_path}: {err.strerror}")
    return ProbeResult(PROBE, ran=True, warnings=tuple(warnings))


@dataclass(frozen=True)
class HostPaths:
    """Where the host is seen: its /proc, and its root for the runtime's config files."""

    proc_root: Path
    host_root: Path
    runtime_configs: tuple[str, ...]  # host paths, globs allowed: /etc/containerd/conf.d/*.toml
    modules: tuple[str, ...]  # the kernel modules that must be loaded
    nvswitch_pci_ids: tuple[str, ...]  # "10de:22a3": an NVSwitch on the PCI bus


def loaded_modules(proc_root: Path) -> set[str] | None:
    """The live modules of <proc>/modules ("name size refs deps state addr"); None: unreadable."""
    try:
        text = (proc_root / "modules").read_text(errors="replace")
    except OSError:
        return None
    loaded = set()
    for line in text.splitlines():
        fields = line.split()
        if fields and (len(fields) < 5 or fields[4] == "Live"):
            loaded.add(fields[0])
    return loaded


def host_processes(proc_root: Path) -> set[str] | None:
    """The command names of the host's processes; None when `proc_root` is not the
    host's /proc (a container's own shows none of the host's daemons) or unreadable."""
    try:
        if (proc_root / "2" / "comm").read_text(errors="replace").strip() != _HOST_PID_2:
            return None
        entries = [e.name for e in os.scandir(proc_root) if e.name.isdigit()]
    except OSError:
        return None
    names = set()
    for pid in entries:
        try:
            names.add((proc_root / pid / "comm").read_text(errors="replace").strip())
        except OSError:
            continue  # exited meanwhile
    return names


def nvswitch_present(proc_root: Path, pci_ids: Sequence[str]) -> bool | None:
    """NVSwitches on the PCI bus (<proc>/bus/pci/devices: "bus+devfn vendor+device ...")
    or known to the nvswitch driver; None: neither readable."""
    wanted = {i.replace(":", "").lower() for i in pci_ids}
    driver = proc_root / "driver" / "nvidia-nvswitch" / "devices"
    try:
        if any(driver.iterdir()):
            return True
    except OSError:
        pass
    try:
        text = (proc_root / "bus" / "pci" / "devices").read_text(errors="replace")
    except OSError:
        return None
    return any(len(f) > 1 and f[1].lower() in wanted for f in map(str.split, text.splitlines()))


def _names_nvidia_runtime(path: Path) -> bool | None:
    """Does the file (comment lines aside) name NVIDIA's runtime? None: unreadable."""
    try:
        with path.open("rb") as file:
            text = file.read(_MAX_CONFIG_BYTES).decode(errors="replace")
    except OSError:
        return None
    lines = (line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return any(needle in line for line in lines for needle in RUNTIME_NEEDLES)


def runtime_hook(host_root: Path, configs: Sequence[str]) -> Fact:
    read = False
    for pattern in configs:
        try:
            paths = sorted(host_root.glob(pattern.lstrip("/")))
        except (OSError, ValueError):
            continue  # a directory on the way that cannot be listed: nothing seen there
        for path in paths:
            named = _names_nvidia_runtime(path) if path.is_file() else None
            if named:
                return Fact(OK)
            read = read or named is not None
    return Fact(MISSING if read else UNKNOWN)


def probe_environment(host: HostPaths) -> dict[str, Fact]:
    facts: dict[str, Fact] = {}
    loaded = loaded_modules(host.proc_root)
    if loaded is None:
        facts[MODULES] = Fact(UNKNOWN)
    else:
        absent = tuple(m for m in host.modules if m not in loaded)
        facts[MODULES] = Fact(MISSING, absent) if absent else Fact(OK)
    processes = host_processes(host.proc_root)

    def running(name: str) -> bool | None:
        return None if processes is None else name[:_COMM_LEN] in processes

    persistenced = running(PERSISTENCED_PROCESS)
    facts[PERSISTENCED] = Fact(UNKNOWN if persistenced is None else OK if persistenced else STOPPED)
    switches = nvswitch_present(host.proc_root, host.nvswitch_pci_ids)
    fabric_manager = running(FABRIC_MANAGER_PROCESS)
    if fabric_manager:
        facts[FABRIC_MANAGER] = Fact(OK)
    elif switches is False:
        facts[FABRIC_MANAGER] = Fact(NOT_NEEDED)
    elif switches is None or fabric_manager is None:
        facts[FABRIC_MANAGER] = Fact(UNKNOWN)  # NVSwitches, but the processes unseen
    else:
        facts[FABRIC_MANAGER] = Fact(STOPPED)
    facts[RUNTIME_HOOK] = runtime_hook(host.host_root, host.runtime_configs)
    return facts


class EnvironmentProbe:
    """The environment probe of each round; the start-order facts are looked at
    again every `every_s` (0: each round), and `value` is their annotation."""

    def __init__(
        self,
        device_paths: Sequence[Path],
        driver_version_path: Path,
        host: HostPaths,
        every_s: float,
        *,
        node: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.device_paths = tuple(device_paths)
        self.driver_version_path = driver_version_path
        self.host = host
        self.every_s = every_s
        self.node = node
        self.clock = clock
        self.value: str | None = None
        self._problems: tuple[str, ...] = ()
        self._at: float | None = None

    def run(self) -> ProbeResult:
        result = check_environment(self.device_paths, self.driver_version_path)
        now = self.clock()
        if self._at is None or now - self._at >= self.every_s:
            self._at = now
            try:
                self._look()
            except Exception as err:  # a host file in a shape nobody foresaw: no crash
                log.warning(
                    "node environment unreadable",
                    extra={"node": self.node, "error": str(err)[:300]},
                )
                return ProbeResult(PROBE, ran=False, warnings=result.warnings, error=str(err)[:300])
        return ProbeResult(PROBE, ran=True, warnings=result.warnings + self._problems)

    def _look(self) -> None:
        facts = probe_environment(self.host)
        value = encode(facts)
        if value == self.value:
            return
        self._problems = tuple(describe(n, f) for n, f in facts.items() if f.bad)
        for problem in self._problems:
            log.warning("node environment", extra={"node": self.node, "problem": problem})
        log.info("node environment", extra={"node": self.node, "environment": value})
        self.value = value
