"""GPU hosts as the agent's environment probe sees them: the host's /proc (modules,
processes, the PCI bus) and the container runtime's config files, written under a
temporary directory in the shapes real hosts have."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuheal.agent.config import NVIDIA_MODULES, RUNTIME_CONFIGS, AgentConfig
from gpuheal.agent.environment import HostPaths

# /proc/modules of a DGX H100 (driver 550, GPUDirect RDMA): name size refs deps state addr.
DGX_MODULES = """\
nvidia_uvm 4911104 4 - Live 0x0000000000000000 (POE)
nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)
nvidia_modeset 1343488 0 - Live 0x0000000000000000 (POE)
nvidia 54317056 276 nvidia_uvm,nvidia_peermem,nvidia_modeset, Live 0x0000000000000000 (POE)
ib_core 430080 9 nvidia_peermem,rdma_cm,ib_ipoib,ib_uverbs,mlx5_ib, Live 0x0000000000000000
drm 622592 4 drm_kms_helper,nvidia,ast,drm_vram_helper, Live 0x0000000000000000
"""
# A host whose driver failed to load after a reboot (the module build did not match).
NO_DRIVER_MODULES = """\
ib_core 430080 9 rdma_cm,iw_cm,ib_ipoib,ib_cm,ib_uverbs,mlx5_ib, Live 0x0000000000000000
drm 622592 4 drm_kms_helper,ast,drm_vram_helper, Live 0x0000000000000000
"""

H100_SXM = "10de2330"
L40S = "10de26b9"
NVSWITCH_H100 = "10de22a3"
INTEL_ROOT_PORT = "80861bbe"

# The GPU Operator's toolkit writes containerd's config (its binaries under
# /usr/local/nvidia/toolkit); nvidia-ctk writes a drop-in that config.toml imports.
CONTAINERD_GPU_OPERATOR = """\
version = 2
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "nvidia"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          privileged_without_host_devices = false
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
"""
CONTAINERD_IMPORTS = """\
version = 2
imports = ["/etc/containerd/conf.d/*.toml"]
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
"""
CONTAINERD_DROP_IN = """\
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
"""
# A stock containerd: the NVIDIA runtime only in a comment someone left.
CONTAINERD_STOCK = """\
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  # BinaryName = "/usr/bin/nvidia-container-runtime"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"""
CRIO_DROP_IN = """\
[crio]
  [crio.runtime]
    default_runtime = "nvidia"
    [crio.runtime.runtimes]
      [crio.runtime.runtimes.nvidia]
        runtime_path = "/usr/bin/nvidia-container-runtime"
        runtime_type = "oci"
"""


@dataclass(frozen=True)
class HostTree:
    root: Path

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def host(self) -> Path:
        return self.root / "host"

    def write(self, path: str, text: str) -> Path:
        """A host file (/etc/..., or /proc/... for the host's /proc)."""
        base = self.proc if path.startswith("/proc/") else self.host
        target = base / path.removeprefix("/proc/").lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return target

    def processes(self, comms: dict[int, str]) -> None:
        for pid, comm in comms.items():
            self.write(f"/proc/{pid}/comm", f"{comm}\n")

    def stop(self, comm: str) -> None:
        """The process whose comm this is exits: its /proc entry goes."""
        for entry in self.proc.iterdir():
            path = entry / "comm"
            if entry.name.isdigit() and path.exists() and path.read_text().strip() == comm:
                path.unlink()
                entry.rmdir()

    def pci(self, devices: dict[int, str]) -> None:
        """/proc/bus/pci/devices: bus and devfn, vendor and device, irq, bases..."""
        lines = [f"{bus:02x}00\t{ids}\t0\t\tc4000000\t0\t0\t0" for bus, ids in devices.items()]
        self.write("/proc/bus/pci/devices", "\n".join(lines) + "\n")

    def paths(self) -> HostPaths:
        return HostPaths(self.proc, self.host, RUNTIME_CONFIGS, NVIDIA_MODULES, DEFAULTS)

    def agent_config(self) -> dict[str, Any]:
        """The agent's settings that point its environment probe here."""
        return {
            "envEnabled": True,
            "procRoot": str(self.proc),
            "hostRoot": str(self.host),
            "envFactsSeconds": 0,
            "devicePaths": [],
            "driverVersionPath": str(self.proc / "driver" / "nvidia" / "version"),
        }


DEFAULTS = AgentConfig().nvswitch_pci_ids

# Host processes every node has, PID 2 included (it proves the host's /proc).
_BASE = {1: "systemd", 2: "kthreadd", 812: "containerd", 1290: "kubelet"}
DRIVER_VERSION = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
)


def dgx_h100(root: Path) -> HostTree:
    """8 H100 SXM on 4 NVSwitches, GPU Operator toolkit, persistenced and Fabric Manager."""
    tree = HostTree(root)
    tree.write("/proc/modules", DGX_MODULES)
    tree.write("/proc/driver/nvidia/version", DRIVER_VERSION)
    tree.processes({**_BASE, 2301: "nvidia-persiste", 2317: "nv-fabricmanage"})
    gpus = {0x18 + i * 0x10: H100_SXM for i in range(8)}
    tree.pci({0x00: INTEL_ROOT_PORT, **gpus, **{0x05 + i: NVSWITCH_H100 for i in range(4)}})
    for i in range(4):
        tree.write(f"/proc/driver/nvidia-nvswitch/devices/0000:{0x05 + i:02x}:00.0", "")
    tree.write("/etc/containerd/config.toml", CONTAINERD_GPU_OPERATOR)
    return tree


def pcie_l40s(root: Path) -> HostTree:
    """4 L40S on PCIe (no NVSwitch, no Fabric Manager), nvidia-ctk's containerd drop-in."""
    tree = HostTree(root)
    tree.write("/proc/modules", DGX_MODULES)
    tree.write("/proc/driver/nvidia/version", DRIVER_VERSION)
    tree.processes({**_BASE, 2301: "nvidia-persiste"})
    tree.pci({0x00: INTEL_ROOT_PORT, **{0x41 + i: L40S for i in range(4)}})
    tree.write("/etc/containerd/config.toml", CONTAINERD_IMPORTS)
    tree.write("/etc/containerd/conf.d/99-nvidia.toml", CONTAINERD_DROP_IN)
    return tree
