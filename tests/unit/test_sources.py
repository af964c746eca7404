"""Fault sources behind one protocol: the registration list drives the policy, every
source says in records what docs/api.md says it does, one codec for the
node-annotation contract."""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from gpuheal.agent.debounce import Report
from gpuheal.agent.findings import Health, Verdict
from gpuheal.agent.reporter import desired
from gpuheal.api.server import decode_webhook
from gpuheal.clock import iso
from gpuheal.config import ConditionRule, DeviceHealthConfig
from gpuheal.controller.intake import ControllerIntake
from gpuheal.model import (
    ZERO_ALLOCATABLE,
    ActionEntry,
    Condition,
    FaultRecord,
    FaultSignal,
    Phase,
    Severity,
)
from gpuheal.policy.actions import AddTaint, CreateRecord, NodeState
from gpuheal.policy.plan import current_signal, plan, reported
from gpuheal.sources import (
    SOURCES,
    Seen,
    alertmanager,
    conditions,
    dcgm,
    escalation,
    hygiene,
    manual,
    registered,
    sweep,
)
from gpuheal.sources import annotations as contract
from gpuheal.vocabulary import Entry
from tests.corpus import GPU_UUIDS, alert, dcgm_labels, webhook
from tests.unit.test_controller_echoes import _reconciler
from tests.unit.test_policy_plan import CONFIG, F1, N1, NOW, faulty, healthy

API_DOC = Path(__file__).parents[2] / "docs" / "api.md"
XID_LABELS = dcgm_labels(N1) | {"alertname": "GPUXidError", "severity": "critical"}


class Probe:
    """A source only this test registers: it reports a fault on one node."""

    SOURCE = "probe"
    OWN = False

    def __init__(self, severity: Severity = Severity.P0) -> None:
        self.severity = severity
        self.asked: list[str] = []

    def signals(self, seen: Seen) -> tuple[FaultSignal, ...]:
        self.asked.append(seen.node.name)
        found = FaultSignal(seen.node.name, "probe-1", "ProbeFault", "probe/gpu0", self.severity)
        return (found,) if seen.node.name == N1 else ()


class OwnProbe(Probe):
    """The probe as the node's own report."""

    OWN = True


def test_a_source_registered_in_the_list_is_what_the_plan_acts_on() -> None:
    probe = Probe()
    state = NodeState(healthy(), gpu_nodes=10)
    assert plan(state, CONFIG, NOW).actions == ()  # the registered sources see nothing
    decided = plan(state, CONFIG, NOW, sources=(*SOURCES, probe))
    assert decided.fault_id == "probe-1" and probe.asked == [N1]
    created = decided.actions[0]
    assert isinstance(created, CreateRecord) and created.signal.source == "probe/gpu0"
    assert any(isinstance(a, AddTaint) for a in decided.actions)
    # Among the sources that are not the node's own report, the most severe wins.
    mild = plan(replace(state, external=(_held(Severity.P2),)), CONFIG, NOW, (*SOURCES, probe))
    assert mild.fault_id == "probe-1"


def test_an_own_source_wins_in_list_order_and_the_later_own_ones_are_not_asked() -> None:
    rule = ConditionRule(type="AcceleratedHardwareReady", status="False", severity=Severity.P1)
    config = replace(CONFIG, conditions=(rule,))
    cond = Condition("AcceleratedHardwareReady", "False", "NvidiaXID79", "", "2026-11-29T10:00:00Z")
    both = replace(faulty(), conditions=(cond,))
    assert current_signal(Seen(both, config)).source == "node-annotation"  # type: ignore[union-attr]
    swapped = (conditions, contract)
    assert current_signal(Seen(both, config), swapped).source == (  # type: ignore[union-attr]
        "node-condition/AcceleratedHardwareReady"
    )
    # The node's own report first, then the other sources' signals.
    first, last = OwnProbe(), OwnProbe()
    found = reported(Seen(both, config, (_held(Severity.P0),)), (first, *SOURCES, last))
    assert [s.fault_id for s in found] == ["probe-1", _held(Severity.P0).fault_id]
    assert first.asked == [N1] and last.asked == []


