"""Benchmark: the node agent's cost, and kernel-log parse throughput.

1. A real `gpuheal agent` process with 8 GPUs (the NVML stand-in, 18 NVLinks and an
   NVSwitch fabric each, every degradation reading) and 8 HCAs (an HGX node's
   /sys/class/infiniband tree, sim/ibsysfs.py), every probe on (NVML, nvidia-smi,
   the network, the environment, the kernel log), reports to a fake node of the local
   control plane; after warm-up it is sampled from /proc: resident memory, and CPU
   time per probe round.
2. parse_record + parse_message over the kernel-log corpus of the tests,
   repeated: lines per second, single core.

Prints JSON on stdout and a summary on stderr.

    .venv/bin/python bench/agent.py --seconds 20
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_seconds, emit, rss_mib

from gpuheal.agent.kmsg import parse_message, parse_record
from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.ibsysfs import hgx_node
from gpuheal.sim.nodes import create_gpu_nodes, wait_nodes_ready

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "unit" / "data" / "kmsg_corpus.txt"


def agent_cost(seconds: float, interval: float) -> dict[str, float]:
    config = ControlPlaneConfig(scheduler=False, controller_manager=False)
    with ControlPlane(config) as cp, tempfile.TemporaryDirectory() as tmp:
        client = cp.client()
        (node,) = create_gpu_nodes(client, ["bench-gpu-0"])
        wait_nodes_ready(client, [node])
        hgx_node(AgentProcess.dir_for(Path(tmp), node) / "sys" / "class" / "infiniband")
        settings = {
            "intervalSeconds": interval,
            "smiEnabled": True,
            "envEnabled": True,
            "ibExpectedHcas": 8,
            "ibExpectedPorts": 8,
            "ibExpectedRateGbps": 400,
        }
        agent = AgentProcess(Path(tmp), cp.kubeconfig, node, settings)
        for index in range(len(agent.spec["devices"])):
            agent.set_device(index, nvlinks=18, fabric={"state": 3})
        agent.start()
        try:
            time.sleep(3)  # warm-up: imports, first report
            pid = agent.component.pid
            if pid is None:
                raise RuntimeError("the agent process is not running")
            cpu0, rounds0 = cpu_seconds(pid), agent.metric("gpuheal_agent_rounds_total")
            time.sleep(seconds)
            cpu1, rounds1 = cpu_seconds(pid), agent.metric("gpuheal_agent_rounds_total")
            rounds = rounds1 - rounds0
            return {
                "interval_seconds": interval,
                "rounds": rounds,
                "rss_mib": round(rss_mib(pid), 1),
                "cpu_ms_per_round": round((cpu1 - cpu0) / rounds * 1000, 2),
                "cpu_percent_at_10s_interval": round((cpu1 - cpu0) / rounds / 10 * 100, 3),
                "node_writes_while_healthy": agent.metric("gpuheal_agent_reports_total"),
            }
        finally:
            agent.stop()


def parse_throughput(total_lines: int) -> dict[str, float]:
    lines = [line for line in CORPUS.read_text().splitlines() if line and not line.startswith("#")]
    records = [f"4,{i},{i * 1000},c;{line}" for i, line in enumerate(lines)]
    batch = (records * (total_lines // len(records) + 1))[:total_lines]
    started = time.perf_counter()
    events = 0
    for raw in batch:
        record = parse_record(raw)
        if record is not None and parse_message(record.message) is not None:
            events += 1
    elapsed = time.perf_counter() - started
    return {
        "lines": total_lines,
        "seconds": round(elapsed, 3),
        "lines_per_second": round(total_lines / elapsed),
        "events": events,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="agent sampling window")
    parser.add_argument("--interval", type=float, default=0.2, help="agent probe interval")
    parser.add_argument("--lines", type=int, default=200_000, help="lines to parse")
    args = parser.parse_args()
    result = {
        "benchmark": "agent",
        "gpus": 8,
        "hcas": 8,
        "probes": ["nvml", "nvml-events", "smi", "ib", "env", "kmsg"],
        "agent": agent_cost(args.seconds, args.interval),
        "kmsg_parse": parse_throughput(args.lines),
    }
    a, k = result["agent"], result["kmsg_parse"]
    emit(
        "agent",
        result,
        f"agent (8 GPUs, 8 HCAs, every probe): RSS {a['rss_mib']} MiB, "
        f"{a['cpu_ms_per_round']} ms CPU per round "
        f"({a['rounds']:.0f} rounds); kmsg parse: {k['lines_per_second']:,} lines/s",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
