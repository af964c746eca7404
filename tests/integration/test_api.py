"""The controller's HTTP API: auth, limits, bad input, manual triggers, alerts,
notifications, P1 escalation and config reload, on the real control plane.

Every controller these tests start has its whole log searched, after the test,
for the secrets it was given (the API token, webhook URLs' paths and passwords):
none may appear."""

from __future__ import annotations

import base64
import http.server
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Node

from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.nodes import delete_nodes, gpu_node, wait_nodes_ready
from gpuheal.sim.secretvolume import SecretVolume
from tests.corpus import GPU_UUIDS, dcgm_labels, unique_eks_node, unique_fqdn
from tests.corpus import alert as alert_of
from tests.corpus import webhook as webhook_of
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    faults_of,
    our_taint,
    record_of,
)
from tests.integration.test_failures import metric

pytestmark = pytest.mark.timeout(240)
TOKEN = "s3cret-token-for-tests"
# What the notification test configures, secrets all: a Slack webhook's path, a
# password and a query token in a sink's URL.
SLACK_SECRET = "XqZ7vN2kLp9RtY4wMb6c8dFg"
SLACK_PATH = f"/services/T0A1B2C3D/B0E4F5G6H/{SLACK_SECRET}"
SINK_PASSWORD = "pa55-w0rd-9f8e7d"
SINK_QUERY_TOKEN = "q-t0ken-4c3b2a"
SECRETS = (TOKEN, SLACK_SECRET, SLACK_PATH, SINK_PASSWORD, SINK_QUERY_TOKEN)


@pytest.fixture
def start_controller(start_controller: StartController) -> Iterator[StartController]:
    """The integration fixture's, and after the test: no secret in any log line."""
    started: list[ControllerProcess] = []

    def start(config: dict[str, Any], identity: str = "", **kwargs: Any) -> ControllerProcess:
        started.append(start_controller(config, identity, **kwargs))
        return started[-1]

    yield start
    for process in started:
        process.stop()  # its last lines too
        lines = process.log().splitlines()
        leaks = [(secret, line) for line in lines for secret in SECRETS if secret in line]
        print(f"{process.identity}: {len(lines)} log lines searched for {len(SECRETS)} secrets")
        assert leaks == [], f"{process.identity} logged a secret"


