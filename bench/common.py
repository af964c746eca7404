"""What the benchmark scripts share: process sampling from /proc, percentiles,
the apiserver's own request counters, bulk fleets, results and plots.

Every script prints its JSON result on stdout and a human summary on stderr,
and keeps a copy of the JSON in bench/results/ (the source of docs/BENCHMARKS.md
and of the plots in docs/img/).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuheal.kube.api import KubeApi
from gpuheal.sim import ControlPlane, ControlPlaneConfig, audit
from gpuheal.sim.bulk import create_all
from gpuheal.sim.controller import install_crds
from gpuheal.sim.controlplane import ADMIN
from gpuheal.sim.nodes import gpu_node
from gpuheal.sim.workloads import create_namespace, gpu_pod

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PLOTS = ROOT / "docs" / "img"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    # The command name (field 2) may hold spaces; the fields after ")" are fixed.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def percentiles_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max in milliseconds (nearest rank)."""
    ordered = sorted(seconds)

    def rank(p: float) -> float:
        index = max(0, min(len(ordered) - 1, -(-len(ordered) * p // 100) - 1))
        return round(ordered[int(index)] * 1000, 1)

    return {
        "n": len(ordered),
        "p50": rank(50),
        "p90": rank(90),
        "p99": rank(99),
        "max": round(ordered[-1] * 1000, 1),
    }


_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def apiserver_requests(cp: ControlPlane) -> Counter[str]:
    """The apiserver's own apiserver_request_total, as {"VERB resource[/sub]": n}.
    Scrapes of /metrics itself are left out."""
    context = ssl.create_default_context(cafile=str(cp.ca_cert))
    request = urllib.request.Request(f"{cp.server}/metrics")  # noqa: S310 -- loopback https
    request.add_header("Authorization", f"Bearer {cp.tokens[ADMIN]}")
    with urllib.request.urlopen(request, context=context, timeout=30) as response:  # noqa: S310
        text = response.read().decode()
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("subresource") == "/metrics":
            continue
        resource = labels.get("resource") or labels.get("subresource", "")
        if labels.get("resource") and labels.get("subresource"):
            resource += f"/{labels['subresource']}"
        counts[f"{labels.get('verb', '')} {resource}"] += int(float(match["value"]))
    return counts


def delta(after: Counter[str], before: Counter[str]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in sorted(after) if after[k] - before[k] > 0}


@contextlib.contextmanager
def audited_cluster(user: str) -> Iterator[tuple[ControlPlane, Path]]:
    """A control plane for a controller benchmark (no scheduler, no
    controller-manager: pods are bound and kwok runs them), the CRDs installed,
    `user` a cluster-admin whose requests the audit log keeps, the namespaces
    gpuheal-system and work; and a scratch folder for the controller's files."""
    config = ControlPlaneConfig(scheduler=False, controller_manager=False, audit_users=[user])
    with ControlPlane(config) as cp, tempfile.TemporaryDirectory() as tmp:
        client = cp.client()
        install_crds(client)
        audit.grant_cluster_admin(client, user)
        create_namespace(client, "gpuheal-system")
        create_namespace(client, "work")
        yield cp, Path(tmp)


def build_fleet(
    cp: ControlPlane,
    prefix: str,
    count: int,
    *,
    start: int = 0,
    pods_per_node: int = 8,
    namespace: str = "work",
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """Nodes prefix-<start>..prefix-<start+count-1>, each with `pods_per_node` one-GPU
    pods bound to it (no scheduler needed). Returns the node names."""
    names = [f"{prefix}-{i:05d}" for i in range(start, start + count)]
    create_all(cp.kubeconfig, [gpu_node(n, labels=labels) for n in names])
    create_all(
        cp.kubeconfig,
        [
            gpu_pod(f"{n}-{j}", namespace, node_name=n, labels={"bench/node": n})
            for n in names
            for j in range(pods_per_node)
        ],
    )
    return names


def profiler(pid: int, name: str) -> subprocess.Popen[bytes]:
    """py-spy sampling a process until stop_profiler(): a flame graph in
    bench/results/NAME.svg, the evidence behind a number that falls short."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen(
        [str(spy), "record", "--pid", str(pid), "--rate", "200", "--format", "flamegraph",
         "--output", str(RESULTS / f"{name}.svg")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def stop_profiler(spy: subprocess.Popen[bytes]) -> None:
    spy.send_signal(signal.SIGINT)  # py-spy writes its flame graph on SIGINT
    spy.wait(60)


def emit(name: str, result: Mapping[str, Any], summary: str) -> None:
    """JSON on stdout (and bench/results/NAME.json), the summary on stderr."""
    text = json.dumps(result, indent=2)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(text + "\n")
    print(summary, file=sys.stderr)


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (installed by `make bench`)."""
    import matplotlib  # noqa: PLC0415 -- only the scripts that plot need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    PLOTS.mkdir(parents=True, exist_ok=True)
    return plt


def pods_not_running(cp: ControlPlane) -> int:
    """How many pods kwok has not marked Running yet (one cheap count query)."""

    async def count() -> int:
        api = KubeApi.from_kubeconfig(cp.kubeconfig)
        try:
            raw = await api.get(
                "/api/v1/pods",
                params={"fieldSelector": "status.phase!=Running", "limit": "1"},
            )
        finally:
            await api.close()
        page = json.loads(raw)
        return len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)

    return asyncio.run(count())


def wait_settled(cp: ControlPlane, timeout_s: float = 900) -> float:
    started = time.monotonic()
    while pods_not_running(cp):
        if time.monotonic() - started > timeout_s:
            raise TimeoutError("kwok did not mark every pod Running in time")
        time.sleep(2)
    return time.monotonic() - started


def commit_of(checkout: Path) -> str:
    """The checkout's commit, so the results say what the baseline was."""
    git = shutil.which("git")
    if git is None:
        return "an unknown commit"
    done = subprocess.run(
        [git, "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() or "an unknown commit"
