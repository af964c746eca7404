"""Benchmark: what gpuheal isolates of a real fleet's failures, row by row.

The failure record is Llama 3's pre-training report (arXiv 2407.21783, Table 5): 419
unexpected interruptions in 54 days on 16,384 H100s, by root cause. For every row the
signal that failure leaves on a node, as the driver, the kernel and the tools write it,
is injected into a real `gpuheal agent` (the NVML stand-in, a kernel-log file, an HGX
node's /sys/class/infiniband tree) on a fake node of a real control plane, with a
real `gpuheal controller` (defaults, a 100-node pool so the breaker's 10 % leaves room
for every row at once). Every row runs at once, one node each. A row whose failure
leaves nothing node-local says why, and is counted as not isolated.

Measured per row: whether the node was quarantined (our taint), the reason and severity
the agent reported, the taint's effect, the seconds from the injection to the agent's
report (`seconds_to_report`) and to the taint (`seconds_to_quarantine`). Two waits are
shortened to keep the run to minutes, and `as_shipped_s` adds the difference back: a
signal that must hold for a time (the power brake's 60 % of 10 minutes, run over 1
minute), and the controller's watch of a P1 fault before it is handled as P0
(`p1EscalationSeconds`, 600 s as shipped, 30 s here). The agent probes every 10 s and
reports after 3 failing rounds, as shipped.

    .venv/bin/python bench/coverage.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import emit
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal.model import FAULT_REASON, FAULT_SEVERITY, STATUS, TAINT_KEY
from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.controller import ControllerProcess, install_crds
from gpuheal.sim.ibsysfs import hgx_node
from gpuheal.sim.nodes import create_gpu_nodes, wait_nodes_ready
from gpuheal.sim.workloads import create_namespace

POOL = {"bench/pool": "coverage"}
FLEET = 100
GPU2 = "0000:1a:00"  # the stand-in node's GPU 2 (bus 0x18 + 2)
INTERRUPTIONS = 419
P1_SHIPPED_S, P1_RUN_S = 600.0, 30.0  # p1EscalationSeconds as shipped, and as run here


@dataclass(frozen=True)
class Row:
    cause: str
    count: int  # interruptions in Table 5
    signal: str = ""  # what the failure leaves on a node; "" for none
    why_none: str = ""
    kernel: str = ""  # a kernel-log line injected
    device: dict[str, Any] = field(default_factory=dict)  # GPU 2's spec changes
    ib_flaps: int = 0  # link_downed grows by this on mlx5_3
    agent: dict[str, Any] = field(default_factory=dict)  # the row's agent settings
    hold_shipped_s: float = 0.0  # the signal's hold as shipped ...
    hold_run_s: float = 0.0  # ... and as run here
    must_not_fence: bool = False  # the failure's signal is no node fault by NVIDIA's word


ROWS = [
    Row(
        "Faulty GPU",
        148,
        "Xid 79: the GPU fell off the bus",
        kernel=f"NVRM: Xid (PCI:{GPU2}): 79, pid=<unknown>, GPU has fallen off the bus.",
    ),
    Row(
        "GPU HBM3 memory",
        72,
        "Xid 48 (double-bit ECC) and the uncorrectable volatile ECC count",
        kernel=f"NVRM: Xid (PCI:{GPU2}): 48, pid='<unknown>', name=<unknown>, An uncorrectable"
        " double bit error (DBE) has been detected on GPU in the framebuffer at physAddr"
        " 0x2a41c980 partition 11, subpartition 1.",
        device={"eccUncorrectedVolatile": 2},
    ),
    Row(
        "Software bug",
        54,
        why_none="a bug in the job: the application Xids it leaves (13, 31, 43) are the"
        " application's to restart, never a node fault (NVIDIA's catalogue); injected here"
        " as Xid 13, which must not quarantine",
        kernel=f"NVRM: Xid (PCI:{GPU2}): 13, pid=2519562, name=python3, Graphics Exception:"
        " ChID 000c, Class 0000cbc0, Offset 00000000, Data 00000000",
        must_not_fence=True,
    ),
    Row(
        "Network switch/cable",
        35,
        "an InfiniBand rail flapping: link_downed grows 3 times (GPUd's threshold)",
        ib_flaps=3,
    ),
    Row(
        "Host maintenance",
        32,
        why_none="planned work, not a failure: `gpuheal maintenance` drains and returns the node",
    ),
    Row(
        "GPU SRAM memory",
        19,
        "Xid 95: an uncontained SRAM ECC error",
        kernel=f"NVRM: Xid (PCI:{GPU2}): 95, pid=5171, Uncontained: FBHUB. RST: Yes, D-RST: No",
    ),
    Row(
        "GPU system processor",
        17,
        "Xid 119: the GSP stopped answering",
        kernel=f"NVRM: Xid (PCI:{GPU2}): 119, pid=1582259, name=nvc:[driver], Timeout after 6s"
        " of waiting for RPC response from GPU2 GSP! Expected function 76 (GSP_RM_CONTROL)"
        " (0x20802a02 0x8).",
    ),
    Row(
        "NIC",
        7,
        "mlx5: the firmware's health counter stopped",
        kernel="mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised"
        " - reached miss count",
    ),
    Row(
        "NCCL watchdog timeouts",
        7,
        why_none="a job-level symptom (a collective that never finished): where its cause is"
        " node-local it is another row (NVLink, InfiniBand, a GPU); a GPU idle while a pod"
        " holds it is an alert (GPUStalledJob), never a quarantine",
    ),
    Row(
        "Silent data corruption",
        6,
        why_none="no passive node signal: found only by active checks (DCGM's diagnostic,"
        " NCCL tests), which the idle-node sweep runs (a failure is a SweepFailed fault,"
        " tests/integration/test_sweep.py); this bench injects passive signals only",
    ),
    Row(
        "GPU thermal interface + sensor",
        6,
        "GPU at 96 C, above temperatureCriticalC (95)",
        device={"temperature": 96},
    ),
    Row(
        "SSD",
        3,
        why_none="not a GPU signal: node-problem-detector's disk checks, quarantined through"
        " gpuheal's conditions source where configured; the agent reads no disk",
    ),
    Row(
        "Power supply",
        3,
        "the supply's power brake held on the clocks (HwPowerBrakeSlowdown, 60 % of 10 min)",
        device={"clocksEventReasons": 0x80},
        agent={"slowdownWindowSeconds": 60},
        hold_shipped_s=0.6 * 600,
        hold_run_s=0.6 * 60,
    ),
    Row(
        "Server chassis",
        2,
        why_none="no node-local signal the agent reads (the BMC's event log is not read)",
    ),
    Row(
        "IO expansion board",
        2,
        "the GPU's PCIe link trained at x8 of x16 (PcieLinkDegraded, held 60 s)",
        device={"pcie": {"width": 8}},
    ),
    Row("Dependency", 2, why_none="a service outside the node"),
    Row("CPU", 2, why_none="machine-check lines (mce) are not read by the agent"),
    Row("System memory", 2, why_none="EDAC lines are not read by the agent"),
]


def node_of(index: int) -> str:
    # EKS-shaped names, one per row.
    return f"ip-10-44-{index // 250}-{index % 250 + 10}.us-west-2.compute.internal"


def taint_of(client: Client, node: str) -> tuple[str, dict[str, str]]:
    """Our taint's effect on the node ("" while untainted), and its annotations."""
    obj = client.get(Node, node)
    taints = (obj.spec.taints if obj.spec else None) or []
    ours = next((t for t in taints if t.key == TAINT_KEY), None)
    annotations = dict((obj.metadata.annotations if obj.metadata else None) or {})
    return (str(ours.effect) if ours else ""), annotations


