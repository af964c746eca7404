from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal import config as config_module
from gpuheal.agent import config as agent_config
from gpuheal.config import Config, ConfigError, load_config, parse_config
from gpuheal.config.keys import keys_of
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


# -- every key, every odd value ---------------------------------------------------------

SECTION_NAMES = [
    "",
    "leaderElection",
    "deviceHealth",
    "healthGate",
    "maintenance",
    "retention",
    "pools",
]
# (section, schema): where each key lives in the document.
SECTIONS: list[tuple[str, dict[str, tuple[str, Any]]]] = [
    *((section, config_module.SCHEMAS[section]) for section in SECTION_NAMES),
    ("pools.byName.a3-highgpu-8g", config_module.SCHEMAS["pools.byName.<pool>"]),
    ("agent", agent_config.SCHEMA),
]
KEYS = [(section, key) for section, schema in SECTIONS for key in schema]


def document(section: str, key: str, value: object) -> dict[str, Any]:
    doc: dict[str, Any] = {key: value}
    for part in reversed(section.split(".") if section and section != "agent" else []):
        doc = {part: doc}
    return doc


def parse(section: str, key: str, yaml_value: str) -> object:
    """Parse `key: <yaml_value>` as the YAML loader hands it over."""
    value = yaml.safe_load(f"v: {yaml_value}")["v"]
    if section == "agent":
        return agent_config.parse_agent_config({key: value})
    return parse_config(document(section, key, value))


def where(section: str, key: str) -> str:
    return f"{section}.{key}" if section and section != "agent" else key


def numeric(schema: dict[str, tuple[str, Any]], key: str) -> bool:
    for value in (1, 1024):
        try:
            schema[key][1](value)
        except (ValueError, TypeError):
            continue
        return True
    return False


NUMERIC = [(s, k) for s, schema in SECTIONS for k in schema if numeric(schema, k)]


def test_the_numeric_keys_are_found() -> None:
    assert ("", "breakerMaxPercent") in NUMERIC and ("", "workers") in NUMERIC
    assert ("agent", "metricsPort") in NUMERIC
    assert len(NUMERIC) >= 50


@pytest.mark.parametrize(("section", "key"), KEYS, ids=[where(s, k) for s, k in KEYS])
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1.0e+400", "-1.0e+400"])
def test_no_key_takes_a_non_finite_number(section: str, key: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(section, key, value)
    assert f"{where(section, key)}: " in str(err.value)


@pytest.mark.parametrize(("section", "key"), NUMERIC, ids=[where(s, k) for s, k in NUMERIC])
def test_every_number_is_finite_and_has_a_sane_upper_bound(section: str, key: str) -> None:
    for value, message in [
        (".nan", "must be a"),  # "a finite number", or "an integer"
        (".inf", "must be a"),
        ("1e400", "must be a"),  # YAML 1.1 reads it as a string; JSON-minded people do not
        ("1000000000000", "must be between "),
    ]:
        with pytest.raises(ConfigError) as err:
            parse(section, key, value)
        assert f"{where(section, key)}: {message}" in str(err.value), value


@pytest.mark.parametrize(("section", "key"), KEYS, ids=[where(s, k) for s, k in KEYS])
def test_any_value_of_any_type_is_a_config_or_a_config_error(section: str, key: str) -> None:
    # Before: `pools.byName: 5` raised TypeError, an agent `xid` key `.inf` OverflowError.
    odd = ["~", "true", "-1", "0", "x", "[]", "[1]", "{}", "{a: 1}", "{.inf: {}}", "2026-12-01"]
    for value in odd:
        try:
            parse(section, key, value)
        except ConfigError as err:
            assert where(section, key) in str(err)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("breakerMaxPercent: .nan", "breakerMaxPercent: must be a finite number, got nan"),
        ("workers: 100000", "workers: must be between 1 and 64, got 100000"),
        ("leaderElection: {leaseSeconds: .inf}", "leaderElection.leaseSeconds: must be a finite"),
        ("deviceHealth: {quarantineSeconds: 1.0e+400}", "deviceHealth.quarantineSeconds: must"),
        ("apiMaxBodyBytes: 99999999999", "apiMaxBodyBytes: must be between 1024 and 67108864"),
        ("pools: {byName: 5}", "pools.byName: must be a map of pool name to pool, got int"),
    ],
)
def test_regressions_are_refused_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    assert message in refusal_of(tmp_path, text)


def refusal_of(tmp_path: Path, text: str) -> str:
    """The ConfigError's message for a config file holding `text`."""
    path = tmp_path / "config.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    return str(err.value)


