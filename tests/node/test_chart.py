"""The chart, installed by the real helm, running as real containers on the real node:
the image built without a registry (deploy/docker/build.sh), the chart's security
contexts, mounts and probes as rendered, the controller ready behind its /readyz probe
and the agent reporting its node's GPUs, reached through the chart's mounts (the NVML
stand-in where the NVIDIA container runtime would inject the driver's library)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.model import AGENT_ACCESS, STATUS
from gpuheal.sim import ControlPlane
from gpuheal.sim.monitoring import PROMETHEUS, require
from gpuheal.sim.process import Component, stop_all
from gpuheal.sim.realnode import RealNode, container_pids
from tests.helpers import wait_for
from tests.integration.conftest import gpu_healthy
from tests.node.gpus import NodeGpus
from tests.node.release import chart_values, installed, ready_pods

pytestmark = pytest.mark.timeout(300)
READY_WITHIN_S = 90  # the issue's bound, from the images' import (done at the node's start)


CAP_SYSLOG = 1 << 34
# A privileged container's: every capability runc knows, as this machine's root holds
# them (CapBnd of this process, less none).
ALL_CAPABILITIES = int(
    next(
        line.split()[1]
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("CapBnd:")
    ),
    16,
)
# What the chart's security contexts make of each program's process, as the kernel
# sees it: (user, effective capabilities, root filesystem read-only).
EXPECTED = {"controller": (65532, 0, True), "agent": (0, CAP_SYSLOG, True)}


def process_of(pod: Pod) -> tuple[int, int, bool]:
    """The pod's container's first process, read from the machine's /proc."""
    assert pod.status and pod.status.containerStatuses
    container_id = str(pod.status.containerStatuses[0].containerID).removeprefix("containerd://")
    pid = container_pids(container_id)[0]
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    root = next(
        line.split()
        for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        if line.split()[4] == "/"
    )
    return int(status["Uid"].split()[1]), int(status["CapEff"], 16), "ro" in root[5].split(",")


def node_annotation(kube: Client, node: str, key: str) -> str:
    meta = kube.get(Node, node).metadata
    return (meta.annotations or {}).get(key, "") if meta else ""