def test_a_pushed_source_claims_only_its_own_held_signals() -> None:
    held = (_held(Severity.P1), _dcgm_signal("xid"), _manual_signal())
    seen = Seen(healthy(), CONFIG, held)
    assert alertmanager.signals(seen) == (held[0],)
    assert dcgm.signals(seen) == (held[1],)
    assert manual.signals(seen) == (held[2],)
    assert contract.signals(seen) == conditions.signals(seen) == escalation.signals(seen) == ()


def test_the_intake_refuses_a_signal_of_a_source_that_is_not_registered() -> None:
    # Held, it would never be acted on: the plan hears only registered sources.
    loop, records, _pods = _reconciler()
    intake = ControllerIntake(
        loop.reconciler,
        loop.nodes,
        records,
        enqueue=lambda _: None,
        synced=lambda: True,
        leading=lambda: True,
    )
    with pytest.raises(ValueError, match=re.escape("'probe/gpu0', not in gpuheal.sources")):
        intake.submit(FaultSignal(N1, "probe-1", "ProbeFault", "probe/gpu0", Severity.P0))
    assert loop.external.active(N1) == ()
    assert intake.submit(_held(Severity.P0))
    assert registered("dcgm/tempwarn") and not registered("dcgmx")


def test_a_repeated_signal_is_counted_once_per_repeat_and_queues_no_look() -> None:
    loop, records, _pods = _reconciler()
    queued: list[str] = []
    intake = ControllerIntake(
        loop.reconciler,
        loop.nodes,
        records,
        enqueue=queued.append,
        synced=lambda: True,
        leading=lambda: True,
    )
    taken = [intake.submit(_held(Severity.P0)) for _ in range(5)]
    assert taken == [True, False, False, False, False]
    assert queued == [N1]  # the repeats are no news about the node
    registry = loop.reconciler.metrics.registry
    suppressed = registry.get_sample_value(
        "gpuheal_duplicates_suppressed_total", {"layer": "signal"}
    )
    assert suppressed == 4
    assert [s.fault_id for s in loop.external.active(N1)] == [_held(Severity.P0).fault_id]


def test_escalated_device_faults_are_a_node_fault_only_with_device_health_on() -> None:
    state = NodeState(healthy(), gpu_nodes=10, device_records=(_escalated_device(),))
    on = replace(CONFIG, device_health=DeviceHealthConfig(enabled=True))
    decided = plan(state, on, NOW)
    assert decided.fault_id.startswith("devices-") and decided.new_quarantine
    off = replace(CONFIG, device_health=DeviceHealthConfig(enabled=False))
    assert plan(state, off, NOW).actions == ()


def test_every_source_string_a_source_produces_is_listed_in_the_docs() -> None:
    rows = _severity_table()
    assert len(rows) == len(SOURCES)
    patterns = [_pattern(row) for row in rows]
    produced = _one_signal_of_each_kind()
    assert {s.source.partition("/")[0] for s in produced} == {s.SOURCE for s in SOURCES}
    for signal in produced:
        assert any(p.fullmatch(signal.source) for p in patterns), signal.source
    assert {p.partition("/")[0] for p in rows} == {s.SOURCE for s in SOURCES}


def test_the_agent_and_the_policy_read_the_contract_with_one_codec() -> None:
    devices = (GPU_UUIDS[0], GPU_UUIDS[1])
    report = Report(
        F1, "2026-11-29T11:59:59Z", "XidCritical79", "off the bus", devices, Severity.P1
    )
    written = dict(desired(report, Verdict(Health.FAULTY, "XidCritical79", "")).annotations)
    said = contract.Annotated(F1, report.fault_time, report.reason, report.devices, Severity.P1)
    assert written == contract.encode(said)
    assert contract.written({k: v for k, v in written.items() if v is not None}) == said
    signal = contract.decode(N1, {k: v for k, v in written.items() if v is not None})
    assert signal is not None
    read = (signal.fault_id, signal.reason, signal.devices, signal.severity, signal.detected_at)
    assert read == (F1, "XidCritical79", report.devices, Severity.P1, report.fault_time)
    cleared = desired(None, Verdict(Health.HEALTHY, "GPUsHealthy", "")).annotations
    assert dict(cleared) == contract.encode(None) == dict.fromkeys(contract.KEYS)


