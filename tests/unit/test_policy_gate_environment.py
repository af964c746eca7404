"""The health gate's `environment` check: the agent's start-order facts."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import msgspec
import pytest

from gpuheal.config import Config, ConfigError, HealthGateConfig, parse_config
from gpuheal.kube.projections import NodeJson, node_view
from gpuheal.model import ENVIRONMENT_FACTS, NODE_ENVIRONMENT
from gpuheal.ops.exitcodes import GATE_FAILED
from gpuheal.policy.gate import (
    CHECK_BITS,
    CheckResult,
    GateFacts,
    checks_of,
    evaluate,
    facts_from_views,
)

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)
ALL_OK = "modules=ok;persistenced=ok;fabricmanager=ok;runtimehook=ok"


def gate(
    value: str | None, *required: str, ignored: tuple[str, ...] = ()
) -> tuple[CheckResult, str, int]:
    annotations = {} if value is None else {NODE_ENVIRONMENT: value}
    facts = GateFacts(node="n1", ready=True, annotations=annotations)
    health_gate = HealthGateConfig(environment_required=required, environment_ignored=ignored)
    config = replace(Config(), health_gate=health_gate)
    result = evaluate(facts, config, NOW, None)
    (found,) = [c for c in result.checks if c.name == "environment"]
    return found.result, found.reason, result.bits


def test_all_ok_passes_and_says_each_fact() -> None:
    result, reason, bits = gate(ALL_OK.replace("fabricmanager=ok", "fabricmanager=n/a"))
    assert (result, bits) == (CheckResult.PASS, 0)
    assert reason == (
        "modules ok, persistenced ok, fabricmanager n/a (no NVSwitch), runtimehook ok"
    )


def test_fabric_manager_stopped_fails_on_the_device_plugins_bit() -> None:
    result, reason, bits = gate(ALL_OK.replace("fabricmanager=ok", "fabricmanager=stopped"))
    assert result is CheckResult.FAIL
    assert reason == "Fabric Manager (nv-fabricmanager) is not running on an NVSwitch system"
    assert bits == CHECK_BITS["environment"] == CHECK_BITS["device-plugin"] == 32
    assert "environment" in checks_of(bits) and GATE_FAILED | bits == 96


def test_every_bad_fact_is_named() -> None:
    value = "modules=missing:nvidia_uvm;persistenced=stopped;fabricmanager=n/a;runtimehook=missing"
    result, reason, _ = gate(value)
    assert result is CheckResult.FAIL
    assert reason.split("; ") == [
        "kernel modules not loaded: nvidia_uvm",
        "the persistence daemon (nvidia-persistenced) is not running",
        "the container runtime's NVIDIA hook (nvidia-container-runtime) is not configured: "
        "no runtime config names it",
    ]


def test_unknown_passes_unless_required() -> None:
    unseen = "modules=ok;persistenced=unknown;fabricmanager=unknown;runtimehook=ok"
    result, reason, _ = gate(unseen)
    assert result is CheckResult.PASS and "persistenced unknown (the agent cannot see it)" in reason
    result, reason, bits = gate(unseen, "fabricmanager")
    assert (result, bits) == (CheckResult.FAIL, 32)
    assert reason == "fabricmanager unknown; healthGate.environmentRequired"
    assert gate("modules=ok", "runtimehook")[:2] == (
        CheckResult.FAIL,
        "runtimehook unknown; healthGate.environmentRequired",
    )  # not reported at all: unknown too


def test_no_report_is_skipped_unless_required() -> None:
    assert gate(None)[:2] == (CheckResult.SKIPPED, f"the agent reports no {NODE_ENVIRONMENT}")
    result, reason, _ = gate(None, "modules")
    assert result is CheckResult.FAIL and "healthGate.environmentRequired" in reason


@pytest.mark.parametrize("value", ["", "ok", "modules=ok;persistenced", "modules=OK"])
def test_a_value_the_gate_cannot_read_fails_naming_the_annotation(value: str) -> None:
    result, reason, _ = gate(value)
    assert result is CheckResult.FAIL and reason.startswith(f"cannot tell: {NODE_ENVIRONMENT}: ")


def test_ignored_facts_are_not_looked_at() -> None:
    """A fleet without the NVIDIA container runtime (GKE) or without the daemon."""
    value = "modules=ok;persistenced=stopped;fabricmanager=n/a;runtimehook=missing"
    assert gate(value)[0] is CheckResult.FAIL
    result, reason, bits = gate(value, ignored=("persistenced", "runtimehook"))
    assert (result, bits) == (CheckResult.PASS, 0)
    assert reason == "modules ok, fabricmanager n/a (no NVSwitch)"
    result, reason, _ = gate(None, ignored=ENVIRONMENT_FACTS)
    assert (result, reason) == (CheckResult.SKIPPED, "healthGate.environmentIgnored: every fact")


def test_a_fact_cannot_be_both_required_and_ignored() -> None:
    document = {"healthGate": {"environmentRequired": ["modules", "runtimehook"],
                               "environmentIgnored": ["runtimehook"]}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"environmentIgnored: runtimehook also in"):
        parse_config(document)


def test_environment_required_takes_true_false_or_names() -> None:
    def required(value: object) -> tuple[str, ...]:
        return parse_config(
            {"healthGate": {"environmentRequired": value}}
        ).health_gate.environment_required

    assert required(True) == ENVIRONMENT_FACTS
    assert required(False) == ()
    assert required(["fabricmanager", "modules"]) == ("fabricmanager", "modules")
    assert Config().health_gate.environment_required == ()
    with pytest.raises(ConfigError, match=r"healthGate\.environmentRequired.*'fabric-manager'"):
        required(["fabric-manager"])


def test_the_controllers_recovery_gate_sees_the_fact_through_its_cache() -> None:
    """The controller's projection keeps the annotation, so its recovery holds the node."""
    down = ALL_OK.replace("fabricmanager=ok", "fabricmanager=stopped")
    raw = {
        "metadata": {
            "name": "n1",
            "resourceVersion": "7",
            "annotations": {NODE_ENVIRONMENT: down, "example.com/other": "x"},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    view = node_view(msgspec.convert(raw, NodeJson))
    result = evaluate(facts_from_views(view, (), {}), Config(), NOW, None)
    assert result.bits == 32 and "Fabric Manager" in result.summary()