def call(
    controller: ControllerProcess,
    path: str,
    body: Any = None,
    *,
    token: str | None = TOKEN,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    method = "POST" if data is not None else "GET"
    request = urllib.request.Request(controller.url + path, data=data, method=method)  # noqa: S310
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


@pytest.fixture
def api_config(tmp_path: Path, pool: dict[str, str]) -> dict[str, Any]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    return controller_config(pool, apiTokenFile=str(token_file), apiMaxBodyBytes=4096)


def alert(
    node: str, *, status: str = "firing", fingerprint: str = "f1a2b3c4d5e6f7a8"
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": "GPUXidError", "Hostname": node, "severity": "critical"},
        "annotations": {"summary": "Xid 79"},
        "startsAt": "2026-11-29T10:00:00.000Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fingerprint,
    }


def webhook(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "gpuheal", "alerts": list(alerts)}


# What an Xid alerting rule adds to dcgm-exporter's series labels.
XID_RULE_LABELS = {"alertname": "GPUXidError", "severity": "critical"}


def test_posts_need_the_token_and_bad_input_is_refused_precisely(
    kube: Client,
    api_config: dict[str, Any],
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    controller = start_controller(api_config).wait_leading()
    body = {"node": node}
    for token in (None, "wrong", TOKEN[:-1], TOKEN + "x"):
        assert call(controller, "/api/v1/process", body, token=token) == (
            401,
            {"error": "unauthorized"},
        )
    code, answer = call(controller, "/api/v1/alerts", raw=b"x" * 5000)
    assert code == 413 and "4096" in answer["error"]
    code, answer = call(controller, "/api/v1/alerts", raw=b'{"version": "4", "status": ')
    assert code == 400 and "malformed JSON" in answer["error"]
    bad_shape = {"version": "4", "status": "firing", "alerts": [{"status": 1}]}
    code, answer = call(controller, "/api/v1/alerts", bad_shape)
    assert code == 400 and "$.alerts[0]" in answer["error"]
    code, answer = call(controller, "/api/v1/process", {"node": node, "action": "reboot"})
    assert code == 400 and "$.action" in answer["error"]
    assert call(controller, "/api/v1/process", {"node": node, "bogus": 1})[0] == 400
    assert call(controller, "/api/v1/faults?limit=0")[0] == 400
    time.sleep(1)
    assert faults_of(kube, node) == [] and our_taint(kube, node) is None  # nothing acted


def test_a_client_over_its_rate_gets_429(
    api_config: dict[str, Any], pool: dict[str, str], start_controller: StartController
) -> None:
    controller = start_controller({**api_config, "apiClientRatePerSecond": 1, "apiClientBurst": 3})
    controller.wait_leading()
    codes = [call(controller, "/api/v1/faults")[0] for _ in range(6)]
    assert codes[:3] == [200, 200, 200] and 429 in codes[3:]


def test_manual_trigger_acts_only_inside_the_node_selector(
    kube: Client,
    api_config: dict[str, Any],
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    (outsider,) = fake_gpu_nodes(1)  # a GPU node, but not in this controller's selector
    controller = start_controller(api_config).wait_leading()
    assert call(controller, "/api/v1/process", {"node": outsider})[0] == 403
    assert call(controller, "/api/v1/process", {"node": "no-such-node"})[0] == 404
    code, answer = call(
        controller, "/api/v1/process", {"node": node, "reason": "BadFan", "faultID": "m-1"}
    )
    assert code == 202 and answer == {"node": node, "faultId": "m-1", "new": True}
    wait_for("the taint", lambda: our_taint(kube, node) == "m-1")
    assert call(controller, "/api/v1/process", {"node": node, "faultID": "m-1"})[1]["new"] is False

    def listed() -> list[dict[str, Any]]:  # the record follows its taint by a turn of the queue
        code, answer = call(controller, f"/api/v1/faults?node={node}")
        assert code == 200, answer
        faults: list[dict[str, Any]] = answer["faults"]
        return faults

    (fault,) = wait_for("the fault listed", listed)
    assert (fault["faultId"], fault["source"], fault["reason"]) == ("m-1", "manual", "BadFan")
    assert call(controller, "/api/v1/process", {"node": node, "action": "clear"}) == (
        200,
        {"node": node, "cleared": 1},
    )
    wait_for("recovery", lambda: our_taint(kube, node) is None)
    assert our_taint(kube, outsider) is None


def test_alerts_collapse_repeats_skip_unknown_nodes_and_never_act_when_resolved(
    kube: Client,
    api_config: dict[str, Any],
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    start_controller: StartController,
) -> None:
    node, other = fake_gpu_nodes(2, labels=pool)
    controller = start_controller(api_config).wait_leading()
    code, answer = call(
        controller, "/api/v1/alerts", webhook(alert(node), alert("nowhere", fingerprint="0" * 16))
    )
    assert code == 200
    assert [a["node"] for a in answer["accepted"]] == [node]
    assert answer["skipped"][0]["reason"] == "no managed node matches Hostname=nowhere"
    for _ in range(20):
        code, answer = call(controller, "/api/v1/alerts", webhook(alert(node)))
        assert code == 200 and len(answer["duplicates"]) == 1
    wait_for("the taint", lambda: our_taint(kube, node) is not None)
    resolved = call(
        controller, "/api/v1/alerts", webhook(alert(other, status="resolved", fingerprint="1" * 16))
    )
    assert resolved[0] == 200 and len(resolved[1]["resolved"]) == 1
    time.sleep(1)
    assert len(faults_of(kube, node)) == 1
    assert faults_of(kube, other) == [] and our_taint(kube, other) is None
    metrics = controller.metrics()
    assert 'gpuheal_alerts_total{result="accepted"} 1.0' in metrics
    assert 'gpuheal_alerts_total{result="duplicate"} 20.0' in metrics
    assert 'gpuheal_alerts_total{result="skipped"} 1.0' in metrics
    # 21 posts of one alert: 20 repeats, each stopped once, where the intake holds it.
    assert metric(controller, 'gpuheal_duplicates_suppressed_total{layer="signal"}') == 20


def test_an_xid_named_by_an_alert_or_a_person_is_the_catalogues_whatever_its_severity(
    kube: Client,
    api_config: dict[str, Any],
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    start_controller: StartController,
) -> None:
    """Before: an alert was as severe as its `severity` label said, and an Xid rule
    labelled critical drained the node of a user program's Xid 13; a manual request
    could not name an Xid."""
    by_alert, by_person, spared = fake_gpu_nodes(3, labels=pool)
    config = {**api_config, "xid": {31: {"reason": "Xid31OnOurFleet", "severity": "P0"}}}
    controller = start_controller(config).wait_leading()
    rule = XID_RULE_LABELS  # severity: critical
    body = webhook_of([
        alert_of(dcgm_labels(spared) | rule | {"xid": "13"}, fingerprint="13" * 8),
        alert_of(dcgm_labels(spared, 1) | rule | {"xid": "43"}, fingerprint="43" * 8),
        alert_of(dcgm_labels(by_alert) | rule | {"xid": "31"}, fingerprint="31" * 8),
        alert_of(dcgm_labels(spared, 2) | rule | {"xid": "x13"}, fingerprint="99" * 8),
    ])  # fmt: skip
    for _ in range(3):  # Alertmanager's repeats
        code, answer = call(controller, "/api/v1/alerts", body)
        assert code == 200, answer
    assert [(a["xid"], a["kind"]) for a in answer["duplicates"] if "xid" in a] == [
        (13, "application"), (43, "informational")
    ]  # fmt: skip
    assert [a["reason"].split(":")[0] for a in answer["skipped"]] == ["$.alerts[3].labels.xid"]
    code, answer = call(controller, "/api/v1/process", {"node": spared, "xid": 31 + 1})
    assert code == 200 and answer == {
        "node": spared, "xid": 32, "quarantine": False, "kind": "application",
        "reason": "XidApplication32", "nvidia": "RESTART_APP",
    }  # fmt: skip
    detail = "pid=2843, name=python3, GPU has fallen off the bus."
    code, answer = call(controller, "/api/v1/process", {"node": by_person, "xid": 79,
                                                         "detail": detail})  # fmt: skip
    assert code == 202 and (answer["reason"], answer["severity"]) == ("XidCritical79", "P0")
    wrongs: list[tuple[dict[str, Any], str]] = [
        ({"xid": 79, "severity": "P2"}, "$.severity"),
        ({"xid": 79, "reason": "Mine"}, "$.reason"),
        ({"xid": 0}, "$.xid"),
        ({"detail": detail}, "$.detail"),
        ({"xid": 79, "action": "clear"}, "$.xid"),
        ({"xid": "79"}, "xid"),
    ]
    for wrong, field in wrongs:
        code, answer = call(controller, "/api/v1/process", {"node": spared, **wrong})
        assert code == 400 and field in answer["error"], (wrong, answer)
    wait_for("the taints", lambda: our_taint(kube, by_alert) and our_taint(kube, by_person))
    record = record_of(kube, by_alert)
    assert (record.spec["reason"], record.spec["severity"]) == ("Xid31OnOurFleet", "P0")
    time.sleep(2)
    assert our_taint(kube, spared) is None and faults_of(kube, spared) == []
    metrics = controller.metrics()
    for source, xid, kind in (("alertmanager", 13, "application"),
                              ("alertmanager", 43, "informational"), ("manual", 32, "application")):  # fmt: skip
        line = f'gpuheal_xids_observed_total{{kind="{kind}",source="{source}",xid="{xid}"}} 1.0'
        assert line in metrics, line
    assert 'gpuheal_alerts_total{result="observed"} 2.0' in metrics
    assert 'gpuheal_alerts_total{result="invalid"} 3.0' in metrics


def test_a_notification_sink_gets_one_message_per_remediation_step(
    kube: Client,
    api_config: dict[str, Any],
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    start_controller: StartController,
    sink: tuple[str, list[dict[str, Any]]],
) -> None:
    url, received = sink
    (node,) = fake_gpu_nodes(1, labels=pool)
    controller = start_controller(
        {**api_config, "notificationSinks": [{"url": url}]}
    ).wait_leading()
    call(controller, "/api/v1/process", {"node": node, "faultID": "n-1"})
    wait_for("handled", lambda: any("MarkHandled" in m["actions"] for m in received))
    time.sleep(1)
    assert len(received) == 1
    (message,) = received
    assert message["node"] == node and message["faultId"] == "n-1"
    assert {"CreateRecord", "AddTaint", "MarkHandled"} <= set(message["actions"])
    assert message["summary"] == f"{node}: ManualRequest — detected, tainted NoSchedule, drained"


def test_a_p1_fault_waits_for_its_observation_window_before_acting(
    kube: Client,
    api_config: dict[str, Any],
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    controller = start_controller({**api_config, "p1EscalationSeconds": 3}).wait_leading()
    started = time.monotonic()
    call(controller, "/api/v1/process", {"node": node, "severity": "P1", "faultID": "p1"})
    wait_for("the record", lambda: faults_of(kube, node))
    assert our_taint(kube, node) is None
    wait_for("escalation to P0", lambda: our_taint(kube, node) == "p1", timeout_s=30)
    elapsed = time.monotonic() - started
    print(f"P1 escalated after {elapsed:.2f}s (window 3s)")
    assert elapsed >= 2.5


def test_sighup_switches_from_observe_to_full_without_a_restart(
    kube: Client,
    api_config: dict[str, Any],
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    controller = start_controller({**api_config, "mode": "observe"}).wait_leading()
    call(controller, "/api/v1/process", {"node": node, "faultID": "staged"})
    wait_for("the record", lambda: faults_of(kube, node))
    time.sleep(1)
    assert our_taint(kube, node) is None  # observe: recorded, not acted on
    config = yaml.safe_load(controller.config_path.read_text())
    controller.config_path.write_text(yaml.safe_dump({**config, "mode": "full"}))
    controller.hangup()
    wait_for("the taint after the reload", lambda: our_taint(kube, node) == "staged", timeout_s=20)
    assert '"msg": "config reloaded"' in controller.log()
    # A broken config is refused and the running one kept.
    controller.config_path.write_text("mode: [broken\n")
    controller.hangup()
    wait_for("the refusal", lambda: "config reload refused" in controller.log())
    assert call(controller, "/api/v1/faults")[0] == 200


# -- values the API cannot carry, and names as real fleets have them ---------------


@pytest.fixture
def named_nodes(kube: Client) -> Iterator[Callable[..., str]]:
    """Factory: a Ready fake GPU node with this name (any valid node name) and, if
    given, these InternalIPs; deleted after the test."""
    created: list[str] = []

    def make(name: str, labels: dict[str, str], internal_ips: tuple[str, ...] = ()) -> str:
        host = name.split(".", 1)[0][:63]  # the kubelet's hostname label: 63 characters
        manifest = gpu_node(name, labels={**labels, "kubernetes.io/hostname": host})
        if internal_ips:
            # Hostname too: kwok's node-initialize stage rewrites the list when either is missing.
            manifest["status"]["addresses"] = [
                *({"type": "InternalIP", "address": ip} for ip in internal_ips),
                {"type": "Hostname", "address": host},
            ]
        kube.create(codecs.from_dict(manifest))
        created.append(name)
        wait_nodes_ready(kube, [name])
        return name

    yield make
    delete_nodes(kube, created)


def post_raw(controller: ControllerProcess, path: str, head: bytes, body: bytes) -> bytes:
    """One request from raw bytes (headers no HTTP client would send); the raw response."""
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n".encode()
        + head
        + b"\r\n\r\n"
        + body
    )
    with socket.create_connection(("127.0.0.1", controller.port), timeout=10) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_a_token_that_is_not_utf8_is_refused_like_any_wrong_token(
    api_config: dict[str, Any],
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    controller = start_controller(api_config).wait_leading()
    body = json.dumps({"node": node}).encode()
    for header in (
        b"Authorization: Bearer \xff\xfe" + TOKEN.encode(),
        b"Authorization: Bearer " + TOKEN.encode() + b"\xc3(",
        b"Authorization: B\xe9arer " + TOKEN.encode(),
        b"Authorization: Bearer s3cr\xe9t-token-for-tests",
    ):
        answer = post_raw(controller, "/api/v1/process", header, body)
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
        assert answer.endswith(b'{"error": "unauthorized"}'), answer[-200:]
    assert call(controller, "/api/v1/process", {"node": node})[0] == 202  # the right token works
    assert "Traceback" not in controller.log()


# Each bad manual request, the field its 400 must name. Values the GPUFault record
# (or a person reading it back) cannot carry.
BAD_MANUAL_REQUESTS: list[tuple[dict[str, Any], str]] = [
    ({"faultID": "f" * 300}, "$.faultID"),
    ({"faultID": "f" * 257}, "$.faultID"),
    ({"faultID": "xid 79 on gpu 3"}, "$.faultID"),
    ({"faultID": "xid79\tgpu3"}, "$.faultID"),
    ({"faultID": "xid79\ngpu3"}, "$.faultID"),
    ({"faultID": "xid79\x00"}, "$.faultID"),
    ({"faultID": "xid79\u200bgpu3"}, "$.faultID"),
    ({"faultID": "xid79\u00a0gpu3"}, "$.faultID"),
    ({"faultID": " xid79"}, "$.faultID"),
    ({"faultID": "xid79\u2028"}, "$.faultID"),
    ({"faultID": "\x1b[31mred"}, "$.faultID"),
    ({"faultID": "xid79", "action": "clear", "reason": "r" * 300}, "$.reason"),
    ({"reason": "r" * 300}, "$.reason"),
    ({"reason": "fan\nfailure"}, "$.reason"),
    ({"reason": ""}, "$.reason"),
    ({"reason": " padded "}, "$.reason"),
    ({"reason": "bell\x07"}, "$.reason"),
    ({"node": "n" * 300}, "$.node"),
    ({"node": ""}, "$.node"),
    ({"node": "Not_A_Node"}, "$.node"),
    ({"node": "ip-10-0-12-34.us-west-2.compute.internal\n"}, "$.node"),
    ({"action": "clear", "faultID": "bad id"}, "$.faultID"),
]


def test_values_the_record_cannot_carry_get_400_naming_the_field_and_change_nothing(
    kube: Client,
    api_config: dict[str, Any],
    pool: dict[str, str],
    named_nodes: Callable[..., str],
    start_controller: StartController,
) -> None:
    node = named_nodes(unique_eks_node(), pool)
    controller = start_controller(api_config).wait_leading()
    misbehaved = []
    for change, field in BAD_MANUAL_REQUESTS:
        code, answer = call(controller, "/api/v1/process", {"node": node, **change})
        if code != 400 or not str(answer.get("error", "")).startswith(f"invalid request: {field}:"):
            misbehaved.append((change, code, answer))
    print(f"{len(BAD_MANUAL_REQUESTS)} bad manual requests, {len(misbehaved)} misbehaved")
    assert misbehaved == []
    # At the limits, and in any script: carried as given.
    code, answer = call(
        controller, "/api/v1/process", {"node": node, "faultID": "温度-故障/7", "reason": "r" * 256}
    )
    assert code == 202 and answer["faultId"] == "温度-故障/7"
    wait_for("the quarantine", lambda: our_taint(kube, node) is not None)
    # The taint is written first, its record just after (Plan.steps).
    (record,) = wait_for("its record", lambda: faults_of(kube, node))
    assert record.spec["faultID"] == "温度-故障/7" and record.spec["reason"] == "r" * 256
    assert "Traceback" not in controller.log()


def test_an_alert_that_cannot_be_carried_is_skipped_and_the_rest_of_its_group_is_taken(
    kube: Client,
    api_config: dict[str, Any],
    pool: dict[str, str],
    named_nodes: Callable[..., str],
    start_controller: StartController,
) -> None:
    faulty, other = (named_nodes(unique_eks_node(), pool) for _ in range(2))
    controller = start_controller({**api_config, "apiMaxBodyBytes": 1 << 20}).wait_leading()
    long_reason = "DcgmXidError" + "-retired-pages" * 30  # a label value: no length limit
    body = webhook_of([
        alert_of(
            dcgm_labels(faulty, 3) | XID_RULE_LABELS | {"gpuheal_reason": long_reason},
            fingerprint="3f9c2a1b7d0e4c55",
        ),
        alert_of(
            dcgm_labels(other) | XID_RULE_LABELS,
            starts_at="2026-12-01T02:30:12." + "1" * 80 + "Z",
            fingerprint="0a1b2c3d4e5f6a7b",
        ),
        alert_of(dcgm_labels(other, 1) | XID_RULE_LABELS, starts_at="yesterday"),
    ])  # fmt: skip
    code, answer = call(controller, "/api/v1/alerts", body)
    assert code == 200, answer  # not 400: Alertmanager would retry the whole group forever
    assert [a["node"] for a in answer["accepted"]] == [faulty]
    assert [a["reason"].split(":", 1)[0] for a in answer["skipped"]] == [
        "$.alerts[1].startsAt",
        "$.alerts[2].startsAt",
    ]
    wait_for("the quarantine", lambda: our_taint(kube, faulty) is not None)
    # The taint is written first, its record just after (Plan.steps).
    (record,) = wait_for("its record", lambda: faults_of(kube, faulty))
    assert record.spec["reason"] == long_reason[:255] + "…"
    assert record.spec["devices"] == [GPU_UUIDS[3]]
    metrics = controller.metrics()
    assert 'gpuheal_alerts_total{result="invalid"} 2.0' in metrics
    assert 'gpuheal_alerts_total{result="accepted"} 1.0' in metrics
    assert controller.log().count("alerts skipped: values that cannot be carried") == 1
    time.sleep(1)
    assert faults_of(kube, other) == [] and our_taint(kube, other) is None


def test_an_alert_naming_its_node_by_an_ipv6_scrape_target_quarantines_that_node(
    kube: Client,
    api_config: dict[str, Any],
    pool: dict[str, str],
    named_nodes: Callable[..., str],
    start_controller: StartController,
) -> None:
    """dcgm-exporter on the host network of a dual-stack node, scraped over IPv6:
    only `instance` names the node."""
    v6 = named_nodes(unique_eks_node(), pool, ("10.0.12.34", "fd00::5"))
    v4 = named_nodes(unique_eks_node(), pool, ("10.0.12.35",))
    assert "fd00::5" in {a.address for a in kube.get(Node, v6).status.addresses}  # type: ignore[union-attr]
    controller = start_controller(api_config).wait_leading()
    labels = [
        {k: v for k, v in dcgm_labels(node).items() if k != "Hostname"}
        | XID_RULE_LABELS
        | {"instance": instance}
        for node, instance in ((v6, "[fd00::5]:9400"), (v4, "10.0.12.35:9400"))
    ]
    body = webhook_of([alert_of(labels[0]), alert_of(labels[1], fingerprint="77e1c9d32b4f6e80")])
    code, answer = call(controller, "/api/v1/alerts", body)
    assert code == 200 and sorted(a["node"] for a in answer["accepted"]) == sorted([v6, v4])
    wait_for("both quarantined", lambda: our_taint(kube, v6) and our_taint(kube, v4))


def test_a_node_with_a_253_character_name_is_quarantined_through_the_api(
    kube: Client,
    api_config: dict[str, Any],
    pool: dict[str, str],
    named_nodes: Callable[..., str],
    start_controller: StartController,
) -> None:
    by_hand, by_alert = (named_nodes(unique_fqdn(253), pool) for _ in range(2))
    assert len(by_hand) == len(by_alert) == 253
    controller = start_controller(api_config).wait_leading()
    code, answer = call(controller, "/api/v1/process", {"node": by_hand, "reason": "BadFan"})
    assert code == 202 and answer["node"] == by_hand
    assert len(answer["faultId"]) <= 63  # a fault id we make fits a taint value as is
    body = webhook_of([alert_of(dcgm_labels(by_alert) | XID_RULE_LABELS)])
    code, answer = call(controller, "/api/v1/alerts", body)
    assert code == 200 and [a["node"] for a in answer["accepted"]] == [by_alert]
    wait_for("both quarantined", lambda: our_taint(kube, by_hand) and our_taint(kube, by_alert))
    code, listed = call(controller, f"/api/v1/faults?node={by_hand}")
    assert code == 200 and [f["node"] for f in listed["faults"]] == [by_hand]
    assert call(controller, "/api/v1/process", {"node": by_hand, "action": "clear"})[1] == {
        "node": by_hand,
        "cleared": 1,
    }
    wait_for("recovery", lambda: our_taint(kube, by_hand) is None)
    assert "Traceback" not in controller.log()


# -- the token's lifecycle, who may read, who spends whose budget, what is logged -----


def empty_webhook() -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "gpuheal", "alerts": []}


def test_a_rotated_token_is_taken_without_a_restart(
    tmp_path: Path, pool: dict[str, str], start_controller: StartController
) -> None:
    old, new, newer = "0ld-Alertmanager-t0ken", "n3w-Alertmanager-t0ken", "n3wer-t0ken-f0r-AM"
    volume = SecretVolume(tmp_path / "api-token", {"token": old + "\n"})
    controller = start_controller(
        controller_config(pool, apiTokenFile=str(volume.path("token")))
    ).wait_leading()
    pid = controller.component.pid
    assert call(controller, "/api/v1/alerts", empty_webhook(), token=old)[0] == 200
    assert call(controller, "/api/v1/alerts", empty_webhook(), token=new)[0] == 401

    # The Secret updated: the kubelet swaps the volume's ..data link to new content.
    volume.update({"token": new + "\n"})
    swapped = time.monotonic()
    wait_for(
        "the new token accepted",
        lambda: call(controller, "/api/v1/alerts", empty_webhook(), token=new)[0] == 200,
        timeout_s=10,
    )
    print(f"new token accepted {time.monotonic() - swapped:.1f}s after the swap")
    assert call(controller, "/api/v1/alerts", empty_webhook(), token=old)[0] == 401

    # One token a line: both accepted while the senders switch, then only the newer.
    volume.update({"token": f"{new}\n{newer}\n"})
    wait_for("both", lambda: call(controller, "/api/v1/faults", token=newer)[0] == 200, 10)
    assert call(controller, "/api/v1/faults", token=new)[0] == 200
    volume.update({"token": newer})
    wait_for("only the newer", lambda: call(controller, "/api/v1/faults", token=new)[0] == 401, 10)
    assert call(controller, "/api/v1/faults", token=newer)[0] == 200
    assert controller.component.pid == pid and controller.component.exit_code() is None
    assert controller.log().count('"msg": "API tokens read"') == 4  # start + three swaps
    for token in (old, new, newer):
        assert token not in controller.log()


def test_requests_without_the_token_cannot_spend_the_budget_of_a_sender_with_it(
    api_config: dict[str, Any], start_controller: StartController
) -> None:
    controller = start_controller({**api_config, "apiClientRatePerSecond": 1, "apiClientBurst": 3})
    controller.wait_leading()
    # Before: three refused POSTs from the address (behind SNAT: anyone's) made the
    # next one, with the token, get 429.
    for _ in range(3):
        assert call(controller, "/api/v1/alerts", empty_webhook(), token=None)[0] == 401
    assert call(controller, "/api/v1/alerts", empty_webhook())[0] == 200
    # A flood without the token meets its own small budget; the token's is untouched.
    codes = [
        call(controller, "/api/v1/alerts", empty_webhook(), token="guess")[0] for _ in range(20)
    ]
    assert set(codes) == {401, 429} and codes[0] == 401
    assert call(controller, "/api/v1/alerts", empty_webhook())[0] == 200
    assert call(controller, "/api/v1/faults")[0] == 200
    # The token's budget is its own: spent by its own requests only.
    assert 429 in [call(controller, "/api/v1/faults")[0] for _ in range(4)]


def test_fault_data_needs_the_token_unless_reads_are_opened(
    api_config: dict[str, Any], start_controller: StartController
) -> None:
    controller = start_controller(api_config).wait_leading()
    # Before: 200 with every fault's node and evicted pods, for anyone.
    assert call(controller, "/api/v1/faults", token=None) == (401, {"error": "unauthorized"})
    assert call(controller, "/api/v1/faults", token="wrong")[0] == 401
    assert call(controller, "/api/v1/faults") == (200, {"faults": []})
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.yaml"):
        with urllib.request.urlopen(controller.url + path, timeout=5) as response:  # noqa: S310
            assert response.status == 200, path

    # For a trusted network: reads opened by config, reloaded without a restart.
    controller.config_path.write_text(yaml.safe_dump({**api_config, "apiOpenReads": True}))
    controller.hangup()
    wait_for("reads opened", lambda: call(controller, "/api/v1/faults", token=None)[0] == 200)
    assert call(controller, "/api/v1/alerts", empty_webhook(), token=None)[0] == 401


class _SecretSink(http.server.BaseHTTPRequestHandler):
    """Takes JSON on any path but a Slack-shaped one, which fails (so the
    controller, giving up on it, logs the failure)."""

    received: list[tuple[str, str, dict[str, Any]]]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length))
        self.received.append((self.path, self.headers.get("Authorization", ""), body))
        self.send_response(500 if self.path.startswith("/services/") else 204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_no_secret_reaches_the_log(
    api_config: dict[str, Any],
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    start_controller: StartController,
) -> None:
    received: list[tuple[str, str, dict[str, Any]]] = []
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), type("Sink", (_SecretSink,), {"received": received})
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_port}"
    sinks = [
        {"url": f"{origin}{SLACK_PATH}", "format": "slack"},
        {"url": f"http://gpuheal:{SINK_PASSWORD}@127.0.0.1:{server.server_port}/hook?token={SINK_QUERY_TOKEN}"},
    ]  # fmt: skip
    (node,) = fake_gpu_nodes(1, labels=pool)
    config = {**api_config, "notificationSinks": sinks}
    try:
        controller = start_controller(config).wait_leading()
        for token in (None, "wrong", TOKEN + "x", TOKEN):
            call(controller, "/api/v1/process", {"node": node, "faultID": "s-1"}, token=token)
        # The Slack sink fails 5 times (backoff 1, 2, 4, 8 s): then one warning.
        wait_for("the failure logged", lambda: "notification failed" in controller.log(), 40)
        assert any(path == "/hook?token=" + SINK_QUERY_TOKEN for path, _, _ in received)
        basic = base64.b64encode(f"gpuheal:{SINK_PASSWORD}".encode()).decode()
        assert any(auth == f"Basic {basic}" for _, auth, _ in received)  # the URL was used
        # A typo on reload: PyYAML quotes the broken line, here the webhook's.
        controller.config_path.write_text(
            f"nodeSelector: {json.dumps(pool)}\nnotificationSinks:\n"
            f"  - url: {origin}{SLACK_PATH} format: slack\n"
        )
        controller.hangup()
        wait_for("the reload refused", lambda: "config reload refused" in controller.log())
    finally:
        server.shutdown()
    (failed,) = [json.loads(line) for line in controller.log().splitlines()
                 if "notification failed" in line]  # fmt: skip
    assert failed["sink"] == origin and failed["error"] == "HTTP 500"
    # ... and the fixture searches every line of the log for every secret.
