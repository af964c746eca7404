"""What the agent reaches, end to end on the real control plane: a node whose agent
cannot load NVML or read the kernel log says why within one probe interval — its
GPUHealthy condition's reason, the agent-access annotation, the metrics, the
chart's alert in real Prometheus, `gpuheal doctor` and `gpuheal status` — and none
of it is a fault: nothing is reported, nothing drained."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client

from gpuheal.cli import main
from gpuheal.model import AGENT_ACCESS, STATUS
from gpuheal.policy import access
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.monitoring import Monitoring
from tests.helpers import FakeNodes, wait_for
from tests.integration.chart import alert_rules, firing
from tests.integration.conftest import gpu_healthy, node_annotations

pytestmark = pytest.mark.timeout(240)

INTERVAL_S = 1.0


@pytest.fixture
def new_agent(
    control_plane: ControlPlane, tmp_path: Path, agents: list[AgentProcess]
) -> Callable[..., AgentProcess]:
    """Factory: the agent of a node, probing every INTERVAL_S, not started yet
    (stopped after the test, as `agents` are)."""

    def make(node: str, config: dict[str, Any] | None = None) -> AgentProcess:
        agent = AgentProcess(
            tmp_path,
            control_plane.kubeconfig,
            node,
            {"intervalSeconds": INTERVAL_S, **(config or {})},
        )
        agents.append(agent)
        return agent

    return make


def scrape(agent: AgentProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def doctor(
    control_plane: ControlPlane, capsys: pytest.CaptureFixture[str], node: str
) -> dict[str, str]:
    capsys.readouterr()
    main(["doctor", node, "--kubeconfig", str(control_plane.kubeconfig), "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    return {f["kind"]: f["severity"] for q in report["questions"] for f in q["findings"]}


def status(control_plane: ControlPlane, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    main(["status", "--kubeconfig", str(control_plane.kubeconfig), "-o", "json"])
    return dict(json.loads(capsys.readouterr().out))


def scraping(agent: AgentProcess, rules: list[dict[str, Any]], tmp_path: Path) -> Monitoring:
    """A real Prometheus scraping the agent as the chart's PodMonitor does (job
    gpuheal-agent), evaluating `rules`; Alertmanager sends nowhere."""
    token = tmp_path / "token"
    token.write_text("unused\n")
    return Monitoring(
        tmp_path / "monitoring", targets=[f"127.0.0.1:{agent.port}"], rules=rules,
        webhook_url="http://127.0.0.1:9/unused", token_file=token, job="gpuheal-agent",
    ).start()  # fmt: skip


def test_no_nvml_and_no_kernel_log_say_why_within_one_interval_and_alert(
    kube: Client,
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    fake_gpu_nodes: FakeNodes,
    new_agent: Callable[..., AgentProcess],
    tmp_path: Path,
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = new_agent(node, {"kmsgPath": str(tmp_path / "no-such-kmsg")})
    agent.spec_path.unlink()  # no libnvidia-ml: nvmlInit answers LIBRARY_NOT_FOUND
    agent.start()
    ready = time.monotonic()
    wait_for(
        "the reason on the condition",
        lambda: gpu_healthy(kube, node)[1] == access.NVML_LIBRARY_NOT_FOUND,
        timeout_s=30,
    )
    took = time.monotonic() - ready
    # The first round runs as the agent serves /metrics; the kernel log's thread may
    # open (and fail) after it, so its reason may take the second round.
    assert took <= INTERVAL_S * 2 + 1, f"{took:.1f}s to say why"
    state, _, message = gpu_healthy(kube, node)
    assert state == "Unknown"
    assert "libnvidia-ml.so.1" in message and "NVML unavailable" in message
    wait_for(
        "both pieces in the annotation",
        lambda: (
            node_annotations(kube, node).get(AGENT_ACCESS)
            == "nvml=library-not-found;gpus=?/8;kmsg=unreadable"
        ),
    )
    assert STATUS not in node_annotations(kube, node)  # no fault reported

    text = scrape(agent)
    assert "gpuheal_agent_nvml_up 0.0" in text and "gpuheal_agent_kmsg_readable 0.0" in text
    assert 'gpuheal_agent_access_problem{reason="NvmlLibraryNotFound"} 1.0' in text
    assert 'gpuheal_agent_access_problem{reason="KernelLogUnreadable"} 1.0' in text
    assert 'gpuheal_agent_access_problem{reason="NoGpusVisible"} 0.0' in text

    found = doctor(control_plane, capsys, node)
    assert found["agent-nvml-library-not-found"] == "bad"
    assert found["agent-kernel-log-unreadable"] == "warn"
    assert "gpu-health-unknown" not in found  # the access findings say it
    listed = {a["node"]: a for a in status(control_plane, capsys)["agentAccess"]}
    assert listed[node]["problems"] == [access.NVML_LIBRARY_NOT_FOUND, access.KERNEL_LOG_UNREADABLE]

    # The chart's rules as they render, `for` made seconds, in real Prometheus.
    rules = alert_rules(control_plane, "gpuheal-agent")
    monitoring = scraping(agent, rules, tmp_path)

    def firing_now() -> set[tuple[str, str]]:
        return firing(monitoring.prometheus_url)

    try:
        wait_for(
            "both alerts firing",
            lambda: (
                firing_now()
                == {
                    ("GPUHealAgentCannotSeeGPUs", "NvmlLibraryNotFound"),
                    ("GPUHealAgentKernelLogUnreadable", "KernelLogUnreadable"),
                }
            ),
            timeout_s=60,
        )
        # NVML arrives (the runtime class fixed, the pod restarted or the driver loaded):
        # the reason goes, the condition is True, the NVML alert resolves.
        agent.write_spec()
        wait_for(
            "NVML loaded",
            lambda: gpu_healthy(kube, node)[:2] == ("True", access.KERNEL_LOG_UNREADABLE),
        )
        value = node_annotations(kube, node)[AGENT_ACCESS]
        assert value.startswith(
            "nvml=ok;gpus=8/8;kmsg=unreadable;driver=550.54.15;nvml-version=12.550.54.15"
        )
        wait_for(
            "only the kernel log's alert",
            lambda: firing_now() == {("GPUHealAgentKernelLogUnreadable", "KernelLogUnreadable")},
            timeout_s=60,
        )
    finally:
        monitoring.stop()
    # Logged at start and on every change (the expected count arrives with the Node).
    logged = [json.loads(line) for line in agent.log().splitlines() if '"agent access"' in line]
    said = [e["problems"] for e in logged]
    changes = [p for i, p in enumerate(said) if i == 0 or p != said[i - 1]]
    both = [access.NVML_LIBRARY_NOT_FOUND, access.KERNEL_LOG_UNREADABLE]
    assert changes in (
        [both, [access.KERNEL_LOG_UNREADABLE]],
        # the first round before the kernel log's thread failed to open it
        [[access.NVML_LIBRARY_NOT_FOUND], both, [access.KERNEL_LOG_UNREADABLE]],
    ), logged
    assert [e["level"] for e in logged] == ["warning"] * len(logged)


def test_nvml_that_sees_no_gpu_on_a_node_offering_eight_is_unknown_not_a_fault(
    kube: Client, fake_gpu_nodes: FakeNodes, new_agent: Callable[..., AgentProcess]
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = new_agent(node, {"failRounds": 1})
    agent.spec["devices"] = []  # NVIDIA_VISIBLE_DEVICES not honoured: no device in the container
    agent.write_spec()
    agent.start()
    wait_for(
        "NoGpusVisible", lambda: gpu_healthy(kube, node)[:2] == ("Unknown", access.NO_GPUS_VISIBLE)
    )
    assert "the node offers 8" in gpu_healthy(kube, node)[2]
    time.sleep(INTERVAL_S * 3)  # failRounds: 1, and still no fault
    assert STATUS not in node_annotations(kube, node)
    assert node_annotations(kube, node)[AGENT_ACCESS].startswith("nvml=ok;gpus=0/8;kmsg=ok")


def test_a_healthy_agent_says_what_it_reaches(
    kube: Client,
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    fake_gpu_nodes: FakeNodes,
    new_agent: Callable[..., AgentProcess],
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = new_agent(node).start()
    wait_for("healthy", lambda: gpu_healthy(kube, node)[:2] == ("True", "GPUsHealthy"))
    wait_for("the access fact", lambda: AGENT_ACCESS in node_annotations(kube, node))
    reach = access.decode(node_annotations(kube, node)[AGENT_ACCESS])
    assert reach is not None and access.problems(reach) == ()
    assert (reach.nvml, reach.gpus, reach.expected, reach.kernel_log) == ("ok", 8, 8, "ok")
    assert doctor(control_plane, capsys, node)["agent-access"] == "ok"
    assert node not in {a["node"] for a in status(control_plane, capsys)["agentAccess"]}
    assert "gpuheal_agent_nvml_up 1.0" in scrape(agent)


def test_the_agent_alerts_stay_silent_on_a_healthy_agent_and_one_fires_when_it_dies(
    kube: Client,
    control_plane: ControlPlane,
    fake_gpu_nodes: FakeNodes,
    new_agent: Callable[..., AgentProcess],
    tmp_path: Path,
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = new_agent(node).start()
    wait_for("healthy", lambda: gpu_healthy(kube, node)[:2] == ("True", "GPUsHealthy"))
    rules = alert_rules(control_plane, "gpuheal-agent")
    assert {r["alert"] for r in rules} >= {"GPUHealAgentDown", "GPUHealAgentStuck"}
    monitoring = scraping(agent, rules, tmp_path)
    try:

        def evaluated() -> bool:
            url = f"{monitoring.prometheus_url}/api/v1/rules?type=alert"
            with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310
                groups = json.load(response)["data"]["groups"]
            states = [r["state"] for g in groups for r in g["rules"]]
            return len(states) == len(rules) and all(s == "inactive" for s in states)

        wait_for("every rule evaluated", evaluated, timeout_s=30)
        time.sleep(8)  # longer than `for`, and scraped meanwhile
        assert firing(monitoring.prometheus_url) == set()  # a healthy agent pages nobody
        agent.kill()
        wait_for(
            "GPUHealAgentDown",
            lambda: ("GPUHealAgentDown", "") in firing(monitoring.prometheus_url),
            timeout_s=60,
        )
    finally:
        monitoring.stop()


def test_the_usage_alerts_name_a_full_gpu_and_a_stalled_one_and_fault_nothing(
    kube: Client,
    control_plane: ControlPlane,
    fake_gpu_nodes: FakeNodes,
    new_agent: Callable[..., AgentProcess],
    tmp_path: Path,
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = new_agent(node, {"processReportSeconds": 0.5})
    devices = agent.spec["devices"]
    devices[1].update(utilization=0, processes=[{"pid": 4242, "usedMemoryMiB": 1024}])  # stalled
    devices[2].update(utilization=97, processes=[{"pid": 4243, "usedMemoryMiB": 78_000}])  # full
    devices[3].update(utilization=55, processes=[{"pid": 4244, "usedMemoryMiB": 2048}])  # working
    agent.write_spec()
    agent.start()
    wait_for("healthy", lambda: gpu_healthy(kube, node)[:2] == ("True", "GPUsHealthy"))
    usage = {"GPUHealGPUMemoryHigh", "GPUHealGPUStalled"}
    rules = [r for r in alert_rules(control_plane, "gpuheal-agent") if r["alert"] in usage]
    assert {r["alert"] for r in rules} == usage
    monitoring = scraping(agent, rules, tmp_path)
    try:

        def alerting() -> set[tuple[str, str]]:
            url = f"{monitoring.prometheus_url}/api/v1/alerts"
            with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310
                alerts = json.load(response)["data"]["alerts"]
            return {
                (a["labels"]["alertname"], a["labels"].get("device", ""))
                for a in alerts
                if a["state"] == "firing"
            }

        wanted = {
            ("GPUHealGPUStalled", devices[1]["uuid"]),
            ("GPUHealGPUMemoryHigh", devices[2]["uuid"]),
        }
        wait_for("the usage alerts", lambda: alerting() == wanted, timeout_s=60)
        time.sleep(4)  # more scrapes and evaluations: nothing else fires
        assert alerting() == wanted
        # Usage is never a fault.
        assert STATUS not in node_annotations(kube, node)
        assert gpu_healthy(kube, node)[:2] == ("True", "GPUsHealthy")
    finally:
        monitoring.stop()