def inject(row: Row, agent: AgentProcess, tree_flaps: Any) -> None:
    if row.device:
        agent.set_device(2, **row.device)
    if row.kernel:
        agent.kernel(row.kernel)
    if row.ib_flaps:
        tree_flaps(row.ib_flaps)


def run(settle_s: float, watch_s: float) -> dict[str, Any]:
    config = ControlPlaneConfig(scheduler=False, controller_manager=False)
    with ControlPlane(config) as cp, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        client = cp.client()
        install_crds(client)
        create_namespace(client, "gpuheal-system")
        names = [node_of(i) for i in range(FLEET)]
        create_gpu_nodes(client, names, labels=POOL)
        wait_nodes_ready(client, names)
        settings = {"nodeSelector": POOL, "p1EscalationSeconds": P1_RUN_S}
        controller = ControllerProcess(work, cp.kubeconfig, settings)
        controller.start().wait_leading()
        agents, trees = [], []
        for index, row in enumerate(ROWS):
            node = node_of(index)
            tree = hgx_node(AgentProcess.dir_for(work, node) / "sys" / "class" / "infiniband")
            agent = AgentProcess(work, cp.kubeconfig, node, {"intervalSeconds": 10, **row.agent})
            agents.append(agent.start())
            trees.append(tree)
        try:
            return _measure(client, agents, trees, settle_s, watch_s)
        finally:
            for agent in agents:
                agent.stop()
            controller.stop()


