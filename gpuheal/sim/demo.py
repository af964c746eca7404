"""`gpuheal demo`: the whole product on a local control plane, unattended.

The real control plane with fake 8-GPU nodes (kwok), a GPU training
Deployment, `gpuheal controller`, and one `gpuheal agent` process per node
(fake NVML, a kernel-log file). Then scripted faults — an Xid 79 in one node's
kernel log, an uncorrectable ECC error on another, a P1 temperature warning
that escalates, an alert storm through the webhook — and a recovery. A live
view prints each node's state change as it happens; a summary closes it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.model import NODE_LABEL
from gpuheal.sim import demo_dra
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.controller import ControllerProcess, install_crds
from gpuheal.sim.controlplane import ControlPlane, ControlPlaneConfig
from gpuheal.sim.gpustate import read_gpu_state, render
from gpuheal.sim.nodes import create_gpu_nodes, wait_nodes_ready
from gpuheal.sim.process import stop_all
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, create_namespace, gpu_deployment, wait_pods_running
from gpuheal.values import node_label

DEMO_NAMESPACE = "ml-training"
DEMO_DEPLOYMENT = "llm-finetune"
TAINT_KEY = "gpuheal.io/gpu-fault"
# GPU index 2 of a fake node sits at PCI 0000:1a:00 (gpuheal.sim.agent.gpu_spec).
XID_LINE = "NVRM: Xid (PCI:0000:1a:00): 79, pid=<unknown>, GPU has fallen off the bus."
API_TOKEN = "demo-token"  # noqa: S105 -- a throw-away token on loopback
CONSOLE_WAIT_S = 10.0  # with --keep: time to open the console before the faults

# Production defaults, with windows short enough to watch.
CONTROLLER_CONFIG: dict[str, Any] = {
    "recoveryWindowSeconds": 3,
    "cooldownSeconds": 30,
    "p1EscalationSeconds": 5,
    "breakerMaxNodes": 10,
    "breakerMaxPercent": 50,
    # The demo's alert storm comes from one client; production keeps the default limit.
    "apiClientRatePerSecond": 1000,
    "apiClientBurst": 1000,
    "leaderElection": {"leaseSeconds": 6, "renewDeadlineSeconds": 4, "retryPeriodSeconds": 1},
}
AGENT_CONFIG: dict[str, Any] = {"intervalSeconds": 1, "failRounds": 2, "immediateP0Xid": True}


@dataclass(frozen=True)
class DemoOptions:
    nodes: int = 20
    replicas: int = 32
    gpus_per_pod: int = 2
    keep: bool = False
    timeout_s: float = 180
    dra: int = 0  # DRA-only GPU nodes beside the fleet (sim/demo_dra.py)


@dataclass
class Fault:
    label: str
    node: str
    injected: float
    quarantined: float | None = None


@dataclass
class LiveView:
    """Prints every node's state change as it happens (polled between steps)."""

    client: Client
    say: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    states: dict[str, str] = field(default_factory=dict)

    def stamp(self) -> str:
        return f"[{time.monotonic() - self.started:6.1f}s]"

    def poll(self) -> None:
        for node in self.client.list(Node, labels={"nvidia.com/gpu.present": "true"}):
            if node.metadata is None or node.metadata.name is None:
                continue
            state = _state(node)
            before = self.states.get(node.metadata.name)
            if before is not None and before != state:
                self.say(f"{self.stamp()} {node.metadata.name}: {before} -> {state}")
            self.states[node.metadata.name] = state


def _state(node: Node) -> str:
    annotations = (node.metadata.annotations if node.metadata else None) or {}
    taints = (node.spec.taints if node.spec else None) or []
    reason = annotations.get("gpuheal.io/fault-reason", "")
    if any(t.key == TAINT_KEY for t in taints):
        return f"quarantined ({reason})" if reason else "quarantined, fault cleared: recovering"
    if annotations.get("gpuheal.io/status") == "faulty":
        return f"reported ({reason})"
    return "healthy"


