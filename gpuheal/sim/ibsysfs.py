"""A /sys/class/infiniband tree shaped like the kernel's, for nodes without an HCA.

The files and their formats are the RDMA core's (drivers/infiniband/core/sysfs.c;
Documentation/ABI/stable/sysfs-class-infiniband): `state` "4: ACTIVE", `phys_state`
"5: LinkUp", `rate` "400 Gb/sec (4X NDR)", `link_layer`, and the port's PMA counters
under `counters/`, one decimal number each. A test changes a port by rewriting its
files, as the kernel's values change under the agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The port counters the kernel publishes (the PMA attributes), all written.
COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "port_xmit_wait",
)
STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
# Per-lane speed of each generation in Gb/s, as the kernel names it in `rate`.
SPEEDS = {"HDR": 50, "NDR": 100, "XDR": 200}


@dataclass
class IbSysfs:
    """A node's HCAs under `root` (what the agent's `ibSysfsPath` points at)."""

    root: Path

    def port_dir(self, hca: str, port: int = 1) -> Path:
        return self.root / hca / "ports" / str(port)

    def add_port(
        self,
        hca: str,
        port: int = 1,
        *,
        link_layer: str = "InfiniBand",
        speed: str = "NDR",
        lanes: int = 4,
    ) -> None:
        where = self.port_dir(hca, port)
        (where / "counters").mkdir(parents=True, exist_ok=True)
        for name in COUNTERS:
            (where / "counters" / name).write_text("0\n")
        (where / "link_layer").write_text(f"{link_layer}\n")
        self.set_rate(hca, port, speed=speed, lanes=lanes)
        self.set_state(hca, port, state=4, phys_state=5)
        (self.root / hca / "fw_ver").write_text("28.39.1002\n")
        (self.root / hca / "node_type").write_text("1: CA\n")

    def set_state(self, hca: str, port: int = 1, *, state: int, phys_state: int) -> None:
        where = self.port_dir(hca, port)
        (where / "state").write_text(f"{state}: {STATES[state]}\n")
        (where / "phys_state").write_text(f"{phys_state}: {PHYS_STATES[phys_state]}\n")

    def set_rate(self, hca: str, port: int = 1, *, speed: str = "NDR", lanes: int = 4) -> None:
        rate = SPEEDS[speed] * lanes
        (self.port_dir(hca, port) / "rate").write_text(f"{rate} Gb/sec ({lanes}X {speed})\n")

    def set_counter(self, hca: str, port: int, name: str, value: int) -> None:
        (self.port_dir(hca, port) / "counters" / name).write_text(f"{value}\n")

    def counter(self, hca: str, port: int, name: str) -> int:
        return int((self.port_dir(hca, port) / "counters" / name).read_text())

    def remove(self, hca: str) -> None:
        """An HCA gone from the bus: its directory goes with it."""
        for path in sorted((self.root / hca).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        (self.root / hca).rmdir()


def hgx_node(root: Path, hcas: int = 8) -> IbSysfs:
    """An HGX H100 node's compute fabric: one ConnectX-7 per GPU, 400 Gb/s NDR each
    (mlx5_0..mlx5_7), and the front-end NIC's RoCE port (mlx5_8, 200 Gb/s Ethernet)."""
    tree = IbSysfs(root)
    for index in range(hcas):
        tree.add_port(f"mlx5_{index}")
    tree.add_port(f"mlx5_{hcas}", link_layer="Ethernet", speed="HDR")
    return tree