def _measure(
    client: Client, agents: list[AgentProcess], trees: list[Any], settle_s: float, watch_s: float
) -> dict[str, Any]:
    # Healthy first (and a slowdown window watched whole before the power row's brake).
    time.sleep(settle_s)
    started: dict[int, float] = {}
    for index, row in enumerate(ROWS):
        if row.signal or row.must_not_fence:
            tree = trees[index]

            def flap(n: int, tree: Any = tree) -> None:
                tree.set_counter("mlx5_3", 1, "link_downed", n)

            inject(row, agents[index], flap)
            started[index] = time.monotonic()
    reported: dict[int, float] = {}
    seen: dict[int, tuple[float, str, dict[str, str]]] = {}
    deadline = time.monotonic() + watch_s
    while time.monotonic() < deadline and len(seen) < len(started):
        for index in started.keys() - seen.keys():
            effect, annotations = taint_of(client, node_of(index))
            now = time.monotonic() - started[index]
            if annotations.get(STATUS) == "faulty":
                reported.setdefault(index, now)
            if effect:
                seen[index] = (now, effect, annotations)
        time.sleep(0.25)
    return {"rows": [_row(i, row, reported.get(i), seen.get(i)) for i, row in enumerate(ROWS)]}


def _row(
    index: int, row: Row, reported: float | None, seen: tuple[float, str, dict[str, str]] | None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cause": row.cause,
        "interruptions": row.count,
        "signal": row.signal or "none",
        "node": node_of(index),
    }
    if not row.signal:
        out["why_none"] = row.why_none
    if reported is not None:
        out["seconds_to_report"] = round(reported, 1)
    out["quarantined"] = seen is not None
    if seen is not None:
        seconds, effect, annotations = seen
        severity = annotations.get(FAULT_SEVERITY, "")
        out |= {
            "reason": annotations.get(FAULT_REASON, ""),
            "severity": severity,
            "taint": effect,
            "seconds_to_quarantine": round(seconds, 1),
        }
        shortened = row.hold_shipped_s - row.hold_run_s
        if severity == "P1":
            shortened += P1_SHIPPED_S - P1_RUN_S
        if shortened:
            out["as_shipped_s"] = round(seconds + shortened, 1)
    return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    isolated = [r for r in rows if r["quarantined"] and r["signal"] != "none"]
    wrong = [r["cause"] for r in rows if r["quarantined"] and r["signal"] == "none"]
    missed = [r["cause"] for r in rows if r["signal"] != "none" and not r["quarantined"]]
    share = sum(r["interruptions"] for r in isolated) / INTERRUPTIONS
    return {
        "rows_with_a_node_signal": sum(1 for r in rows if r["signal"] != "none"),
        "rows_isolated": len(isolated),
        "interruptions_isolated": sum(r["interruptions"] for r in isolated),
        "share_isolated": round(share, 3),
        "quarantined_without_a_signal": wrong,
        "signal_missed": missed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle", type=float, default=75.0, help="healthy seconds first")
    parser.add_argument("--watch", type=float, default=300.0, help="seconds to wait for taints")
    args = parser.parse_args()
    measured = run(args.settle, args.watch)
    summary = summarise(measured["rows"])
    result = {
        "benchmark": "coverage",
        "record": "Llama 3 pre-training, arXiv 2407.21783 Table 5: 419 interruptions",
        "agent": {"intervalSeconds": 10, "failRounds": 3},
        "controller": {"p1EscalationSeconds": P1_RUN_S, "shipped": P1_SHIPPED_S},
        **measured,
        "summary": summary,
    }
    lines = [
        f"{r['cause']:32} {r['interruptions']:4}  "
        + (
            f"{r['reason']} {r['severity']} {r['taint']} in {r['seconds_to_quarantine']} s"
            f" (as shipped {r.get('as_shipped_s', r['seconds_to_quarantine'])} s)"
            if r["quarantined"]
            else ("none: " + r.get("why_none", "")[:60] if r["signal"] == "none" else "MISSED")
        )
        for r in measured["rows"]
    ]
    lines.append(
        f"isolated without a person: {summary['interruptions_isolated']} of {INTERRUPTIONS}"
        f" interruptions ({summary['share_isolated']:.1%})"
    )
    emit("coverage", result, "\n".join(lines))
    return 0 if not summary["signal_missed"] and not summary["quarantined_without_a_signal"] else 1


if __name__ == "__main__":
    sys.exit(main())
