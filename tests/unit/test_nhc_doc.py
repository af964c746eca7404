"""What docs/operations.md tells Node Healthcheck and MachineHealthCheck users about
the GPUHealthy condition is what the agent writes: False only for a node fault,
Unknown when it could not look (never a remediation), True otherwise; and the
example NodeHealthCheck remediates on exactly that."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpuheal.agent.debounce import Report
from gpuheal.agent.findings import (
    Health,
    ProbeFinding,
    ProbeResult,
    Verdict,
    verdict,
)
from gpuheal.agent.reporter import desired
from gpuheal.model import GPU_HEALTHY_CONDITION, Severity

DOC = Path(__file__).parents[2] / "docs" / "operations.md"


def section() -> str:
    text = DOC.read_text()
    start = text.index("## Node Healthcheck and MachineHealthCheck")
    return text[start : text.index("\n## ", start + 1)]


def test_the_table_names_exactly_the_statuses_the_agent_writes() -> None:
    rows = re.findall(r"^\| `(\w+)` \|", section(), re.M)
    assert rows == [Health.FAULTY.value, Health.HEALTHY.value, Health.UNKNOWN.value]


def test_false_is_a_node_fault_and_nothing_less() -> None:
    fault = ProbeFinding("XidCritical79", Severity.P0, "GPU has fallen off the bus")
    warning = ProbeFinding("RemappedRowsPast", Severity.P2, "rows remapped before")
    assert verdict([ProbeResult("kmsg", True, findings=(fault,))]).health is Health.FAULTY
    nvml = ProbeResult("nvml", True, level=True, findings=(warning,))
    assert verdict([nvml]).health is Health.HEALTHY  # a P2 finding is a warning
    report = Report("f-1", "2026-12-03T10:00:00Z", "XidCritical79", "lost", ("GPU-1",))
    assert desired(report, Verdict(Health.FAULTY)).status.value == "False"


def test_unknown_is_the_agent_not_looking() -> None:
    failed = ProbeResult("nvml", False, level=True, error="NVML Shared Library Not Found")
    seen = verdict([failed])
    assert seen.health is Health.UNKNOWN
    assert desired(None, seen).status.value == "Unknown"


def test_the_example_remediates_on_false_only_after_the_drain_had_time() -> None:
    (block,) = re.findall(r"```yaml\n(.*?)```", section(), re.S)
    nhc = yaml.safe_load(block)
    assert nhc["kind"] == "NodeHealthCheck"
    rules = [r for r in nhc["spec"]["unhealthyConditions"] if r["type"] == GPU_HEALTHY_CONDITION]
    assert [r["status"] for r in rules] == ["False"]  # never Unknown
    (rule,) = rules
    ready = [r for r in nhc["spec"]["unhealthyConditions"] if r["type"] == "Ready"]
    # Longer than the node's own NotReady rule: the drain goes first.
    assert int(rule["duration"].rstrip("s")) > max(int(r["duration"].rstrip("s")) for r in ready)
