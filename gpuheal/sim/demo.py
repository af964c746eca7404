"""`gpuheal demo`: the whole self-healing chain on a local control plane.

Starts the real control plane with fake 8-GPU nodes (kwok), runs a GPU
Deployment through the real scheduler, starts `gpuheal controller` and a
`gpuheal agent` on the busiest node (fake NVML, a kernel-log file), logs an
Xid 79 in that node's kernel log, and shows detection, quarantine, eviction,
rescheduling, duplicate suppression, and recovery after the node reboots.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.controller import ControllerProcess, GPUFault, install_crds
from gpuheal.sim.controlplane import ControlPlane, ControlPlaneConfig
from gpuheal.sim.gpustate import read_gpu_state, render
from gpuheal.sim.nodes import create_gpu_nodes, wait_nodes_ready
from gpuheal.sim.workloads import (
    apply,
    create_namespace,
    gpu_deployment,
    wait_pods_running,
)

DEMO_NAMESPACE = "ml-training"
DEMO_DEPLOYMENT = "llm-finetune"
# GPU index 2 of the fake node sits at PCI 0000:1a:00 (gpuheal.sim.agent.gpu_spec).
XID_LINE = "NVRM: Xid (PCI:0000:1a:00): 79, pid=<unknown>, GPU has fallen off the bus."
AGENT_CONFIG: dict[str, Any] = {"intervalSeconds": 0.5, "immediateP0Xid": True}
TAINT_KEY = "gpuheal.io/gpu-fault"

# Production defaults, with windows short enough to watch.
CONTROLLER_CONFIG: dict[str, Any] = {
    "recoveryWindowSeconds": 3,
    "cooldownSeconds": 30,
    "leaderElection": {"leaseSeconds": 6, "renewDeadlineSeconds": 4, "retryPeriodSeconds": 1},
}


@dataclass(frozen=True)
class DemoOptions:
    nodes: int = 20
    replicas: int = 32
    gpus_per_pod: int = 2
    keep: bool = False
    timeout_s: float = 120


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"demo: timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def _taint_value(client: Client, node: str) -> str | None:
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


def _on(pods: list[Pod], node: str) -> int:
    return sum(1 for p in pods if p.spec and p.spec.nodeName == node)


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    timeout = options.timeout_s
    with ControlPlane(ControlPlaneConfig(start_timeout_s=timeout)) as cp:
        say(f"control plane up in {cp.started_in_s:.1f}s at {cp.server}")
        client = cp.client()
        names = [f"gpu-node-{i:03d}" for i in range(options.nodes)]
        t0 = time.monotonic()
        create_gpu_nodes(client, names)
        wait_nodes_ready(client, names, timeout_s=timeout)
        say(f"{len(names)} fake GPU nodes Ready in {time.monotonic() - t0:.1f}s")

        create_namespace(client, DEMO_NAMESPACE)
        deployment = gpu_deployment(
            DEMO_DEPLOYMENT,
            DEMO_NAMESPACE,
            replicas=options.replicas,
            gpus_per_pod=options.gpus_per_pod,
        )
        apply(client, deployment)
        t0 = time.monotonic()
        wait_pods_running(
            client,
            DEMO_NAMESPACE,
            count=options.replicas,
            labels={"app": DEMO_DEPLOYMENT},
            timeout_s=timeout,
        )
        say(
            f"Deployment {DEMO_NAMESPACE}/{DEMO_DEPLOYMENT}: {options.replicas} pods x "
            f"{options.gpus_per_pod} GPU scheduled and Running in {time.monotonic() - t0:.1f}s\n"
        )
        say(render(read_gpu_state(client)))

        install_crds(client)
        create_namespace(client, "gpuheal-system")
        controller = ControllerProcess(
            cp.workdir, cp.kubeconfig, CONTROLLER_CONFIG, identity="gpuheal-demo"
        ).start(timeout_s=timeout)
        try:
            _self_heal(client, cp, options, say)
            if options.keep:
                say(
                    f"\nThe cluster and the controller keep running "
                    f"(controller log: {controller.component.log_path}). Try:\n"
                    f"  export KUBECONFIG={cp.kubeconfig}\n"
                    f"  {cp.config.binaries.kubectl} get gpufaults\n"
                    f"  {cp.config.binaries.kubectl} annotate node gpu-node-001 "
                    "gpuheal.io/status=faulty gpuheal.io/fault-id=manual-001\n"
                    "Press Ctrl-C to stop."
                )
                with contextlib.suppress(KeyboardInterrupt):
                    while True:
                        time.sleep(3600)
        finally:
            controller.stop()
    say("control plane stopped")
    return 0


def _fault_id(client: Client, node: str) -> str | None:
    meta = client.get(Node, node).metadata
    return (meta.annotations or {}).get("gpuheal.io/fault-id") if meta else None


def _self_heal(
    client: Client, cp: ControlPlane, options: DemoOptions, say: Callable[[str], None]
) -> None:
    timeout = options.timeout_s
    pods = _app_pods(client)
    victim = max(sorted({p.spec.nodeName for p in pods if p.spec and p.spec.nodeName}),
                 key=lambda n: _on(pods, n))  # fmt: skip
    victims_pods = _on(pods, victim)
    agent = AgentProcess(cp.workdir, cp.kubeconfig, victim, AGENT_CONFIG).start(timeout_s=timeout)
    try:
        _wait("the agent's first report", lambda: _condition(client, victim) == "True", timeout)
        gpu = agent.spec["devices"][2]
        say(
            f"\n== gpuheal agent on {victim} ({victims_pods} GPU pods) probes 8 GPUs (fake NVML) "
            f"and its kernel log\n   the kernel logs: {XID_LINE}"
        )
        t0 = time.monotonic()
        agent.kernel(XID_LINE)
        _wait("the agent's report", lambda: _fault_id(client, victim) is not None, timeout)
        fault_id = _fault_id(client, victim)
        say(
            f"   agent: GPUHealthy=False XidCritical79 on {gpu['uuid']}, fault {fault_id} "
            f"({(time.monotonic() - t0) * 1000:.0f} ms)"
        )
        _wait("the taint", lambda: _taint_value(client, victim) == fault_id, timeout)
        say(
            f"   controller: quarantined (taint {TAINT_KEY}=<fault id>:NoSchedule) "
            f"{(time.monotonic() - t0) * 1000:.0f} ms after the kernel line"
        )
        _wait("the GPU pods to leave", lambda: _on(_app_pods(client), victim) == 0, timeout)
        say(f"   {victims_pods} GPU pods evicted through the Eviction API after "
            f"{time.monotonic() - t0:.2f}s")  # fmt: skip
        _rescheduled(client, victim, options, t0, say)

        say("\n== The same Xid logged 30 more times (the driver and the alerts repeat)")
        for _ in range(30):
            agent.kernel(XID_LINE)
        time.sleep(2)
        records = list(client.list(GPUFault, labels={"gpuheal.io/node": victim}))
        say(f"   fault id still {_fault_id(client, victim)}; GPUFault records for {victim}: "
            f"{len(records)} (handled exactly once)")  # fmt: skip
        for record in records:
            status: Any = record.status or {}
            name = record.metadata.name if record.metadata else ""
            say(f"   {name}: phase {status.get('phase')}, "
                f"evicted {len(status.get('evictedPods') or [])} pods")  # fmt: skip
        say("")
        say(render(read_gpu_state(client)))

        say(f"\n== {victim} is rebooted (new boot id, fresh kernel log); the agent sees healthy "
            f"GPUs and the controller waits {CONTROLLER_CONFIG['recoveryWindowSeconds']}s "
            "of continuous health")  # fmt: skip
        agent.stop()
        agent.reboot()
        agent = AgentProcess(cp.workdir, cp.kubeconfig, victim, AGENT_CONFIG).start(
            timeout_s=timeout
        )
        t0 = time.monotonic()
        _wait("the agent to clear the fault", lambda: _fault_id(client, victim) is None, timeout)
        say(f"   agent: GPUHealthy=True, fault cleared after {time.monotonic() - t0:.1f}s")
        _wait("recovery", lambda: _taint_value(client, victim) is None, timeout)
        say(f"   controller: {victim} returned to the pool {time.monotonic() - t0:.1f}s "
            "after the reboot")  # fmt: skip
    finally:
        agent.stop()


def _condition(client: Client, node: str) -> str:
    status = client.get(Node, node).status
    conditions = (status.conditions if status else None) or []
    return next((c.status for c in conditions if c.type == "GPUHealthy"), "")


def _rescheduled(
    client: Client, victim: str, options: DemoOptions, t0: float, say: Callable[[str], None]
) -> None:
    def done() -> bool:
        now = _app_pods(client)
        running = [p for p in now if p.status and p.status.phase == "Running"]
        return len(running) >= options.replicas and _on(now, victim) == 0

    try:
        _wait("rescheduling", done, options.timeout_s)
        say(f"   all {options.replicas} replicas Running again, none on {victim}, "
            f"{time.monotonic() - t0:.2f}s after the fault")  # fmt: skip
    except TimeoutError:
        pending = sum(1 for p in _app_pods(client) if p.status and p.status.phase == "Pending")
        say(f"   {pending} replicas Pending: the healthy nodes have too few free GPUs")
