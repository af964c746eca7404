"""`gpuheal demo`: the whole self-healing chain on a local control plane.

Starts the real control plane with fake 8-GPU nodes (kwok), runs a GPU
Deployment through the real scheduler, starts `gpuheal controller`, breaks the
busiest node the way the agent (or a person with kubectl) reports it, and shows
quarantine, eviction, rescheduling, duplicate suppression and recovery.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

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
FAULT_ID = "demo-xid79-0001"
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


def _annotate(client: Client, node: str, annotations: dict[str, str | None]) -> None:
    client.patch(Node, node, {"metadata": {"annotations": annotations}})


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
            _self_heal(client, options, say)
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


def _self_heal(client: Client, options: DemoOptions, say: Callable[[str], None]) -> None:
    timeout = options.timeout_s
    pods = _app_pods(client)
    victim = max(sorted({p.spec.nodeName for p in pods if p.spec and p.spec.nodeName}),
                 key=lambda n: _on(pods, n))  # fmt: skip
    victims_pods = _on(pods, victim)
    say(
        f"\n== GPU fault on {victim} ({victims_pods} GPU pods): as the agent reports it, i.e.\n"
        f"   kubectl annotate node {victim} gpuheal.io/status=faulty "
        f"gpuheal.io/fault-id={FAULT_ID} gpuheal.io/fault-reason=XidCritical79"
    )
    t0 = time.monotonic()
    _annotate(
        client,
        victim,
        {
            "gpuheal.io/status": "faulty",
            "gpuheal.io/fault-id": FAULT_ID,
            "gpuheal.io/fault-reason": "XidCritical79",
            "gpuheal.io/fault-time": dt.datetime.now(dt.UTC).isoformat(),
        },
    )
    tainted = _wait("the taint", lambda: _taint_value(client, victim) == FAULT_ID, timeout)
    say(f"   quarantined (taint {TAINT_KEY}={FAULT_ID}:NoSchedule) in {tainted * 1000:.0f} ms")
    _wait("the GPU pods to leave", lambda: _on(_app_pods(client), victim) == 0, timeout)
    say(f"   {victims_pods} GPU pods evicted through the Eviction API after "
        f"{time.monotonic() - t0:.2f}s")  # fmt: skip

    def rescheduled() -> bool:
        now = _app_pods(client)
        running = [p for p in now if p.status and p.status.phase == "Running"]
        return len(running) >= options.replicas and _on(now, victim) == 0

    try:
        _wait("rescheduling", rescheduled, timeout)
        say(f"   all {options.replicas} replicas Running again, none on {victim}, "
            f"{time.monotonic() - t0:.2f}s after the fault")  # fmt: skip
    except TimeoutError:
        pending = sum(1 for p in _app_pods(client) if p.status and p.status.phase == "Pending")
        say(f"   {pending} replicas Pending: the healthy nodes have too few free GPUs")

    say("\n== The same fault re-reported 30 times (alert repeats, fault-time churning)")
    for _ in range(30):
        _annotate(client, victim, {"gpuheal.io/fault-time": dt.datetime.now(dt.UTC).isoformat()})
    time.sleep(1.5)
    records = list(client.list(GPUFault, labels={"gpuheal.io/node": victim}))
    say(f"   GPUFault records for {victim}: {len(records)} (handled exactly once)")
    for record in records:
        status: Any = record.status or {}
        name = record.metadata.name if record.metadata else ""
        say(f"   {name}: phase {status.get('phase')}, "
            f"evicted {len(status.get('evictedPods') or [])} pods")  # fmt: skip
    say("")
    say(render(read_gpu_state(client)))

    say(f"\n== The fault clears on {victim}; the controller waits for "
        f"{CONTROLLER_CONFIG['recoveryWindowSeconds']}s of continuous health")  # fmt: skip
    t0 = time.monotonic()
    _annotate(
        client,
        victim,
        {
            "gpuheal.io/status": None,
            "gpuheal.io/fault-id": None,
            "gpuheal.io/fault-reason": None,
            "gpuheal.io/fault-time": None,
        },
    )
    _wait("recovery", lambda: _taint_value(client, victim) is None, timeout)
    say(f"   {victim} returned to the pool {time.monotonic() - t0:.1f}s after the fault cleared")
