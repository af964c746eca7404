"""Kernel lines of the node's NICs that mean a fault: the mlx5 driver's health
reporter (ConnectX HCAs, the GPU nodes' InfiniBand and RoCE rails) and the kernel's
transmit watchdog. Pure: a line in, an event or None out, never an exception.

The formats are the kernel's:
- drivers/net/ethernet/mellanox/mlx5/core/health.c, through `mlx5_core_err`, which
  prefixes "mlx5_core <pci>: <function>:<line>:(pid <n>): ":
  "Fatal error %u detected" (the health sensor: the PCI link, the NIC disabled, a
  firmware reset request) and "device's health compromised - reached miss count" (the
  firmware's health counter stopped), after which the driver resets the device or
  gives up; "health recovery failed".
- net/sched/sch_generic.c, `dev_watchdog`: "NETDEV WATCHDOG: <if> (<driver>): transmit
  queue <n> timed out[ <ms> ms]" or, newer, "<driver> <pci> <if>: NETDEV WATCHDOG: CPU:
  <n>: transmit queue <n> timed out <ms> ms"; and mlx5e's own "TX timeout on queue: <n>,
  SQ: ...". The driver recovers the queue (a warning); a device that cannot recover
  says so in the health lines above.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuheal.model import Severity

_PCI = r"(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
_MLX5 = re.compile(rf"\bmlx5_core {_PCI}")
_WATCHDOG = re.compile(
    r"NETDEV WATCHDOG: (?:(?P<ifname>\S+) \((?P<driver>[^)]*)\)|CPU: \d+):"
    r" transmit queue \d+ timed out"
)
# (needle, reason, severity): the device's own word on its health.
_HEALTH = (
    ("device's health compromised", "NicHealthCompromised", Severity.P1),
    ("health recovery failed", "NicRecoveryFailed", Severity.P1),
)
_FATAL = re.compile(r"Fatal error (?P<sensor>\d+) detected")
TX_TIMEOUT = "NicTxTimeout"


@dataclass(frozen=True)
class NicEvent:
    reason: str
    severity: Severity
    device: str  # the NIC's PCI address, else its interface name, else ""
    text: str

    @property
    def node_fault(self) -> bool:
        return self.severity is not Severity.P2


def parse_nic(line: str) -> NicEvent | None:
    """A NIC line of the kernel log as an event; None for any other line."""
    mlx5 = _MLX5.search(line)
    pci = mlx5.group("pci").lower() if mlx5 else ""
    if mlx5:
        for needle, reason, severity in _HEALTH:
            if needle in line:
                return NicEvent(reason, severity, pci, line[:512])
        if _FATAL.search(line):
            return NicEvent("NicFatalError", Severity.P1, pci, line[:512])
        if "TX timeout on queue" in line:
            return NicEvent(TX_TIMEOUT, Severity.P2, pci, line[:512])
    if watchdog := _WATCHDOG.search(line):
        device = pci or watchdog.group("ifname") or ""
        return NicEvent(TX_TIMEOUT, Severity.P2, device, line[:512])
    return None
