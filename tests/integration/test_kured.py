"""A reboot through the real kured (v1.13.1, testenv/kured), end to end: an Xid 79,
gpuheal's quarantine and drain, its reboot request, the agent's sentinel, kured's
lock (an annotation on its own DaemonSet), kured's cordon and drain (the Eviction
API, as its ServiceAccount with its own manifests' RBAC), kured's reboot command,
the node back with a new boot id, the agent removing its sentinel, kured uncordoning
and releasing its lock, and gpuheal returning the node: one reboot, never a second.

kured is made to reboot the machine it runs on; it runs here only confined to PID
and mount namespaces of its own, with a harmless reboot command
(gpuheal/sim/kured.py says how, and why that is enough). A machine that cannot
confine it fails this test, saying why: kured is never run otherwise."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node

from gpuheal.model import REPAIR_REQUEST, REPAIR_RESULT
from gpuheal.policy.repairwire import Outcome, decode_request, decode_result
from gpuheal.sim import ControlPlane, kured
from gpuheal.sim.agent import AgentProcess
from gpuheal.sim.kured import KuredProcess
from gpuheal.sim.workloads import WORKLOAD_IMAGE, apply, gpu_pod, wait_pods_running
from gpuheal.xid import Action
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    events_for,
    node_annotations,
    our_taint,
    pods_on,
    record_entries,
)
from tests.integration.test_repair import AGENT, XID_79, one_record, phase, repair_config

# kured waits 30-90 s before its first look at its lock (a fixed 1-minute delaytick),
# at each start, then half a period to one and a half before its first sentinel check.
pytestmark = pytest.mark.timeout(480)

PERIOD_S = 1  # kured's --period, and the controller's repair.rebootPeriodSeconds


def plain_pod(name: str, namespace: str, node: str) -> dict[str, Any]:
    """A pod without GPUs on `node`: gpuheal's drain leaves it, kured's evicts it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": WORKLOAD_IMAGE}],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5,
        },
    }


def lock(kube: Client, namespace: str) -> dict[str, Any] | None:
    """kured's lock: the annotation on its DaemonSet (nodeID, metadata, created, TTL)."""
    meta = kube.get(DaemonSet, kured.DS_NAME, namespace=namespace).metadata
    said = ((meta.annotations if meta else None) or {}).get(kured.LOCK_ANNOTATION)
    return json.loads(said) if said else None


def cordoned(kube: Client, node: str) -> bool:
    spec = kube.get(Node, node).spec
    return bool(spec and spec.unschedulable)


@pytest.fixture
def confined() -> None:
    """kured runs confined or not at all: a machine that cannot fails the test."""
    problem = kured.confinement_problem()
    if problem is not None:
        pytest.fail(f"kured is not run unconfined, and cannot be confined here: {problem}")


@pytest.fixture
def processes() -> Iterator[list[AgentProcess | KuredProcess]]:
    started: list[AgentProcess | KuredProcess] = []
    yield started
    for process in started:
        process.stop()
    for process in started:
        name = "kured" if isinstance(process, KuredProcess) else "agent"
        print(f"--- {name} {process.node} log (tail) ---\n{process.log()[-6000:]}")


