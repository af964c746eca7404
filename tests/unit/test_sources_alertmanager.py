"""Alertmanager payloads -> signals (pure; DCGM results: test_sources_dcgm.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal import values
from gpuheal.api.server import decode_webhook
from gpuheal.model import Severity
from gpuheal.sources import fields
from gpuheal.sources.alertmanager import PayloadError, alert_fault_id, interpret
from tests.corpus import EKS_NODE, GPU_UUIDS, NODE_NAMES, alert, dcgm_labels, webhook


def payload(*alerts: dict[str, object], version: str = "4") -> bytes:
    return json.dumps({"version": version, "status": "firing", "alerts": list(alerts)}).encode()


def firing(**labels: str) -> dict[str, object]:
    return {
        "status": "firing",
        "labels": labels,
        "startsAt": "2026-11-29T10:00:00Z",
        "fingerprint": "abcdef0123456789ff",
    }


def test_repeats_of_one_alert_are_one_fault_a_new_firing_is_another() -> None:
    hook = decode_webhook(payload(firing(Hostname="n1")))
    same = decode_webhook(payload(firing(Hostname="n1")))
    assert (
        alert_fault_id(hook.alerts[0])
        == alert_fault_id(same.alerts[0])
        == "am-abcdef0123456789-20261129100000"
    )
    later = decode_webhook(payload({**firing(Hostname="n1"), "startsAt": "2026-11-30T10:00:00Z"}))
    assert alert_fault_id(later.alerts[0]) != alert_fault_id(hook.alerts[0])


def test_the_node_comes_from_the_first_label_that_names_a_managed_node() -> None:
    hook = decode_webhook(
        payload(
            firing(
                node="n2", Hostname="n1", severity="warning", gpuheal_reason="HotGpu", UUID="GPU-x"
            )
        )
    )
    (outcome,) = interpret(
        hook, node_labels=("node", "Hostname"), find_node=lambda _, v: v if v == "n1" else None
    )
    assert outcome.node == "n1" and outcome.signal is not None
    assert (outcome.signal.reason, outcome.signal.severity, outcome.signal.devices) == (
        "HotGpu",
        Severity.P1,
        ("GPU-x",),
    )
    (skipped,) = interpret(hook, node_labels=("node",), find_node=lambda _, v: None)
    assert skipped.skipped == "no managed node matches node=n2" and skipped.signal is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "malformed JSON"),
        (b"[]", "not an Alertmanager webhook"),
        (payload(firing(a="b"), version="3"), "unsupported webhook version '3'"),
        (payload({"status": "maybe", "labels": {}, "startsAt": "x"}), "$.alerts[0].status"),
        (
            json.dumps(
                {"version": "4", "status": "firing", "alerts": [{"labels": {}, "startsAt": "x"}]}
            ).encode(),
            "status",
        ),
    ],
)
def test_bad_payloads_are_refused_with_a_precise_message(body: bytes, message: str) -> None:
    with pytest.raises(PayloadError) as err:
        decode_webhook(body)
    assert message in str(err.value)


# -- values an alert carries: bounded whatever the alert says ------------------


def xid_labels(node: str, gpu: int = 0) -> dict[str, str]:
    """An Xid alert's labels: the series' (dcgm-exporter's) and the rule's."""
    return dcgm_labels(node, gpu) | {"alertname": "GPUXidError", "severity": "critical"}


# Any text JSON can carry (utf-8: no lone surrogates), and shapes seen in the wild.
ODD_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=400) | st.sampled_from(
    ["", " ", "a b", "x" * 300, "\x00\n\t", "\u200b", "\u0662\u0660\u0662\u0666"]
)


@given(fingerprint=ODD_TEXT, starts_at=ODD_TEXT, labels=st.dictionaries(ODD_TEXT, ODD_TEXT))
@settings(max_examples=300, deadline=None)
def test_an_alert_fault_id_is_a_short_label_value_whatever_the_alert_carries(
    fingerprint: str, starts_at: str, labels: dict[str, str]
) -> None:
    body = alert(labels, fingerprint=fingerprint, starts_at=starts_at)
    fault_id = alert_fault_id(decode_webhook(json.dumps(webhook([body])).encode()).alerts[0])
    assert len(fault_id) <= 34 and values.is_label_value(fault_id), fault_id


def test_one_instant_written_with_two_offsets_is_one_fault() -> None:
    utc, india = (
        decode_webhook(json.dumps(webhook([alert({}, starts_at=t)])).encode()).alerts[0]
        for t in ("2026-12-01T02:30:12.345678901Z", "2026-12-01T08:00:12.345+05:30")
    )
    assert alert_fault_id(utc) == alert_fault_id(india) == "am-c3e2a0b7d18f4e95-20261201023012"


@pytest.mark.parametrize(
    "starts_at",
    ["2026-12-01T02:30:12.345678901Z", "2026-12-01T08:00:12+05:30", "0001-01-01T00:00:00Z"],
)
def test_rfc3339_times_as_go_writes_them_are_carried(starts_at: str) -> None:
    hook = decode_webhook(
        json.dumps(webhook([alert(xid_labels(EKS_NODE), starts_at=starts_at)])).encode()
    )
    (outcome,) = interpret(hook, node_labels=("Hostname",), find_node=lambda _, v: v)
    assert outcome.signal is not None and outcome.signal.detected_at == starts_at


BAD_STARTS_AT = [
    "2026-12-01T02:30:12." + "1" * 80 + "Z",  # 100 characters: over the record's 64
    "2026-12-01",  # a date, not a date-time
    "20261201T023012Z",  # ISO 8601 basic format, not RFC 3339
    "2026-12-01T02:30:12",  # no offset
    "2026-13-01T02:30:12Z",  # no 13th month
    "9999-12-31T23:59:59-01:00",  # past year 9999 in UTC
    "\u0662\u0660\u0662\u0666-12-01T02:30:12Z",  # digits, but not ASCII ones
    "yesterday",
    "",
    "x" * 100_000,
]


def test_an_alert_whose_start_cannot_be_carried_is_skipped_naming_it_and_its_group_is_taken() -> (
    None
):
    """Alertmanager retries a refused body forever: one odd alert is skipped, with
    the field named; the others in its group are taken."""
    good = [alert(xid_labels(node), fingerprint=f"{i:016x}") for i, node in enumerate(NODE_NAMES)]
    bad = [
        alert(xid_labels(EKS_NODE), starts_at=t, fingerprint=f"{i:016x}")
        for i, t in enumerate(BAD_STARTS_AT, start=100)
    ]
    hook = decode_webhook(json.dumps(webhook(good + bad)).encode())
    outcomes = interpret(hook, node_labels=("Hostname",), find_node=lambda _, v: v)
    assert [o.node for o in outcomes[: len(good)]] == list(NODE_NAMES)
    assert all(o.signal is not None and not o.skipped for o in outcomes[: len(good)])
    for index, outcome in enumerate(outcomes[len(good) :], start=len(good)):
        assert outcome.signal is None and outcome.invalid, hook.alerts[index].startsAt[:80]
        assert outcome.skipped.startswith(f"$.alerts[{index}].startsAt: want an RFC 3339")
        assert len(outcome.skipped) < 300  # the value is quoted cut, not whole


def test_label_values_are_cut_to_what_the_record_carries() -> None:
    """Label values have no length limit; the record's reason and devices do."""
    long_reason, long_uuid = "GpuFellOffTheBus" * 20, "GPU-" + "a" * 400
    labels = xid_labels(EKS_NODE) | {"gpuheal_reason": long_reason, "UUID": long_uuid}
    hook = decode_webhook(
        json.dumps(webhook([alert(labels), alert(xid_labels(EKS_NODE, 3))])).encode()
    )
    long, real = (
        o.signal for o in interpret(hook, node_labels=("Hostname",), find_node=lambda _, v: v)
    )
    assert long is not None and real is not None
    assert len(long.reason) == values.FIELD_MAX and long.reason.startswith("GpuFellOffTheBus")
    (device,) = long.devices
    assert len(device) <= values.FIELD_MAX and device.startswith("GPU-aaaa")
    assert real.devices == (GPU_UUIDS[3],) and real.reason == "GPUXidError"
    blank = decode_webhook(
        json.dumps(webhook([alert(xid_labels(EKS_NODE) | {"gpuheal_reason": " \n"})])).encode()
    )
    (outcome,) = interpret(blank, node_labels=("Hostname",), find_node=lambda _, v: v)
    assert outcome.signal is not None and outcome.signal.reason == "GPUXidError"


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (GPU_UUIDS[0], True),
        ("xid79-1733022000", True),
        ("温度-故障/7", True),
        ("f" * values.FIELD_MAX, True),
        ("f" * (values.FIELD_MAX + 1), False),
        ("", False),
        ("has space", False),
        ("tab\there", False),
        ("nul\x00", False),
        ("zero\u200bwidth", False),
        ("no\u00a0break", False),
        ("line\u2028sep", False),
        ("private\ue000use", False),
    ],
)
def test_a_fault_id_from_a_person_is_printable_without_whitespace(value: str, ok: bool) -> None:
    assert fields.is_identifier(value) is ok


def test_an_alert_whose_rule_says_it_is_no_fault_is_skipped_whatever_its_severity() -> None:
    usage = firing(
        alertname="GPUStalledJob", Hostname="n1", severity="critical", gpuheal_fault="false"
    )
    fault = firing(alertname="GPUTemperatureHigh", Hostname="n1", gpuheal_fault="true")
    outcomes = interpret(
        decode_webhook(payload(usage, fault)), node_labels=["Hostname"], find_node=lambda _, v: v
    )
    assert outcomes[0].signal is None and "gpuheal_fault: false" in outcomes[0].skipped
    assert outcomes[1].signal is not None and outcomes[1].signal.severity is Severity.P1
