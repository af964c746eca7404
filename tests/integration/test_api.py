"""The controller's HTTP API: auth, limits, bad input, manual triggers, alerts,
notifications, P1 escalation and config reload, on the real control plane."""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client

from gpuheal.sim.controller import ControllerProcess
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import StartController, controller_config, faults_of, our_taint

pytestmark = pytest.mark.timeout(240)
TOKEN = "s3cret-token-for-tests"


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
    code, listed = call(controller, f"/api/v1/faults?node={node}")
    assert code == 200 and [f["faultId"] for f in listed["faults"]] == ["m-1"]
    assert listed["faults"][0]["source"] == "manual" and listed["faults"][0]["reason"] == "BadFan"
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


class _Sink(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.received.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def sink() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    handler = type("Sink", (_Sink,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", received
    server.shutdown()


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