def _wait(
    what: str, check: Callable[[], bool], timeout_s: float, view: LiveView | None = None
) -> float:
    started = time.monotonic()
    while not check():
        if view is not None:
            view.poll()
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"demo: timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.1)
    if view is not None:
        view.poll()
    return time.monotonic() - started


def _taint(client: Client, node: str) -> str | None:
    spec = client.get(Node, node).spec
    return (
        next((t.value for t in (spec.taints or []) if t.key == TAINT_KEY), None) if spec else None
    )


def _app_pods(client: Client) -> list[Pod]:
    return [
        p
        for p in client.list(Pod, namespace=DEMO_NAMESPACE, labels={"app": DEMO_DEPLOYMENT})
        if p.metadata and not p.metadata.deletionTimestamp
    ]


def _on(pods: list[Pod], nodes: set[str]) -> int:
    return sum(1 for p in pods if p.spec and p.spec.nodeName in nodes)


def _post(controller: ControllerProcess, path: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(  # noqa: S310 -- loopback
        controller.url + path, data=json.dumps(body).encode(), method="POST"
    )
    request.add_header("Authorization", f"Bearer {API_TOKEN}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        response.read()


def _metric_sum(metrics: str, name: str, where: str = "") -> float:
    pattern = re.compile(rf"^{name}\{{[^}}]*{re.escape(where)}[^}}]*\}} (\S+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(metrics))


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    timeout = options.timeout_s
    with (
        ControlPlane(
            ControlPlaneConfig(start_timeout_s=timeout, device_taint_rules=options.dra > 0)
        ) as cp,
        tempfile.TemporaryDirectory(prefix="gpuheal-demo-") as tmp,
    ):
        say(f"control plane up in {cp.started_in_s:.1f}s at {cp.server}")
        client = cp.client()
        names, dra = _fleet(client, options, say)

        install_crds(client)
        create_namespace(client, "gpuheal-system")
        token = Path(tmp) / "api-token"
        token.write_text(API_TOKEN)
        config = {**CONTROLLER_CONFIG, "apiTokenFile": str(token)}
        controller = ControllerProcess(cp.workdir, cp.kubeconfig, config, identity="gpuheal-demo")
        agents = {n: AgentProcess(cp.workdir, cp.kubeconfig, n, AGENT_CONFIG) for n in names}
        try:
            controller.start(timeout_s=timeout).wait_leading(timeout)
            t0 = time.monotonic()
            for agent in agents.values():
                agent.component.start()
            for agent in agents.values():
                agent.start_wait(timeout)
            say(
                f"\ngpuheal controller leads; {len(agents)} agents (fake NVML, 8 GPUs each) "
                f"started in {time.monotonic() - t0:.1f}s\n"
            )
            if options.keep:
                # Printed, and a moment given to open it, before the faults: they
                # can be watched arriving.
                say(_console_line(controller))
                say(f"The faults start in {CONSOLE_WAIT_S:.0f} s.\n")
                time.sleep(CONSOLE_WAIT_S)
            faults = _scenario(
                client, controller, agents, options, say=say, kubeconfig=cp.kubeconfig
            )
            _summary(client, controller, faults, say)
            _operator_view(cp.kubeconfig, controller.config_path, names[-1], say)
            if dra:
                say(f"\nDRA: {demo_dra.act(client, dra[0], say, timeout)}")
            if options.keep:
                # "Press Ctrl-C" holds even when started from a script in the background,
                # which ignores SIGINT (Python would then raise no KeyboardInterrupt).
                signal.signal(signal.SIGINT, signal.default_int_handler)
                say(
                    f"\nThe cluster, the controller and the agents keep running. Try:\n"
                    f"  export KUBECONFIG={cp.kubeconfig}\n"
                    f"  {cp.config.binaries.kubectl} get gpufaults\n"
                    f"{_console_line(controller)}\n"
                    "Press Ctrl-C to stop."
                )
                with contextlib.suppress(KeyboardInterrupt):
                    while True:
                        time.sleep(3600)
        finally:
            # Each step said, so a shutdown that hangs shows where.
            say("stopping the agents")
            stop_all([a.component for a in agents.values()], 10)
            say("stopping the controller")
            controller.stop()
            say("stopping the control plane")
    say("control plane stopped")
    return 0


def _fleet(
    client: Client, options: DemoOptions, say: Callable[[str], None]
) -> tuple[list[str], list[str]]:
    """The fake GPU nodes and the training Deployment, Running; with --dra, the DRA
    nodes and their inference pods. Their names."""
    timeout = options.timeout_s
    names = [f"gpu-node-{i:03d}" for i in range(options.nodes)]
    create_gpu_nodes(client, names)
    wait_nodes_ready(client, names, timeout_s=timeout)
    create_namespace(client, DEMO_NAMESPACE)
    apply(
        client,
        gpu_deployment(
            DEMO_DEPLOYMENT,
            DEMO_NAMESPACE,
            replicas=options.replicas,
            gpus_per_pod=options.gpus_per_pod,
        ),
    )
    wait_pods_running(
        client,
        DEMO_NAMESPACE,
        count=options.replicas,
        labels={"app": DEMO_DEPLOYMENT},
        timeout_s=timeout,
    )
    say(
        f"{len(names)} fake GPU nodes Ready; Deployment {DEMO_NAMESPACE}/{DEMO_DEPLOYMENT}: "
        f"{options.replicas} pods x {options.gpus_per_pod} GPU Running\n"
    )
    say(render(read_gpu_state(client)))
    dra = demo_dra.setup(client, options.dra, timeout) if options.dra else []
    if dra:
        say(
            f"{len(dra)} DRA-only GPU nodes (NVIDIA's DRA driver's slices, no "
            f"nvidia.com/gpu): {len(dra) * demo_dra.PODS_PER_NODE} inference pods, each "
            "through its own ResourceClaim\n"
        )
    return names, dra


def _console_line(controller: ControllerProcess) -> str:
    return (
        f"The console: {controller.url}/console/ (sign in with any name and the token "
        f"{API_TOKEN!r})"
    )


def _scenario(
    client: Client,
    controller: ControllerProcess,
    agents: dict[str, AgentProcess],
    options: DemoOptions,
    *,
    say: Callable[[str], None],
    kubeconfig: Path,
) -> list[Fault]:
    timeout = options.timeout_s
    view = LiveView(client, say)
    view.poll()
    pods = _app_pods(client)
    busiest = sorted(agents, key=lambda n: (-_on(pods, {n}), n))
    xid_node, ecc_node, hot_node, alert_node = busiest[:4]
    faults: list[Fault] = []

    def quarantined(fault: Fault) -> None:
        _wait(
            f"{fault.node} quarantined",
            lambda: _taint(client, fault.node) is not None,
            timeout,
            view,
        )
        fault.quarantined = time.monotonic() - fault.injected

    say(f"{view.stamp()} Xid 79 in the kernel log of {xid_node}: {XID_LINE}")
    faults.append(Fault("Xid 79 (kernel log -> agent)", xid_node, time.monotonic()))
    agents[xid_node].kernel(XID_LINE)
    quarantined(faults[-1])

    say(f"{view.stamp()} uncorrectable ECC errors on GPU 5 of {ecc_node} (NVML)")
    faults.append(Fault("uncorrectable ECC (NVML -> agent)", ecc_node, time.monotonic()))
    agents[ecc_node].set_device(5, eccUncorrectedVolatile=4)
    quarantined(faults[-1])

    say(
        f"{view.stamp()} P1 temperature warning on {hot_node} (API); escalates after "
        f"{CONTROLLER_CONFIG['p1EscalationSeconds']}s if it persists"
    )
    faults.append(Fault("P1 temperature warning, escalated (API)", hot_node, time.monotonic()))
    _post(
        controller,
        "/api/v1/process",
        {"node": hot_node, "severity": "P1", "reason": "ThermalWarning", "faultID": "demo-thermal"},
    )
    quarantined(faults[-1])

    storm = 300
    say(f"{view.stamp()} alert storm: the same Alertmanager alert for {alert_node}, {storm} times")
    faults.append(Fault(f"Alertmanager alert x{storm} (webhook)", alert_node, time.monotonic()))
    alert = {
        "status": "firing",
        "labels": {"alertname": "GPUXidError", "Hostname": alert_node, "severity": "critical"},
        "startsAt": dt.datetime.now(dt.UTC).isoformat(),
        "fingerprint": "d3m0a1e7f1ngerpr",
    }
    for _ in range(storm):
        _post(controller, "/api/v1/alerts", {"version": "4", "status": "firing", "alerts": [alert]})
    quarantined(faults[-1])

    bad = {f.node for f in faults}

    def rescheduled() -> bool:
        now = _app_pods(client)
        running = [p for p in now if p.status and p.status.phase == "Running"]
        return len(running) >= options.replicas and _on(now, bad) == 0

    with contextlib.suppress(TimeoutError):
        took = _wait("rescheduling", rescheduled, 60, view)
        say(
            f"{view.stamp()} all {options.replicas} replicas Running again on healthy nodes "
            f"({took:.1f}s after the last fault)"
        )

    say(
        f"{view.stamp()} {xid_node} is rebooted (new boot id, fresh kernel log); its agent restarts"
    )
    agent = agents[xid_node]
    stop_all([agent.component], 10)
    agent.reboot()
    agents[xid_node] = AgentProcess(agent.dir.parent, kubeconfig, xid_node, AGENT_CONFIG)
    agents[xid_node].start(timeout)
    _wait(f"{xid_node} returned", lambda: _taint(client, xid_node) is None, timeout, view)
    return faults


def _summary(
    client: Client, controller: ControllerProcess, faults: list[Fault], say: Callable[[str], None]
) -> None:
    say("\n== Summary")
    width = max(len(f.label) for f in faults)
    columns = "time to quarantine  GPU pods moved  GPUFault records"
    say(f"{'fault'.ljust(width)}  {'node'.ljust(12)}  {columns}")
    for fault in faults:
        records = list(client.list(GPUFault, labels={NODE_LABEL: node_label(fault.node)}))
        took = f"{fault.quarantined * 1000:.0f} ms" if fault.quarantined is not None else "-"
        say(
            f"{fault.label.ljust(width)}  {fault.node.ljust(12)}  {took.rjust(18)}  "
            f"{str(_evicted(records)).rjust(14)}  {str(len(records)).rjust(16)}"
        )
    metrics = controller.metrics()
    duplicates = _metric_sum(metrics, "gpuheal_duplicates_suppressed_total") + _metric_sum(
        metrics, "gpuheal_alerts_total", 'result="duplicate"'
    )
    evicted = _metric_sum(metrics, "gpuheal_pods_evicted_total", 'result="evicted"')
    recoveries = _metric_sum(metrics, "gpuheal_remediations_total", 'action="RemoveTaint"')
    say(
        f"{len(faults)} faults, each handled exactly once; {evicted:.0f} GPU pods evicted; "
        f"{duplicates:.0f} duplicate signals suppressed; {recoveries:.0f} node(s) recovered"
    )
    say("")
    say(render(read_gpu_state(client)))


def _evicted(records: list[Any]) -> int:
    """The GPU pods the controller evicted for these faults, as their records say
    (status.evictedPods): what happened, not a count of pods seen on the node."""
    return sum(len(dict(r.status or {}).get("evictedPods") or ()) for r in records)


def _operator_view(kubeconfig: Path, config: Path, node: str, say: Callable[[str], None]) -> None:
    """The operator CLI on the same cluster, with the controller's config (its breaker,
    its node selector): the fleet, then a maintenance round trip."""
    say("\n== The operator's view (docs/operations.md)")
    for argv in (
        ["status"],
        ["maintenance", "start", node, "--reason", "demo: driver upgrade",
         "--checkpoint-wait", "0", "--timeout", "60"],
        ["maintenance", "finish", node],
    ):  # fmt: skip
        where = ["--kubeconfig", str(kubeconfig), "--config", str(config)]
        done = subprocess.run(
            [sys.executable, "-m", "gpuheal.cli", *argv, *where],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        say(f"$ gpuheal {shlex.join(argv)}    # exit {done.returncode}")
        say(done.stdout.rstrip())