def test_a_missing_or_unreadable_api_token_file_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    missing = tmp_path / "token" / "token"
    path.write_text(f"apiTokenFile: {missing}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, check_files=True)  # the controller's start and reload
    assert f"apiTokenFile: cannot read {missing}: No such file or directory" in str(err.value)
    # The operator commands read the same document but not the token.
    assert load_config(path).api_token_file == missing
    missing.parent.mkdir()
    missing.mkdir()  # a Secret mounted one level too deep
    with pytest.raises(ConfigError, match=r"apiTokenFile: cannot read .*: Is a directory"):
        load_config(path, check_files=True)
    missing.rmdir()
    missing.write_text("s3cr3t-t0ken\n")
    assert load_config(path, check_files=True).api_token_file == missing


# -- secrets in config errors ---------------------------------------------------------

SLACK_SECRET = "XqZ7vN2kLp9RtY4wMb6c8dFg"  # a made-up webhook secret
SLACK_PATH = f"/services/T0A1B2C3D/B0E4F5G6H/{SLACK_SECRET}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # A typo'd scheme: the rest of the URL is still the secret.
        (f"notificationSinks: [{{url: 'htps://hooks.slack.com{SLACK_PATH}'}}]",
         "notificationSinks[0].url: must be an http(s) URL, got 76 characters without http(s)://"),
        (f"notificationSinks: [{{url: 'hooks.slack.com{SLACK_PATH}'}}]",
         "notificationSinks[0].url: must be an http(s) URL"),
        (f"maintenance: {{checkpointWebhookUrl: 'https://hooks.slack.com:x{SLACK_PATH}'}}",
         "maintenance.checkpointWebhookUrl: must be an http(s) URL with a host"),
        # PyYAML quotes the broken line: here, the webhook's.
        (f"notificationSinks:\n  - url: https://hooks.slack.com{SLACK_PATH} format: slack",
         "is not valid YAML: mapping values are not allowed here at line 2, column 94"),
        (f"mode: full\nnotificationSinks: [{{url: https://hooks.slack.com{SLACK_PATH}",
         "is not valid YAML: while parsing a flow mapping expected ',' or '}'"),
    ],
)  # fmt: skip
def test_a_config_error_never_quotes_a_webhook_url(tmp_path: Path, text: str, message: str) -> None:
    refused = refusal_of(tmp_path, text)
    assert message in refused
    assert SLACK_SECRET not in refused and "services" not in refused


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        (f"https://hooks.slack.com{SLACK_PATH}", "https://hooks.slack.com"),
        ("https://gpuheal:pa55w0rd@hooks.example.com:8443/a?token=t0k#f", "https://hooks.example.com:8443"),
        ("http://[fd00::5]:9093/hook", "http://[fd00::5]:9093"),
        ("http://127.0.0.1/", "http://127.0.0.1"),
        ("http://host:port/", "<unparsable URL>"),
    ],
)  # fmt: skip
def test_a_url_is_shown_as_its_scheme_and_host(url: str, origin: str) -> None:
    assert config_module.url_origin(url) == origin


def test_an_error_message_quoting_the_url_is_scrubbed_of_its_secrets() -> None:
    url = f"https://gpuheal:pa55w0rd@hooks.slack.com{SLACK_PATH}?token=q-s3cret"
    messages = [
        f"Client error '404 Not Found' for url '{url}'",  # httpx
        f"404, message='Not Found', url=URL('{url}')",  # aiohttp
        f"Cannot redirect to {url.replace('q-s3cret', 'q%2Ds3cret')}",  # percent-encoded
        f"POST {SLACK_PATH} failed",
    ]
    for message in messages:
        scrubbed = config_module.without_url_secrets(message, url)
        for secret in (SLACK_SECRET, "pa55w0rd", "s3cret", "services"):
            assert secret not in scrubbed, (message, scrubbed)
    assert config_module.without_url_secrets(messages[0], url) == (
        "Client error '404 Not Found' for url 'https://hooks.slack.com'"
    )


def test_open_reads_are_off_unless_set() -> None:
    assert parse_config(None).api_open_reads is False
    assert parse_config({"apiOpenReads": True}).api_open_reads is True
    with pytest.raises(ConfigError, match="apiOpenReads: must be true or false, got 'yes'"):
        parse_config({"apiOpenReads": "yes"})


def test_the_p1_fence_is_off_and_the_resync_is_five_minutes_unless_set() -> None:
    default = parse_config(None)
    assert (default.p1_taint, default.resync_seconds, default.resolved_alert_clears) == (
        False,
        300.0,
        False,
    )
    config = parse_config({"p1Taint": True, "resyncSeconds": 30, "resolvedAlertClears": True})
    assert (config.p1_taint, config.resync_seconds, config.resolved_alert_clears) == (
        True,
        30.0,
        True,
    )
    with pytest.raises(ConfigError, match="resyncSeconds: must be between 1 and 86400, got 0"):
        parse_config({"resyncSeconds": 0})
    with pytest.raises(ConfigError, match="p1Taint: must be true or false, got 'on'"):
        parse_config({"p1Taint": "on"})


def test_a_misspelt_section_is_refused_naming_the_sections() -> None:
    # Before: the known keys listed the top-level values only, not the sections.
    with pytest.raises(ConfigError) as err:
        parse_config({"leaderElecton": {"enabled": False}})
    message = str(err.value)
    assert "leaderElecton: unknown key (known: " in message
    assert all(f"{name}," in message for name in ("deviceHealth", "leaderElection", "pools"))


@pytest.mark.parametrize(
    "kind",
    [
        Config,
        agent_config.AgentConfig,
        config_module.ConditionRule,
        config_module.NotificationSink,
        config_module.LeaderElection,
        config_module.DeviceHealthConfig,
        config_module.PoolsConfig,
        config_module.PoolConfig,
        config_module.HealthGateConfig,
        config_module.MaintenanceConfig,
        config_module.ApprovalConfig,
        config_module.RetentionConfig,
    ],
)
def test_every_field_of_the_config_is_a_key(kind: type[Any]) -> None:
    """A field declared without its parser could not be set from the document."""
    assert [f.name for f in dataclasses.fields(kind)] == [f.name for f in keys_of(kind).values()]
