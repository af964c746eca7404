"""Run `gpuheal agent` as a real child process for one fake GPU node, with a
fake NVML spec and a kernel log file that tests (and the demo) can write to.

The agent runs its production NVML path (`nvmlBackend: real`, pynvml) over the NVML
stand-in built by `make nvml` (testenv/nvml: libnvidia-ml.so.1 found through
LD_LIBRARY_PATH, reading the spec named by $GPUHEAL_FAKE_NVML_SPEC), and resets GPUs
through the stand-in's nvidia-smi."""

from __future__ import annotations

import hashlib
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gpuheal import values
from gpuheal.sim.binaries import default_nvml
from gpuheal.sim.ibsysfs import IbSysfs
from gpuheal.sim.process import Component, http_ok, stop_all

_PORT = re.compile(r'"metrics_port": (\d+)')


def gpu_spec(node: str, gpus: int = 8) -> dict[str, Any]:
    """A healthy 8-GPU H100 node as the NVML stand-in's spec describes it."""
    serial = hashlib.sha256(node.encode()).hexdigest()[:8]
    return {
        "driverVersion": "550.54.15",
        "devices": [
            {
                "uuid": f"GPU-{serial}-0000-4000-8000-{i:012d}",
                "pciBusId": f"00000000:{0x18 + i:02X}:00.0",
                "temperature": 41,
                "eccUncorrectedVolatile": 0,
                "remappedRows": {"pending": False, "failure": False},
                "nvlinks": 18,
            }
            for i in range(gpus)
        ],
    }


class AgentProcess:
    def __init__(
        self,
        workdir: Path,
        kubeconfig: Path,
        node: str,
        config: dict[str, Any] | None = None,
        *,
        gpus: int = 8,
        nvml_lib_dir: Path | None = None,
        wrap: list[str] | None = None,
    ) -> None:
        """`nvml_lib_dir` replaces the stand-in library's directory on the agent's
        LD_LIBRARY_PATH (a directory without libnvidia-ml.so.1: a node without NVML);
        `wrap`: a prefix its command runs under (sim/hostsystemd.py's jail)."""
        # Fails here, with what to build, when `make nvml` has not run.
        self.nvml = default_nvml().require()
        self.node = node
        self.dir = self.dir_for(workdir, node)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.spec_path = self.dir / "nvml-spec.yaml"
        self.kmsg_path = self.dir / "kmsg"
        self.boot_id_path = self.dir / "boot_id"
        # The node's /var/run: a tmpfs a reboot empties (the reboot sentinel lives there).
        self.run_dir = self.dir / "run"
        self.reboot_sentinel = self.run_dir / "reboot-required"
        # The node's /sys/class/infiniband: none until a test adds HCAs (sim/ibsysfs.py).
        self.infiniband = IbSysfs(self.dir / "sys" / "class" / "infiniband")
        self.spec = gpu_spec(node, gpus)
        self.write_spec()
        self.kmsg_path.touch()
        if not self.boot_id_path.exists():  # a restarted agent keeps its node's boot
            self.boot_id_path.write_text("boot-1\n")
        self._seq = 1000
        settings = {
            "intervalSeconds": 0.2,
            "nvmlBackend": "real",
            "repairResetCommand": [str(self.nvml.smi)],
            "smiCommand": [str(self.nvml.smi)],
            "kmsgPath": str(self.kmsg_path),
            "statePath": str(self.dir / "state" / "agent-state.json"),
            "bootIdPath": str(self.boot_id_path),
            "envEnabled": False,
            "metricsPort": 0,
            "repairRebootSentinel": str(self.reboot_sentinel),
            "ibSysfsPath": str(self.infiniband.root),
            **(config or {}),
        }
        self.config_path = self.dir / "agent.yaml"
        self.config_path.write_text(yaml.safe_dump(settings))
        argv = [
            sys.executable, "-m", "gpuheal.cli", "--log-level", "INFO", "agent",
            "--node", node, "--config", str(self.config_path), "--kubeconfig", str(kubeconfig),
        ]  # fmt: skip
        self.log_path = self.dir / "agent.log"
        self.component = Component(
            f"agent-{values.label_value(node)}",
            [*(wrap or []), *argv],
            self.log_path,
            env=self.nvml.environment(self.spec_path, nvml_lib_dir),
        )
        self.port = 0

    @staticmethod
    def dir_for(workdir: Path, node: str) -> Path:
        """The node's directory under `workdir` (a test may fill it before the start)."""
        # A file name is at most 255 bytes; a node name, 253 characters.
        return workdir / f"agent-{values.label_value(node)}"

    def write_spec(self) -> None:
        tmp = self.spec_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(self.spec))
        tmp.replace(self.spec_path)

    def set_device(self, index: int, **changes: Any) -> None:
        self.spec["devices"][index].update(changes)
        self.write_spec()

    def set_spec(self, **changes: Any) -> None:
        self.spec.update(changes)
        self.write_spec()

    def kernel(self, message: str, priority: int = 3) -> None:
        """Append one kernel log record, as /dev/kmsg would hand it out."""
        self._seq += 1
        with self.kmsg_path.open("a") as log:
            log.write(f"{priority},{self._seq},{self._seq * 1000},-;{message}\n")

    def reboot(self, *, run_is_tmpfs: bool = True) -> None:
        """What a node reboot looks like to the next agent: a new boot id, a fresh
        kernel log, and (`run_is_tmpfs`) an empty /var/run. Without it the reboot
        sentinel outlives the reboot, as on a path no reboot empties: the next agent
        must remove its own. Call while the agent is stopped."""
        boot = self.boot_id_path.read_text().strip()
        self.boot_id_path.write_text(f"{boot}+\n")
        self.kmsg_path.write_text("")
        if run_is_tmpfs:
            self.reboot_sentinel.unlink(missing_ok=True)

    def resets(self) -> list[tuple[str, str]]:
        """Every GPU reset the stand-in nvidia-smi was asked for: (uuid, outcome)."""
        path = self.spec_path.with_name(self.spec_path.name + ".resets")
        lines = path.read_text().splitlines() if path.exists() else []
        return [(u, r) for u, _, r in (line.partition(" ") for line in lines) if u]

    def start(self, timeout_s: float = 30) -> AgentProcess:
        self.component.start()
        return self.start_wait(timeout_s)

    def start_wait(self, timeout_s: float = 30) -> AgentProcess:
        """Wait until a started agent serves /metrics (start many, then wait for each)."""
        self.component.wait_ready(self._ready, time.monotonic() + timeout_s)
        return self

    def _ready(self) -> bool:
        ports = _PORT.findall(self.log())  # the last start's port (the log is appended)
        if ports:
            self.port = int(ports[-1])
        return bool(self.port) and http_ok(f"http://127.0.0.1:{self.port}/metrics")

    def metric(self, name: str) -> float:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self) -> None:
        stop_all([self.component], 10)

    def kill(self) -> None:
        self.component.signal(signal.SIGKILL)
        self.component.wait_stopped(10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