def test_kured_reboots_the_node_gpuheal_asked_to_once_and_gpuheal_returns_it(
    confined: None,
    control_plane: ControlPlane,
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    processes: list[AgentProcess | KuredProcess],
    start_controller: StartController,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_pod("train-0", namespace, node_name=node))
    apply(kube, plain_pod("logs-0", namespace, node))
    wait_pods_running(kube, namespace, count=2)
    # settleSeconds: room for the agent's healthy rounds after the reboot (the result's
    # time is whole seconds); 1 s could call the reboot ineffective as the fault clears.
    start_controller(repair_config(pool, rebootPeriodSeconds=PERIOD_S, settleSeconds=30))
    agent = AgentProcess(tmp_path, control_plane.kubeconfig, node, AGENT)
    processes.append(agent)
    own_mnt, own_pid = kured.own_namespaces()

    with kured.installed(kube, namespace, node_selector=pool) as token:
        daemon = KuredProcess(
            tmp_path, node=node, namespace=namespace, server=control_plane.server,
            ca_cert=control_plane.ca_cert, token=token, sentinel=agent.reboot_sentinel,
            period_s=PERIOD_S,
        )  # fmt: skip
        processes.append(daemon)
        daemon.start()
        assert "kured jail: PID 1 of pid:[" in daemon.log()
        assert "Kubernetes Reboot Daemon: 1.13.1" in daemon.log()
        # The tmpfs with the service-account files is the jail's alone.
        assert daemon.tmpfs_source not in Path("/proc/self/mountinfo").read_text()
        agent.start()

        agent.kernel(XID_79)
        wait_for("the reboot asked for", agent.reboot_sentinel.exists, timeout_s=60)
        assert agent.reboot_sentinel.read_text().startswith("gpuheal ")
        request = decode_request(node_annotations(kube, node)[REPAIR_REQUEST])
        assert request is not None and request.action is Action.REBOOT
        assert "train-0" not in pods_on(kube, namespace, node)  # gpuheal's drain

        (reboot,) = wait_for("kured's reboot", daemon.reboots, timeout_s=150)
        # Its reboot command ran through nsenter -m/proc/1/ns/mnt, in the jail's
        # namespaces: never the test's (nor, so, the machine's).
        nsenter = f"[/usr/bin/nsenter -m/proc/1/ns/mnt -- {daemon.reboot_command}]"
        assert f"Running command: {nsenter} for node: {node}" in daemon.log()
        assert reboot.mnt != own_mnt and reboot.pid != own_pid, reboot
        held = lock(kube, namespace)
        assert held is not None and held["nodeID"] == node, held
        assert held["metadata"] == {"unschedulable": False}  # so it uncordons after
        assert cordoned(kube, node)  # kured's drain: cordon, then evict
        assert f"evicting pod {namespace}/logs-0" in daemon.log()
        assert "logs-0" not in pods_on(kube, namespace, node)
        assert REPAIR_RESULT not in node_annotations(kube, node)  # answered once back

        # The node reboots: kured dies with it; /var/run is no tmpfs here, so the
        # sentinel outlives the reboot, and only the agent can take it away.
        daemon.power_off()
        agent.stop()
        agent.reboot(run_is_tmpfs=False)
        assert agent.reboot_sentinel.exists()
        daemon.start()  # its pod comes back with the node, the agent's too
        agent.start()

        wait_for("the sentinel removed", lambda: not agent.reboot_sentinel.exists(), 10)
        assert "reboot sentinel removed" in agent.log()
        wait_for("the node returned", lambda: our_taint(kube, node) is None, timeout_s=90)
        record = one_record(kube, node)
        wait_for("record Resolved", lambda: phase(kube, record.metadata.name) == "Resolved")
        wait_for("kured's lock released", lambda: lock(kube, namespace) is None, 120)
        assert not cordoned(kube, node)  # kured uncordoned it before the release
        # Three of its periods with the lock free and the node up: no second reboot.
        wait_for(
            "three looks at the sentinel",
            lambda: daemon.log_since_start().count("Reboot not required") >= 3,
            timeout_s=10 * PERIOD_S,
        )
        assert "Reboot required" not in daemon.log_since_start()

    assert len(daemon.reboots()) == 1
    assert daemon.log().count("Running command:") == 1
    assert daemon.log().count("Acquired reboot lock") == 1
    record = one_record(kube, node)
    assert len(record_entries(record, "repair-requested")) == 1
    assert [e["detail"].split(":")[0] for e in record_entries(record, "repaired")] == [
        "reboot attempt 1"
    ]
    assert not record_entries(record, "repair-failed")
    assert not (record.status or {}).get("contactSupport")
    result = decode_result(node_annotations(kube, node)[REPAIR_RESULT])
    assert result is not None and result.outcome is Outcome.DONE and "rebooted" in result.detail
    assert decode_request(node_annotations(kube, node)[REPAIR_REQUEST]) == request  # asked once
    assert len(events_for(kube, node, "GPUFaultRecovered", at_least=1)) == 1
    assert agent.resets() == []


NO_MOUNT_NS = ["unshare", "--pid", "--fork", "--kill-child"]
NO_OWN_PROC = [*NO_MOUNT_NS, "--mount", "--propagation", "private"]


@pytest.mark.parametrize(
    ("confinement", "reason"),
    [
        ([], "not PID 1 of a PID namespace of its own"),
        (NO_MOUNT_NS, "it runs in the test's own mount namespace"),
        (NO_OWN_PROC, "/proc/1 is not this PID namespace's init"),
    ],
    ids=["none", "no-mount-namespace", "no-own-proc"],
)
def test_the_jail_refuses_to_start_kured_unless_it_is_confined(
    confined: None, tmp_path: Path, confinement: list[str], reason: str
) -> None:
    """The jail script, run without all of its namespaces, starts nothing (here a
    stand-in for kured that only prints) and mounts nothing: it says why and exits 70."""
    jail = tmp_path / "jail.sh"
    jail.write_text(kured.JAIL)
    mnt, pid = kured.own_namespaces()
    source = "gpuheal-kured-refused"
    env = {
        **os.environ,
        "KURED_NODE_ID": "n",
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": "1",
    }
    done = subprocess.run(
        [*confinement, "/bin/sh", str(jail), mnt, pid, str(tmp_path / "sa"), source,
         str(tmp_path), "/bin/echo", "kured started"],
        capture_output=True, text=True, timeout=10, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 70, done
    assert done.stderr.startswith("kured jail: refusing to start kured: "), done.stderr
    assert reason in done.stderr, done.stderr
    assert "kured started" not in done.stdout
    assert source not in Path("/proc/self/mountinfo").read_text()
