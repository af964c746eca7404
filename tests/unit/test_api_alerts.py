"""Alertmanager payloads -> signals (pure; DCGM results: test_dcgm.py)."""

from __future__ import annotations

import json

import pytest

from gpuheal.api.alerts import PayloadError, alert_fault_id, decode_webhook, interpret
from gpuheal.model import Severity


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
