"""`gpuheal demo`: a local control plane with fake GPU nodes and a GPU workload.

Starts the real control plane, registers fake 8-GPU nodes (kwok), runs a GPU
Deployment through the real scheduler and prints the cluster's GPU state.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import TextIO

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


@dataclass(frozen=True)
class DemoOptions:
    nodes: int = 20
    replicas: int = 32
    gpus_per_pod: int = 2
    keep: bool = False
    timeout_s: float = 120


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    def say(text: str) -> None:
        print(text, file=out, flush=True)

    with ControlPlane(ControlPlaneConfig(start_timeout_s=options.timeout_s)) as cp:
        say(f"control plane up in {cp.started_in_s:.1f}s at {cp.server}")
        client = cp.client()
        names = [f"gpu-node-{i:03d}" for i in range(options.nodes)]
        t0 = time.monotonic()
        create_gpu_nodes(client, names)
        wait_nodes_ready(client, names, timeout_s=options.timeout_s)
        say(f"{len(names)} fake GPU nodes Ready in {time.monotonic() - t0:.1f}s")

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
        t0 = time.monotonic()
        wait_pods_running(
            client,
            DEMO_NAMESPACE,
            count=options.replicas,
            labels={"app": DEMO_DEPLOYMENT},
            timeout_s=options.timeout_s,
        )
        say(
            f"Deployment {DEMO_NAMESPACE}/{DEMO_DEPLOYMENT}: {options.replicas} pods x "
            f"{options.gpus_per_pod} GPU scheduled and Running in {time.monotonic() - t0:.1f}s\n"
        )
        say(render(read_gpu_state(client)))
        if options.keep:
            say(
                f"\nThe cluster keeps running. Try:\n"
                f"  export KUBECONFIG={cp.kubeconfig}\n"
                f"  {cp.config.binaries.kubectl} get nodes -L nvidia.com/gpu.product\n"
                "Press Ctrl-C to stop."
            )
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    say("control plane stopped")
    return 0
