"""NIC lines of the kernel log (gpuheal/xid/nic.py), in the shapes the kernel prints
them (mlx5's health.c through mlx5_core_err, sch_generic.c's transmit watchdog across
kernel versions, mlx5e's TX timeout), and lines that must stay nothing."""

from __future__ import annotations

import pytest

from gpuheal.model import Severity
from gpuheal.sources.conditions import driver_lines
from gpuheal.xid.lines import parse_message
from gpuheal.xid.nic import NicEvent, parse_nic

FAULTS = [
    (
        "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised"
        " - reached miss count",
        "NicHealthCompromised",
        "0000:41:00.0",
    ),
    (
        "mlx5_core 0000:C1:00.1: poll_health:815:(pid 0): Fatal error 1 detected",
        "NicFatalError",
        "0000:c1:00.1",
    ),
    (
        "mlx5_core 0000:1a:00.0: mlx5_health_try_recover:335:(pid 1123): health recovery failed",
        "NicRecoveryFailed",
        "0000:1a:00.0",
    ),
]
WARNINGS = [
    # sch_generic.c before 6.x, in a WARN splat's first line.
    ("NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 12 timed out", "ens1f0np0"),
    # 6.x: the milliseconds added.
    ("NETDEV WATCHDOG: ib0 (mlx5_core): transmit queue 3 timed out 5376 ms", "ib0"),
    # Newest: netdev_crit's "<driver> <pci> <if>:" prefix.
    (
        "mlx5_core 0000:5c:00.0 eth2: NETDEV WATCHDOG: CPU: 17: transmit queue 5 timed out 8140 ms",
        "0000:5c:00.0",
    ),
    (
        "mlx5_core 0000:5c:00.0 eth2: TX timeout on queue: 5, SQ: 0x11e, CQ: 0x4d9, SQ Cons:"
        " 0x1f SQ Prod: 0x2a, usecs since last trans: 8140000",
        "0000:5c:00.0",
    ),
]
NOTHING = [
    "mlx5_core 0000:41:00.0: mlx5_fw_tracer_init:1034:(pid 412): FWTracer: Ownership granted",
    "mlx5_core 0000:41:00.0 ib0: Link up",
    "mlx5_core 0000:41:00.0: E-Switch: Total vports 2, per vport: max uc(128) max mc(2048)",
    "mlx5_ib: Mellanox ConnectX InfiniBand driver v5.8-1.0.1",
    "e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex",
]


@pytest.mark.parametrize(("line", "reason", "device"), FAULTS)
def test_a_nic_that_lost_its_health_is_a_node_fault(line: str, reason: str, device: str) -> None:
    event = parse_message(line)
    assert event == NicEvent(reason, Severity.P1, device, line)
    assert event.node_fault


@pytest.mark.parametrize(("line", "device"), WARNINGS)
def test_a_transmit_timeout_is_a_warning(line: str, device: str) -> None:
    event = parse_nic(line)
    assert event is not None and (event.reason, event.device) == ("NicTxTimeout", device)
    assert not event.node_fault


@pytest.mark.parametrize("line", NOTHING)
def test_a_nic_s_ordinary_lines_are_nothing(line: str) -> None:
    assert parse_message(line) is None


def test_node_problem_detector_s_copy_is_classified_alike() -> None:
    """One classification, every source: the same line in an NPD condition's message."""
    message = "\n".join([FAULTS[0][0], WARNINGS[0][0], NOTHING[0]])
    lines = driver_lines(message, {})
    assert [(d.reason, d.severity, d.devices) for d in lines] == [
        ("NicHealthCompromised", Severity.P1, ("0000:41:00.0",)),
        ("NicTxTimeout", Severity.P2, ("ens1f0np0",)),
    ]
