"""The node-problem-detector monitor config gpuheal ships (gpuheal/sources/npd.py): its
permanent rules match exactly the kernel lines the agent's parser and classification
make node faults, over the same corpora of real driver lines the agent is tested on,
and NPD's conditions read back through the conditions source are the agent's faults."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from gpuheal.config import ConditionRule, Config, ConfigError, parse_config
from gpuheal.model import Condition, NodeView, Severity
from gpuheal.sources import conditions, npd
from gpuheal.sources.base import Seen
from gpuheal.xid import CATALOGUE, classify, needs_line
from gpuheal.xid.lines import OffTheBus, SxidEvent, XidEvent, message_text, parse_message
from gpuheal.xid.sxid import classify_sxid

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]
MONITOR = npd.monitor_config()  # made once: its number patterns cover 99999 codes
PERMANENT = [r for r in MONITOR["rules"] if r["type"] == "permanent"]
_RECORD = re.compile(r"^\d+,\d+,\d+,[^;]*;")


def corpus_lines() -> list[str]:
    """Every driver message of both corpora, as NPD's watcher hands it to its rules:
    the kmsg record's message (escapes and all), whitespace trimmed."""
    lines = [
        _RECORD.sub("", line).strip()
        for line in (DATA / "kmsg_corpus.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for line in (DATA / "kmsg_public.txt").read_text().splitlines():
        if line and not line.startswith("#") and ";" in line:
            lines.append(line.split(";", 1)[1].strip())
    return lines


def npd_match(pattern: str, text: str) -> bool:
    """NPD's LogBuffer.Match: the pattern with `\\z` appended, searched in the buffer."""
    return re.search(pattern + r"\Z", text) is not None


def npd_conditions(text: str) -> set[str]:
    """The conditions the shipped monitor's permanent rules set for one line."""
    return {r["condition"] for r in PERMANENT if npd_match(r["pattern"], text)}


def agent_conditions(text: str) -> set[str]:
    """Which of the monitor's conditions the agent's reading of the line says it is."""
    event = parse_message(text)
    if isinstance(event, XidEvent):
        if needs_line(event.xid):
            return {npd.XID_DECODED_CONDITION}
        row = classify(event.xid, {}, event.recovery_action, detail=event.detail)
        return {npd.XID_CONDITION} if row.node_fault else set()
    if isinstance(event, SxidEvent):
        return {npd.SXID_CONDITION} if classify_sxid(event.sxid, event.fatal).node_fault else set()
    if isinstance(event, OffTheBus):
        return {npd.XID_CONDITION}
    return set()


def test_number_patterns_match_exactly_their_numbers() -> None:
    sets = [
        npd.fixed_node_fault_xids(),
        npd.decoded_xids(),
        npd.fatal_sxids(),
        npd.unknown_sxids(),
        [1],
        [9, 10, 11, 99999],
    ]
    for numbers in sets:
        wanted = set(numbers)
        compiled = re.compile(npd.number_pattern(numbers) + r"\Z")
        wrong = [
            n for n in range(npd.CODE_MAX + 1) if bool(compiled.match(str(n))) != (n in wanted)
        ]
        assert not wrong, wrong[:10]
        assert not compiled.match("079") and not compiled.match("")
    with pytest.raises(ValueError, match="1 to 99999"):
        npd.number_pattern([0, 5])


def test_no_xid_is_the_text_without_xid() -> None:
    """Every string of up to 8 of X, i, d and another letter (and a newline ends it)."""
    compiled = re.compile(npd.NO_XID + r"\Z")
    for length in range(9):
        for letters in itertools.product("Xidz", repeat=length):
            text = "".join(letters)
            assert bool(compiled.match(text)) == ("Xid" not in text), text
    assert not compiled.match("ab\ncd")


def test_the_xid_lists_are_the_catalogues() -> None:
    fixed = set(npd.fixed_node_fault_xids())
    for code, row in CATALOGUE.items():
        assert (code in fixed) == (row.node_fault and not needs_line(code)), code
    assert {13, 31, 43, 45, 63, 94} & fixed == set()
    assert {48, 79, 95, 64, 119, 173, 999} <= fixed
    assert npd.decoded_xids() == [74, 144, 145, 146, 147, 148, 149, 150, 154]
    # A catalogued Xid not decoded from the line reads the same whatever the line says.
    for line in corpus_lines():
        event = parse_message(line)
        if isinstance(event, XidEvent) and event.xid in CATALOGUE and not needs_line(event.xid):
            assert classify(event.xid, detail=event.detail) == CATALOGUE[event.xid], line


def test_every_corpus_line_sets_the_conditions_the_agent_would_fault_on() -> None:
    lines = corpus_lines()
    assert len(lines) >= 300
    seen: set[str] = set()
    for line in lines:
        npd_says, agent_says = npd_conditions(line), agent_conditions(line)
        assert npd_says == agent_says, (line, npd_says, agent_says)
        seen |= npd_says
    assert seen == set(npd.CONDITIONS)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            True,
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
            True,
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 95, pid=77, name=train, Uncontained: FBHUB. RST: Yes, D-RST: No",
            True,
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python3, Graphics Exception: ESR 0x405840=0x0",
            False,
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=python3, Ch 00000010, intr 10000000. MMU Fault",
            False,
        ),
        ("NVRM: Xid (PCI:0000:3b:00): 43, pid=1234, name=python3, Ch 00000008", False),
        ("NVRM: Xid (PCI:0000:3b:00): 45, pid=1234, name=python3, Ch 00000008", False),
        ("NVRM: Xid (PCI:0000:3b:00 GPU-I:05 GPU-CI:00): 79, GPU has fallen off the bus.", True),
        ("NVRM: Xid (PCI:0000:3b:00): 1790, pid=1, name=x, a code no catalogue knows", True),
        ("NVRM: Xid (PCI:0000:3b:00): 790, pid=1, name=x, three digits, unknown", True),
        ("NVRM: Xid (PCI:0000:3b:00): 79123456, too many digits", False),
        ("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", True),
        (
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
            True,
        ),
        (
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine instance 32 Sub-engine instance 00",
            True,
        ),
        (
            "nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 11012, Non-fatal, Link 28 Single bit ECC error",
            False,
        ),
        ("nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 29999, Fatal, Link 02 something new", True),
        (
            "nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 29999, Non-fatal, Link 02 something new",
            False,
        ),
        (
            "nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 29999, Severity 1 Engine instance 2 Sub-engine instance 00",
            True,
        ),
    ],
)
def test_real_shapes(line: str, expected: bool) -> None:
    assert bool(npd_conditions(line)) is expected, line
    assert npd_conditions(line) == agent_conditions(line)