@contextmanager
def prometheus_in(
    real_node: RealNode, targets: list[str], workdir: Path
) -> Iterator[Callable[[str], Any]]:
    """Debian's Prometheus in the node's network (the pods' addresses answer only
    there), scraping `targets` every second; yields a query function (PromQL -> result)."""
    config = {
        "scrape_configs": [
            {
                "job_name": "gpuheal",
                "scrape_interval": "1s",
                "static_configs": [{"targets": targets}],
            }
        ]
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    prometheus = Component(
        "prometheus",
        real_node.in_network(
            [
                require(PROMETHEUS),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                "--web.listen-address=127.0.0.1:9090",
            ]
        ),
        workdir / "prometheus.log",
    )
    prometheus.start()

    def query(promql: str) -> Any:
        url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        body = get_in_network(real_node, url)
        return json.loads(body)["data"]["result"] if body else []

    try:
        yield query
    finally:
        stop_all([prometheus], grace=5)


def scraped(query: Callable[[str], Any]) -> dict[str, str]:
    """Each target's `up`, once Prometheus has scraped every one."""
    return {r["metric"]["instance"]: r["value"][1] for r in query("up")}


def metrics_targets(pods: list[Pod]) -> list[str]:
    """Each pod's metrics endpoint: the controller's `http` port, the agent's `metrics`."""
    return [
        f"{pod.status.podIP}:{port.containerPort}"
        for pod in pods
        if pod.spec and pod.status
        for port in pod.spec.containers[0].ports or []
        if port.name in ("http", "metrics")
    ]


def test_the_chart_runs_on_a_real_kubelet(
    real_node: RealNode,
    node_gpus: NodeGpus,
    control_plane: ControlPlane,
    kube: Client,
    pool: dict[str, str],
    tmp_path: Path,
) -> None:
    values = chart_values(real_node, node_gpus, pool)
    labels = {"nvidia.com/gpu.present": "true", **pool}
    started = time.monotonic()
    with installed(control_plane, kube, real_node, tmp_path, values, labels) as namespace:

        def both_ready() -> list[Pod]:
            found = ready_pods(kube, namespace)
            return found if len(found) == 2 else []

        both = wait_for("the controller and the agent ready", both_ready, READY_WITHIN_S)
        print(f"ready in {time.monotonic() - started:.1f}s")
        _the_agent_sees_its_node(kube, real_node.name)
        _prometheus_scrapes_both(real_node, both, tmp_path)
        for pod in both:
            component = (pod.metadata.labels or {}).get("app.kubernetes.io/component", "")  # type: ignore[union-attr]
            assert process_of(pod) == EXPECTED[component], component


def _the_agent_sees_its_node(kube: Client, node: str) -> None:
    """The agent in its container: NVML through the chart's mounts, the API server with
    its ServiceAccount's token. runc hands an unprivileged container no /dev/kmsg
    (agent.kernelLog in the chart): the agent says so."""
    wait_for("the agent's GPUHealthy", lambda: gpu_healthy(kube, node)[0])
    assert gpu_healthy(kube, node)[0] == "True", gpu_healthy(kube, node)
    access = wait_for("the agent's access fact", lambda: node_annotation(kube, node, AGENT_ACCESS))
    assert "nvml=ok" in access and "gpus=8/" in access and "kmsg=unreadable" in access, access


def _prometheus_scrapes_both(real_node: RealNode, pods: list[Pod], workdir: Path) -> None:
    targets = metrics_targets(pods)
    assert len(targets) == 2, targets
    with prometheus_in(real_node, targets, workdir) as query:
        up = wait_for(
            "both scraped",
            lambda: (found := scraped(query)) and len(found) == 2 and found,
            timeout_s=60,
        )
        assert up == dict.fromkeys(targets, "1"), up
        nvml = wait_for("the agent's own metric", lambda: query("gpuheal_agent_nvml_up"))
        assert nvml[0]["value"][1] == "1"


ROUND_S = 2  # the agent's report round, short: an absence is proven over three of them
# An Xid 79 line as the driver writes it, but written by a process: facility user.
USER_SPACE_XID = (
    "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus."
)


def test_the_privileged_agent_reads_the_kernel_log_and_ignores_what_user_space_writes(
    real_node: RealNode,
    node_gpus: NodeGpus,
    control_plane: ControlPlane,
    kube: Client,
    pool: dict[str, str],
    tmp_path: Path,
) -> None:
    """agent.kernelLog.privileged: the agent reads the machine's real /dev/kmsg through
    the chart's mount; a record a process writes there (facility user) is read and
    never taken for the driver's."""
    values = chart_values(real_node, node_gpus, pool)
    values["controller"]["replicas"] = 0
    values["agent"]["kernelLog"] = {"enabled": True, "privileged": True}
    values["agent"]["config"] = {"intervalSeconds": ROUND_S}
    labels = {"nvidia.com/gpu.present": "true", **pool}
    with installed(control_plane, kube, real_node, tmp_path, values, labels) as namespace:
        (agent,) = wait_for("the agent ready", lambda: ready_pods(kube, namespace), timeout_s=90)
        try:
            wait_for("kmsg readable", lambda: "kmsg=ok" in _access(kube, real_node.name))
        except AssertionError as err:
            said = real_node.pod_logs(namespace, "gpuheal-agent")[-2000:]
            raise AssertionError(f"{err}: {_access(kube, real_node.name)}\n{said}") from err
        # Host root, every capability: what `privileged` means (docs/security.md).
        assert process_of(agent)[:2] == (0, ALL_CAPABILITIES)
        (target,) = metrics_targets([agent])
        read_before = kmsg_records(real_node, target)
        Path("/dev/kmsg").write_text(USER_SPACE_XID + "\n")
        wait_for("the record read", lambda: kmsg_records(real_node, target) > read_before)
        time.sleep(3 * ROUND_S)  # the driver's Xid 79 would be on the node by the next round
        assert node_annotation(kube, real_node.name, STATUS) != "faulty"
        assert gpu_healthy(kube, real_node.name)[0] == "True"


def _access(kube: Client, node: str) -> str:
    return node_annotation(kube, node, AGENT_ACCESS)


def get_in_network(real_node: RealNode, url: str) -> str:
    """GET `url` from inside the node's network (where the pods' addresses answer);
    "" when it does not answer."""
    fetch = (
        "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode())"
    )
    argv = real_node.in_network([sys.executable, "-c", fetch, url])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    return done.stdout if done.returncode == 0 else ""


def kmsg_records(real_node: RealNode, target: str) -> float:
    """The agent's gpuheal_agent_kmsg_records_total, from its metrics endpoint in the
    node's network."""
    found = [
        line.split()[-1]
        for line in get_in_network(real_node, f"http://{target}/metrics").splitlines()
        if line.startswith("gpuheal_agent_kmsg_records_total ")
    ]
    return float(found[0]) if found else 0.0
