from __future__ import annotations

from pathlib import Path

import pytest

from gpuheal.config import Config, ConfigError, load_config, parse_config
from gpuheal.model import Mode, Severity


def test_defaults_are_safe() -> None:
    config = parse_config(None)
    assert config == Config()
    assert config.mode is Mode.FULL and config.taint_effect == "NoSchedule"
    assert config.eviction_delete_after_seconds is None  # never force-delete by default
    assert config.rate_limit_per_second == 2.0
    assert config.is_gpu_resource("nvidia.com/gpu")
    assert config.is_gpu_resource("nvidia.com/mig-1g.10gb")
    assert not config.is_gpu_resource("cpu")


def test_a_full_document_is_parsed() -> None:
    config = parse_config(
        {
            "mode": "quarantine",
            "modeByReason": {"Thermal": "observe"},
            "taintEffect": "NoExecute",
            "breakerMaxNodes": 3,
            "breakerMaxPercent": 5,
            "evictionDeleteAfterSeconds": 600,
            "conditions": [
                {"type": "AcceleratedHardwareReady", "reasons": ["NvidiaXID79Error"]},
                {"type": "GPUHealthy", "severity": "P1", "faultReason": "AgentReport"},
            ],
            "leaderElection": {"namespace": "ops", "leaseSeconds": 30},
        }
    )
    assert config.mode_for("Thermal") is Mode.OBSERVE
    assert config.mode_for("XidCritical79") is Mode.QUARANTINE
    assert config.taint_effect == "NoExecute"
    assert config.conditions[0].matches("AcceleratedHardwareReady", "False", "NvidiaXID79Error")
    assert not config.conditions[0].matches("AcceleratedHardwareReady", "False", "Other")
    assert config.conditions[1].severity is Severity.P1
    assert config.leader_election.namespace == "ops"


def test_the_device_health_section_is_parsed() -> None:
    assert Config().device_health.heartbeat_seconds == 0  # off unless asked for
    config = parse_config(
        {
            "deviceHealth": {
                "heartbeatSeconds": 120,
                "canaryCommand": ["dcgmi", "diag", "-r", "1"],
                "wholeNodeReasons": ["Fallen Off The Bus"],
            }
        }
    )
    health = config.device_health
    assert health.heartbeat_seconds == 120
    assert health.canary_command == ("dcgmi", "diag", "-r", "1")
    assert health.whole_node_reasons == ("fallen off the bus",)  # matched in any case


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"breakerMaxPercent": 250}, "breakerMaxPercent: must be between 0 and 100, got 250"),
        ({"mode": "nuke"}, "mode: must be one of observe, quarantine, full, got 'nuke'"),
        ({"taintEffect": "PreferNoSchedule"}, "taintEffect: must be NoSchedule or NoExecute"),
        ({"rateLimitPerSecnd": 5}, "rateLimitPerSecnd: unknown key"),
        ({"workers": True}, "workers: must be an integer, got True"),
        ({"conditions": [{"status": "False"}]}, "conditions[0].type: required"),
        ({"conditions": [{"type": "X", "severity": "P9"}]}, "conditions[0].severity: must be"),
        ({"leaderElection": {"leaseSeconds": 5}}, "leaderElection: need retryPeriodSeconds"),
        ({"nodeSelector": {"a": 1}}, "nodeSelector: must be a map of strings to strings"),
        ([1, 2], "<root>: must be a map, got list"),
        ({"deviceHealth": {"minHealthyFraction": 2}}, "deviceHealth.minHealthyFraction: must be"),
        ({"deviceHealth": {"canaryCommand": "nvidia-smi"}}, "deviceHealth.canaryCommand: must be"),
        ({"deviceHealth": {"heartbeat": 5}}, "deviceHealth.heartbeat: unknown key"),
    ],
)
def test_bad_values_are_refused_naming_the_key(document: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(document)
    assert message in str(err.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"mode": "x", "workers": 0})
    assert "mode:" in str(err.value) and "workers:" in str(err.value)


def test_files(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("mode: observe\n")
    assert load_config(good).mode is Mode.OBSERVE
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