def test_every_pattern_keeps_to_the_last_line_of_the_buffer() -> None:
    """NPD matches against its last lines joined by newlines: a fault line followed by
    another line is not matched again (its condition is already set), and no pattern
    reaches across a newline but the multi-record "fallen off the bus"."""
    fault = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    assert npd_conditions(fault) == {npd.XID_CONDITION}
    assert npd_conditions(f"{fault}\nsome other kernel line") == set()
    assert npd_conditions(f"{fault}\nNVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, y") == set()


def test_the_off_the_bus_message_in_records_of_its_own_names_its_gpu() -> None:
    buffer = "\n".join(
        [
            "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, earlier",
            "NVRM: The NVIDIA GPU 0000:b3:00.0",
            "NVRM: (PCI ID: 10de:20b2) installed in this system has",
            "NVRM: fallen off the bus and is not responding to commands.",
        ]
    )
    found = re.search(npd.OFF_THE_BUS_RECORDS + r"\Z", buffer)
    assert found is not None
    message = found.group(0)  # NPD's message: the lines the match spans
    assert message.startswith("NVRM: The NVIDIA GPU 0000:b3:00.0")
    (line,) = conditions.driver_lines(message, {})
    assert (line.reason, line.severity, line.devices) == (
        "GpuFellOffBus",
        Severity.P0,
        ("0000:b3:00",),
    )


def test_the_rules_are_in_the_order_the_messages_need() -> None:
    rules = MONITOR["rules"]
    patterns = [r["pattern"] for r in rules]
    assert patterns.index(npd.OFF_THE_BUS_RECORDS) < patterns.index(npd.OFF_THE_BUS)
    # One reason per condition: a second rule's line never replaces the first's
    # message, nor its transition time (the fault id).
    reasons: dict[str, set[str]] = {}
    for rule in rules:
        if rule["type"] == "permanent":
            reasons.setdefault(rule["condition"], set()).add(rule["reason"])
    assert all(len(r) == 1 for r in reasons.values())
    assert {c["type"] for c in MONITOR["conditions"]} == set(npd.CONDITIONS)


def test_the_shipped_file_is_the_monitor_config() -> None:
    shipped = json.loads((ROOT / "deploy" / "npd" / "nvidia-monitor.json").read_text())
    assert shipped == MONITOR
    chart = ROOT / "deploy" / "helm" / "gpuheal" / "files" / "nvidia-monitor.json"
    assert chart.read_text() == (ROOT / "deploy" / "npd" / "nvidia-monitor.json").read_text()


# -- NPD's conditions through the conditions source -----------------------------------

NPD_RULES = parse_config({"conditions": npd.condition_rules()}).conditions


def node_with(*conds: Condition) -> NodeView:
    return NodeView(name="gpu-1", resource_version="1", conditions=conds)


def npd_condition(type_: str, message: str, when: str = "2026-12-02T10:00:00Z") -> Condition:
    reason = "NVIDIAXidNodeFault" if type_ == npd.XID_CONDITION else "Something"
    return Condition(type_, "True", reason, message, when)


def seen(node: NodeView, config: Config | None = None) -> Seen:
    base = config or Config(conditions=NPD_RULES)
    return Seen(node, base)


def test_the_rules_read_npd_messages_as_kernel_lines() -> None:
    assert [r.message for r in NPD_RULES] == ["kernelLog"] * 3
    assert [r.type for r in NPD_RULES] == list(npd.CONDITIONS)
    assert all(r.status == "True" for r in NPD_RULES)


