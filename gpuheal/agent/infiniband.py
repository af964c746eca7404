"""The node's network for GPU work: InfiniBand and RoCE ports, read from sysfs.

A multi-node job's NCCL traffic leaves the node through its HCAs (one per GPU on an
HGX node, the "rails"); one port down, flapping or trained at a lower rate stalls or
slows every job spanning the node. The kernel's RDMA core publishes each port under
`/sys/class/infiniband/<hca>/ports/<n>/` (drivers/infiniband/core/sysfs.c;
Documentation/ABI/stable/sysfs-class-infiniband):

    state       "4: ACTIVE"        (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER)
    phys_state  "5: LinkUp"        (1 Sleep, 2 Polling, 3 Disabled, 4 ..Training, 5 LinkUp, ...)
    rate        "400 Gb/sec (4X NDR)"
    link_layer  "InfiniBand" | "Ethernet" (RoCE)
    counters/link_downed    times the link error recovery failed and the link went down
    counters/symbol_error   minor link errors on a physical lane

Reading is the probe's one I/O (`read_ports`); judging is pure (`judge`), each port
against its recent past and the expectations. docs/agent.md, "The node's network",
gives each finding's source.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuheal.agent.findings import ProbeFinding, ProbeResult
from gpuheal.agent.past import Past
from gpuheal.model import Severity

log = logging.getLogger(__name__)

PROBE = "ib"
ACTIVE = 4  # IB_PORT_ACTIVE
LINK_UP = 5  # phys_state LinkUp
_CODE = re.compile(r"\s*(\d+)\s*:")
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec")
# A symbol error rate worth a warning: the InfiniBand specification's minimum link
# quality is a bit error rate of 1e-12; above that, the lane degrades.
BIT_ERROR_RATE = 1e-12


@dataclass(frozen=True)
class Port:
    """One port as sysfs shows it; a file it could not read is None."""

    hca: str  # mlx5_0
    port: int
    state: int | None
    phys_state: int | None
    rate_gbps: float | None
    link_layer: str
    link_downed: int | None = None
    symbol_errors: int | None = None

    @property
    def name(self) -> str:
        return f"{self.hca}/{self.port}"

    @property
    def up(self) -> bool:
        return self.state == ACTIVE and self.phys_state == LINK_UP


@dataclass(frozen=True)
class Expectations:
    """What the node's owner expects (the agent's config; 0 or empty: not judged)."""

    link_layers: tuple[str, ...] = ("InfiniBand",)
    hcas: int = 0  # at least this many HCAs with a port of those link layers
    ports: int = 0  # at least this many ports up
    rate_gbps: float = 0.0  # each up port at least this fast
    port_down_seconds: float = 240.0
    flaps: int = 3
    flap_window_seconds: float = 3600.0
    rate_seconds: float = 60.0


@dataclass
class Memory:
    """The ports' recent past, and the ports ever seen up (a port never up, such as an
    unused second port, is judged only against the expected count)."""

    past: dict[str, Past] = field(default_factory=dict)
    seen_up: set[str] = field(default_factory=set)


def _code(text: str) -> int | None:
    match = _CODE.match(text)
    return int(match.group(1)) if match else None


def _rate(text: str) -> float | None:
    match = _RATE.match(text)
    return float(match.group(1)) if match else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _counter(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text is not None and text.isdigit() else None


def read_ports(root: Path) -> list[Port]:
    """Every port of every HCA under `root` (/sys/class/infiniband); [] without any."""
    ports = []
    for hca in sorted(root.iterdir()) if root.is_dir() else []:
        for port_dir in sorted((hca / "ports").glob("[0-9]*")):
            state, phys, rate = (_read(port_dir / f) for f in ("state", "phys_state", "rate"))
            ports.append(
                Port(
                    hca=hca.name,
                    port=int(port_dir.name),
                    state=_code(state) if state is not None else None,
                    phys_state=_code(phys) if phys is not None else None,
                    rate_gbps=_rate(rate) if rate is not None else None,
                    link_layer=_read(port_dir / "link_layer") or "",
                    link_downed=_counter(port_dir / "counters" / "link_downed"),
                    symbol_errors=_counter(port_dir / "counters" / "symbol_error"),
                )
            )
    return ports


def judge(
    ports: Sequence[Port], memory: Memory, now: float, expect: Expectations
) -> list[ProbeFinding]:
    """The findings of one round over the ports of the expected link layers."""
    mine = [p for p in ports if p.link_layer in expect.link_layers]
    layers = "/".join(expect.link_layers)
    found: list[ProbeFinding] = []
    hcas = sorted({p.hca for p in mine})
    if expect.hcas and len(hcas) < expect.hcas:
        what = f"{len(hcas)} of {expect.hcas} expected {layers} HCAs present ({', '.join(hcas)})"
        found.append(ProbeFinding("HcaMissing", Severity.P1, what))
    up = sum(1 for p in mine if p.up)
    if expect.ports and up < expect.ports:
        names = ", ".join(p.name for p in mine if not p.up) or "none found"
        what = f"{up} of {expect.ports} expected {layers} ports up (down: {names})"
        found.append(ProbeFinding("IbPortsMissing", Severity.P1, what))
    for port in mine:
        found += _port(port, memory, now, expect)
    for gone in memory.past.keys() - {p.name for p in mine}:
        del memory.past[gone]
    return found


def _port(port: Port, memory: Memory, now: float, expect: Expectations) -> list[ProbeFinding]:
    past = memory.past.setdefault(port.name, Past())
    if port.up:
        memory.seen_up.add(port.name)
    found = []
    down = past.held("down", not port.up and port.name in memory.seen_up, now)
    if down is not None and down >= expect.port_down_seconds:
        state = f"state {port.state}, phys_state {port.phys_state}"
        what = f"{port.name} down for {down:.0f}s ({state})"
        found.append(ProbeFinding("IbPortDown", Severity.P1, what, (port.name,)))
    if port.link_downed is not None:
        flaps, _ = past.increase("linkDowned", port.link_downed, now, expect.flap_window_seconds)
        if flaps:
            # One flap is a link that retrained; several within the window, a bad cable,
            # transceiver or switch port (GPUd: 3).
            severity = Severity.P1 if expect.flaps and flaps >= expect.flaps else Severity.P2
            reason = "IbPortFlapping" if severity is Severity.P1 else "IbPortFlap"
            window = expect.flap_window_seconds
            what = f"{port.name} went down {flaps} times within {window:g}s"
            found.append(ProbeFinding(reason, severity, what, (port.name,)))
    found += _rate_and_errors(port, past, now, expect)
    return found


def _rate_and_errors(
    port: Port, past: Past, now: float, expect: Expectations
) -> list[ProbeFinding]:
    found = []
    slow = port.up and port.rate_gbps is not None and port.rate_gbps < expect.rate_gbps
    held = past.held("slow", slow, now)
    if held is not None and held >= expect.rate_seconds:
        what = f"{port.name} at {port.rate_gbps:g} Gb/s, expected {expect.rate_gbps:g}"
        found.append(ProbeFinding("IbRateDegraded", Severity.P1, what, (port.name,)))
    if port.symbol_errors is not None and port.rate_gbps:
        grew, span = past.increase("symbolErrors", port.symbol_errors, now, 60.0)
        limit = max(1, math.ceil(BIT_ERROR_RATE * port.rate_gbps * 1e9 * 60))
        if grew * 60.0 / max(span, 60.0) > limit:
            what = f"{port.name}: {grew} symbol errors in the last minute (limit {limit})"
            found.append(ProbeFinding("IbSymbolErrors", Severity.P2, what, (port.name,)))
    return found


class IbProbe:
    """Reads the ports each round and judges them; an unreadable tree is no finding."""

    def __init__(
        self,
        root: Path,
        expect: Expectations,
        clock: Callable[[], float],
    ) -> None:
        self.root = root
        self.expect = expect
        self.clock = clock
        self.memory = Memory()
        self.ports: list[Port] = []

    def run(self) -> ProbeResult:
        try:
            self.ports = read_ports(self.root)
        except OSError as err:
            return ProbeResult(PROBE, ran=False, error=f"{self.root}: {err.strerror or err}")
        findings = judge(self.ports, self.memory, self.clock(), self.expect)
        return ProbeResult(PROBE, ran=True, findings=tuple(findings))