# -- helpers --------------------------------------------------------------------


def _pattern(row: str) -> re.Pattern[str]:
    """A row's `source` as a pattern: `<type>`, `<query>` stand for one part."""
    return re.compile("[^/]+".join(re.escape(part) for part in re.split(r"<[a-z]+>", row)))


def _held(severity: Severity) -> FaultSignal:
    fault_id = "am-c3e2a0b7d18f4e95-20261201023012"
    return FaultSignal(N1, fault_id, "GPUXidError", "alertmanager", severity)


def _dcgm_signal(query: str) -> FaultSignal:
    (found,) = [q for q in dcgm.queries(85, 95) if q.name == query]
    finding = dcgm.DcgmFinding(N1, found, GPU_UUIDS[0], 79.0 if query == "xid" else 1.0)
    return dcgm.signal_for(finding, f"dcgm-{query}-1", "2026-12-01T02:30:00Z")


def _manual_signal() -> FaultSignal:
    severity = manual.checked(
        node=N1, action=manual.QUARANTINE, reason="ManualRequest", severity="P0", fault_id=""
    )
    return manual.signal(node=N1, reason="ManualRequest", severity=severity, fault_id="", now=NOW)


def _escalated_device() -> FaultRecord:
    when = iso(NOW - dt.timedelta(seconds=10))
    return FaultRecord(
        name=f"{N1[:40]}-0123456789ab",
        node=N1,
        fault_id=f"{GPU_UUIDS[0]}#1",
        phase=Phase.DRAINED,
        reason="DeviceUnhealthy",
        scope="device",
        resource="nvidia.com/gpu",
        device=GPU_UUIDS[0],
        created_at=when,
        actions=(ActionEntry(when, "detect", "ok"), ActionEntry(when, Entry.ESCALATE, "ok")),
    )


def _one_signal_of_each_kind() -> list[FaultSignal]:
    """A signal of every kind each registered source makes, from real-shaped input."""
    rule = ConditionRule(type="AcceleratedHardwareReady", status="False")
    cond = Condition("AcceleratedHardwareReady", "False", "NvidiaXID79", "", "2026-11-29T10:00:00Z")
    config = replace(CONFIG, conditions=(rule,), device_health=DeviceHealthConfig(enabled=True))
    hook = decode_webhook(json.dumps(webhook([alert(XID_LABELS)])).encode())
    (outcome,) = alertmanager.interpret(hook, node_labels=("Hostname",), find_node=lambda _l, v: v)
    assert outcome.signal is not None
    pushed = (
        outcome.signal,
        *(_dcgm_signal(q.name) for q in dcgm.queries(85, 95)),
        _manual_signal(),
        hygiene.signal_for(N1, ZERO_ALLOCATABLE, Severity.P1, "hygiene-zero-allocatable-x", NOW),
        sweep.signal_for(N1, "sweep-20261129100000", NOW),
    )
    seen = Seen(replace(faulty(), conditions=(cond,)), config, pushed, (_escalated_device(),))
    produced = [s for source in SOURCES for s in source.signals(seen)]
    assert len(produced) == len(SOURCES) + len(dcgm.queries(85, 95)) - 1
    return produced


def _severity_table() -> list[str]:
    """The `source` column of docs/api.md's severity table."""
    text = API_DOC.read_text()
    table = text[text.index("| source | `source` in GPUFault records | severity |") :]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cell = line.split("|")[2].strip()
        rows.append(cell.strip("`"))
    return rows