def test_an_xid_79_is_the_agents_fault_with_its_gpu() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
    (signal,) = conditions.signals(seen(node_with(npd_condition(npd.XID_CONDITION, line))))
    assert signal.reason == "XidCritical79" == classify(79).reason
    assert signal.severity is Severity.P0
    assert signal.devices == ("0000:3b:00",)
    assert signal.source == "node-condition/NVIDIAXid"
    assert signal.detected_at == "2026-12-02T10:00:00Z"
    again = conditions.signals(seen(node_with(npd_condition(npd.XID_CONDITION, line))))
    assert again[0].fault_id == signal.fault_id  # one transition, one fault
    later = npd_condition(npd.XID_CONDITION, line, "2026-12-02T11:00:00Z")
    assert conditions.signals(seen(node_with(later)))[0].fault_id != signal.fault_id


def test_application_xids_are_no_fault_and_the_next_rule_is_asked() -> None:
    app = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python3, Graphics Exception"
    assert conditions.signals(seen(node_with(npd_condition(npd.XID_CONDITION, app)))) == ()
    sxid = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error"
    both = node_with(npd_condition(npd.XID_CONDITION, app), npd_condition(npd.SXID_CONDITION, sxid))
    (signal,) = conditions.signals(seen(both))
    assert (signal.reason, signal.severity) == ("NvswitchFatal12028", Severity.P0)
    assert signal.devices == ("nvidia-nvswitch0",)


def test_the_worst_line_of_a_message_is_the_fault() -> None:
    message = "\n".join(
        [
            "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, app",
            "NVRM: Xid (PCI:0000:86:00): 999, pid=1, name=x, new code",  # uncatalogued: P1
            "NVRM: Xid (PCI:0000:b3:00): 95, pid=1, name=x, uncontained",  # P0
        ]
    )
    (signal,) = conditions.signals(seen(node_with(npd_condition(npd.XID_CONDITION, message))))
    assert (signal.reason, signal.severity, signal.devices) == (
        "EccUncontained95",
        Severity.P0,
        ("0000:b3:00",),
    )


def test_decoded_xids_read_their_line_as_the_agent_does() -> None:
    none = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    reboot = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert conditions.signals(seen(node_with(npd_condition(npd.XID_DECODED_CONDITION, none)))) == ()
    (signal,) = conditions.signals(
        seen(node_with(npd_condition(npd.XID_DECODED_CONDITION, reboot)))
    )
    assert (signal.reason, signal.severity) == ("NodeRebootRequired154", Severity.P0)


def test_the_config_xid_rows_come_first_as_on_the_agent() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    raw = {
        "conditions": npd.condition_rules(),
        "xid": {79: {"reason": "Quiet79", "severity": "P2", "action": "none"}},
    }
    config = parse_config(raw)
    node = node_with(npd_condition(npd.XID_CONDITION, line))
    assert conditions.signals(seen(node, config)) == ()
    raw["xid"] = {79: {"reason": "Mine79", "severity": "P1", "action": "reboot"}}
    (signal,) = conditions.signals(seen(node, parse_config(raw)))
    assert (signal.reason, signal.severity) == ("Mine79", Severity.P1)


def test_a_message_without_a_driver_line_is_the_rules_own_fault() -> None:
    rule = ConditionRule(
        type="GPUProblem", status="True", severity=Severity.P1, message="kernelLog"
    )
    node = node_with(
        Condition("GPUProblem", "True", "XidSeen", "the GPU is sad", "2026-12-02T10:00:00Z")
    )
    (signal,) = conditions.signals(seen(node, Config(conditions=(rule,))))
    assert (signal.reason, signal.severity, signal.devices) == ("XidSeen", Severity.P1, ())


def test_a_rule_that_ignores_the_message_is_as_before() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, app"
    rule = ConditionRule(type=npd.XID_CONDITION, status="True")
    (signal,) = conditions.signals(
        seen(node_with(npd_condition(npd.XID_CONDITION, line)), Config(conditions=(rule,)))
    )
    assert (signal.reason, signal.severity, signal.devices) == (
        "NVIDIAXidNodeFault",
        Severity.P0,
        (),
    )


def test_fault_reason_names_the_fault_in_kernel_log_mode_too() -> None:
    rule = ConditionRule(
        type=npd.XID_CONDITION, status="True", fault_reason="NPDXid", message="kernelLog"
    )
    line = "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE"
    (signal,) = conditions.signals(
        seen(node_with(npd_condition(npd.XID_CONDITION, line)), Config(conditions=(rule,)))
    )
    assert (signal.reason, signal.severity) == ("NPDXid", Severity.P0)


def test_driver_lines_never_raise() -> None:
    for line in corpus_lines():
        for message in (line, f"{line}\n{line}", message_text(line), line[: len(line) // 2]):
            conditions.driver_lines(message, {})


def test_the_message_key_takes_two_words() -> None:
    with pytest.raises(ConfigError, match=r"conditions\[0\]\.message"):
        parse_config({"conditions": [{"type": "X", "message": "json"}]})
    assert parse_config({"conditions": [{"type": "X"}]}).conditions[0].message == "ignored"
