"""Debounce and fault identity, round by round."""

from __future__ import annotations

from gpuheal.agent.debounce import Debounce, step
from gpuheal.agent.findings import Health, ProbeFinding, ProbeResult, Verdict, verdict
from gpuheal.agent.reporter import desired
from gpuheal.model import FAULT_SEVERITY, Severity

FAULTY = Verdict(Health.FAULTY, "EccUncorrectable", "2 errors", ("GPU-a",), Severity.P0)
XID79 = Verdict(Health.FAULTY, "XidCritical79", "off the bus", ("GPU-b",), Severity.P0, True)
HEALTHY = Verdict(Health.HEALTHY, "GPUsHealthy")
UNKNOWN = Verdict(Health.UNKNOWN, "ProbesFailed")


def run(rounds: list[Verdict], *, immediate: bool = False) -> list[Debounce]:
    states, state = [], Debounce()
    for i, seen in enumerate(rounds):
        state = step(
            state,
            seen,
            fail_rounds=3,
            healthy_rounds=2,
            immediate_p0=immediate,
            new_fault_id=f"id-{i}",
            now=f"t{i}",
        )
        states.append(state)
    return states


def test_reported_after_exactly_n_failing_rounds() -> None:
    states = run([FAULTY, FAULTY, FAULTY])
    assert [s.reported is not None for s in states] == [False, False, True]
    assert states[-1].reported is not None and states[-1].reported.fault_id == "id-2"


def test_a_healthy_round_restarts_the_count() -> None:
    states = run([FAULTY, FAULTY, HEALTHY, FAULTY, FAULTY])
    assert all(s.reported is None for s in states)


def test_the_fault_id_is_kept_while_faulty_and_devices_accumulate() -> None:
    states = run([FAULTY] * 3 + [FAULTY, XID79] * 25)
    ids = {s.reported.fault_id for s in states[2:] if s.reported}
    assert ids == {"id-2"}
    last = states[-1].reported
    assert last is not None and last.devices == ("GPU-a", "GPU-b")
    assert last.fault_time == "t2"


def test_cleared_after_m_healthy_rounds_and_a_new_fault_gets_a_new_id() -> None:
    states = run([FAULTY] * 3 + [HEALTHY, HEALTHY] + [FAULTY] * 3)
    assert states[3].reported is not None  # one healthy round is not enough
    assert states[4].reported is None
    assert states[7].reported is not None and states[7].reported.fault_id == "id-7"


def test_unknown_rounds_count_for_nothing() -> None:
    states = run([FAULTY, FAULTY, UNKNOWN, UNKNOWN, FAULTY])
    assert states[-1].reported is not None  # the unknown rounds did not reset the count
    reported = run([FAULTY] * 3 + [UNKNOWN] * 10)
    assert reported[-1].reported is not None  # nor clear a reported fault


def test_an_immediate_p0_xid_skips_the_rounds_only_when_allowed() -> None:
    assert run([XID79], immediate=True)[0].reported is not None
    assert run([XID79], immediate=False)[0].reported is None


def test_verdict_unknown_only_when_no_level_probe_ran() -> None:
    hung = ProbeResult("nvml", ran=False, level=True, error="timed out")
    events = ProbeResult("events", ran=True)
    assert verdict([hung, events]).health is Health.UNKNOWN
    fine = ProbeResult("smi", ran=True, level=True)
    assert verdict([hung, fine, events]).health is Health.HEALTHY
    xid = ProbeResult(
        "events", ran=True, findings=(ProbeFinding("XidCritical79", Severity.P0, "m", ("g",)),)
    )
    assert verdict([hung, xid]).health is Health.FAULTY  # a finding beats not knowing
    app = ProbeResult(
        "events", ran=True, findings=(ProbeFinding("XidApplication13", Severity.P2, "m"),)
    )
    assert verdict([fine, app]).health is Health.HEALTHY  # application Xids are not node faults


HOT = Verdict(Health.FAULTY, "Thermal", "96 C", ("GPU-a",), Severity.P1)


def test_the_report_carries_the_worst_severity_the_fault_has_had() -> None:
    states = run([HOT] * 3 + [XID79] + [HOT] * 3)
    assert states[2].reported is not None and states[2].reported.severity is Severity.P1
    # Worse under the same id, and never back to P1 while it lasts.
    assert {s.reported.fault_id for s in states[2:] if s.reported} == {"id-2"}
    assert [s.reported.severity for s in states[3:] if s.reported] == [Severity.P0] * 4


def test_the_severity_is_written_with_the_fault_and_removed_with_it() -> None:
    reported = run([HOT] * 3)[-1].reported
    assert dict(desired(reported, HOT).annotations)[FAULT_SEVERITY] == "P1"
    assert dict(desired(None, HEALTHY).annotations)[FAULT_SEVERITY] is None
