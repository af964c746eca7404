"""The node's InfiniBand and RoCE ports (agent/infiniband.py), read from a sysfs tree
shaped like the kernel's (gpuheal/sim/ibsysfs.py): what must be found, and what must
not (one flap, an unused port never up, a port retraining for a minute)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuheal.agent.findings import ProbeFinding
from gpuheal.agent.infiniband import Expectations, IbProbe, read_ports
from gpuheal.model import Severity
from gpuheal.sim.ibsysfs import IbSysfs, hgx_node

ROUND_S = 10.0
RAILS = Expectations(hcas=8, ports=8, rate_gbps=400)


class Rounds:
    """The probe over a tree, one round every ROUND_S seconds."""

    def __init__(self, tree: IbSysfs, expect: Expectations = RAILS) -> None:
        self.now = 0.0
        self.probe = IbProbe(tree.root, expect, clock=lambda: self.now)

    def run(self, n: int = 1) -> list[ProbeFinding]:
        found: list[ProbeFinding] = []
        for _ in range(n):
            result = self.probe.run()
            assert result.ran, result.error
            found = list(result.findings)
            self.now += ROUND_S
        return found


def reasons(found: list[ProbeFinding], severity: Severity | None = None) -> set[str]:
    return {f.reason for f in found if severity is None or f.severity is severity}


@pytest.fixture
def tree(tmp_path: Path) -> IbSysfs:
    return hgx_node(tmp_path / "sys" / "class" / "infiniband")


def test_the_kernel_s_formats_are_read(tree: IbSysfs) -> None:
    tree.set_counter("mlx5_3", 1, "link_downed", 7)
    ports = {p.name: p for p in read_ports(tree.root)}
    assert len(ports) == 9
    three = ports["mlx5_3/1"]
    assert (three.state, three.phys_state, three.rate_gbps) == (4, 5, 400.0)
    assert (three.link_layer, three.link_downed, three.symbol_errors) == ("InfiniBand", 7, 0)
    assert ports["mlx5_8/1"].link_layer == "Ethernet" and ports["mlx5_8/1"].rate_gbps == 200.0
    assert three.up


def test_a_healthy_fabric_and_a_node_without_hcas_are_judged_nothing(
    tree: IbSysfs, tmp_path: Path
) -> None:
    assert Rounds(tree).run(100) == []
    assert read_ports(tmp_path / "none") == []
    assert Rounds(IbSysfs(tmp_path / "none"), Expectations()).run(10) == []


def test_a_missing_hca_or_port_against_the_expectation_is_a_fault(tree: IbSysfs) -> None:
    tree.remove("mlx5_5")
    found = Rounds(tree).run()
    assert reasons(found, Severity.P1) == {"HcaMissing", "IbPortsMissing"}
    assert "7 of 8 expected InfiniBand HCAs" in next(
        f.message for f in found if f.reason == "HcaMissing"
    )


def test_a_port_that_went_down_is_a_fault_after_gpud_s_four_minutes(tree: IbSysfs) -> None:
    rounds = Rounds(tree, Expectations())  # no count expected: only what was seen up
    rounds.run()
    tree.set_state("mlx5_2", 1, state=1, phys_state=2)  # DOWN, Polling: the cable
    assert rounds.run(int(240 / ROUND_S)) == []  # 230 s down: not yet
    found = rounds.run()
    assert reasons(found, Severity.P1) == {"IbPortDown"}
    assert found[0].devices == ("mlx5_2/1",)
    tree.set_state("mlx5_2", 1, state=4, phys_state=5)
    assert rounds.run() == []


def test_a_port_never_up_is_not_judged_without_an_expected_count(tree: IbSysfs) -> None:
    """An unused second port (no cable) is down from boot: not a fault by itself."""
    tree.add_port("mlx5_0", 2)
    tree.set_state("mlx5_0", 2, state=1, phys_state=3)  # Disabled
    assert Rounds(tree).run(100) == []


def test_one_flap_is_a_warning_three_within_the_window_a_fault(tree: IbSysfs) -> None:
    rounds = Rounds(tree)
    rounds.run()
    tree.set_counter("mlx5_1", 1, "link_downed", 1)
    found = rounds.run()
    assert reasons(found) == {"IbPortFlap"} and found[0].severity is Severity.P2
    assert rounds.run(30) and reasons(rounds.run(), Severity.P1) == set()
    tree.set_counter("mlx5_1", 1, "link_downed", 3)
    assert reasons(rounds.run(), Severity.P1) == {"IbPortFlapping"}
    # An hour later with no more: nothing left.
    assert rounds.run(int(3600 / ROUND_S) + 1) == []


def test_flaps_counted_before_the_agent_watched_are_not_new(tree: IbSysfs) -> None:
    tree.set_counter("mlx5_4", 1, "link_downed", 12)
    assert Rounds(tree).run(50) == []


def test_a_port_trained_below_the_expected_rate_is_a_fault_once_it_holds(tree: IbSysfs) -> None:
    rounds = Rounds(tree)
    tree.set_rate("mlx5_6", 1, speed="NDR", lanes=2)  # 200 Gb/s: two lanes lost
    assert rounds.run(6) == []  # a minute: a link may retrain
    found = rounds.run()
    assert reasons(found, Severity.P1) == {"IbRateDegraded"}
    assert "200 Gb/s, expected 400" in found[0].message


def test_symbol_errors_above_the_bit_error_rate_are_a_warning_only(tree: IbSysfs) -> None:
    rounds = Rounds(tree)
    rounds.run()
    tree.set_counter("mlx5_7", 1, "symbol_error", 10)  # under 24 a minute at 400 Gb/s
    assert rounds.run(6) == []
    tree.set_counter("mlx5_7", 1, "symbol_error", 10_000)
    found = rounds.run()
    assert reasons(found) == {"IbSymbolErrors"}
    assert found[0].severity is Severity.P2


def test_roce_ports_are_judged_when_asked_for(tree: IbSysfs) -> None:
    expect = Expectations(link_layers=("Ethernet",), ports=1)
    rounds = Rounds(tree, expect)
    assert rounds.run() == []
    tree.set_state("mlx5_8", 1, state=1, phys_state=2)
    assert reasons(rounds.run(), Severity.P1) == {"IbPortsMissing"}


def test_an_unreadable_file_is_not_a_port_state(tree: IbSysfs) -> None:
    (tree.port_dir("mlx5_0") / "counters" / "link_downed").write_text("garbage\n")
    (tree.port_dir("mlx5_0") / "rate").unlink()
    port = next(p for p in read_ports(tree.root) if p.name == "mlx5_0/1")
    assert port.link_downed is None and port.rate_gbps is None
    assert Rounds(tree).run(20) == []
