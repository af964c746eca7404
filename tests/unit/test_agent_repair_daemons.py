"""A GPU reset with the node's GPU daemons (device plugin, DCGM): paused through the
GPU Operator's deploy labels, awaited, the reset, restored, restarted, awaited;
each step on disk, resumed after a restart, bounded, exactly one reset."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from gpuheal.agent import repair
from gpuheal.agent.config import AgentConfig, parse_agent_config
from gpuheal.agent.debounce import Report
from gpuheal.agent.fakenvml import FakeNvml
from gpuheal.agent.repair import RESTORING, STOPPING, Repairer, RepairLog, nvml_reset
from gpuheal.config import ConfigError
from gpuheal.model import REPAIR_REQUEST, Severity
from gpuheal.policy import daemons as policy
from gpuheal.policy.daemons import PAUSED, DaemonPod
from gpuheal.policy.repairwire import Outcome, RepairRequest, fault_digest
from gpuheal.sim.agent import gpu_spec
from gpuheal.xid import Action
from tests.corpus import EKS_NODES

NODE = EKS_NODES[0]
FAULT = f"{NODE}-20261201T092500Z-4f1c2a"
AT = "2026-12-01T09:30:00Z"
# The GPU Operator's components on a node: their deploy labels and pod labels.
DEVICE_PLUGIN = {"app": "nvidia-device-plugin-daemonset"}
DCGM_EXPORTER = {"app": "nvidia-dcgm-exporter"}
LABELS = ("nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.dcgm-exporter")
uids = itertools.count(1)


def config(**more: Any) -> AgentConfig:
    raw = {
        "repairEnabled": True,
        "repairDaemonNamespace": "gpu-operator",
        "repairPauseLabels": list(LABELS),
        "repairDaemonPods": [DEVICE_PLUGIN, DCGM_EXPORTER],
        "repairDaemonTimeoutSeconds": 1,
    }
    return parse_agent_config(raw | more)


def pod(labels: dict[str, str]) -> DaemonPod:
    n = next(uids)
    return DaemonPod(f"{labels['app']}-{n}", f"uid-{n}", labels)


class Cluster:
    """The node's labels and the operator's pods on it: a DaemonSet's pod goes when its
    deploy label is not `true` (stop_on_pause) and a new one comes when it is again."""

    def __init__(self, stop_on_pause: bool = True) -> None:
        self.labels = {k: "true" for k in LABELS} | {"nvidia.com/gpu.present": "true"}
        self.by_label = dict(zip(LABELS, (DEVICE_PLUGIN, DCGM_EXPORTER), strict=True))
        self.running = [pod(DEVICE_PLUGIN), pod(DCGM_EXPORTER)]
        self.stop_on_pause = stop_on_pause
        self.writes: list[dict[str, str]] = []
        self.deleted: list[str] = []

    namespace = "gpu-operator"

    def labels_now(self) -> dict[str, str]:
        return dict(self.labels)

    def set_labels(self, changes: dict[str, str]) -> None:
        if changes:
            self.writes.append(dict(changes))
            self.labels.update(changes)

    def pods(self) -> list[DaemonPod]:
        return list(self.running)

    def delete(self, victim: DaemonPod) -> None:
        self.deleted.append(victim.name)
        self.running = [p for p in self.running if p.uid != victim.uid]

    # the DaemonSet controller and the kubelet
    def reconcile(self) -> None:
        for key, selector in self.by_label.items():
            mine = [p for p in self.running if policy.matches(selector, p.labels)]
            if self.labels[key] != "true" and self.stop_on_pause:
                self.running = [p for p in self.running if p not in mine]
            elif self.labels[key] == "true" and not mine:
                self.running.append(pod(selector))


class Daemons:
    """Cluster as agent/daemons.py's NodeDaemons."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.namespace = cluster.namespace

    def labels(self) -> dict[str, str]:
        return self.cluster.labels_now()

    def set_labels(self, changes: dict[str, str]) -> None:
        self.cluster.set_labels(changes)

    def pods(self) -> list[DaemonPod]:
        return self.cluster.pods()

    def delete(self, victim: DaemonPod) -> None:
        self.cluster.delete(victim)


class Node:
    def __init__(self, tmp: Path, cluster: Cluster) -> None:
        self.tmp = tmp
        spec = gpu_spec(NODE, 2)
        self.spec_path = tmp / "nvml-spec.yaml"
        self.spec_path.write_text(yaml.safe_dump(spec))
        self.gpu = spec["devices"][0]["uuid"]
        self.cluster = cluster
        self.session: list[str] = []

    def agent(self, cfg: AgentConfig | None = None) -> Repairer:
        lib = FakeNvml(self.spec_path)
        return Repairer(
            cfg or config(),
            node=NODE,
            boot_id="boot-1",
            repairs=RepairLog(self.tmp / "agent-state-repair.json"),
            reset=self._logged(nvml_reset(lib)),
            nvml=lib,
            daemons=Daemons(self.cluster),  # type: ignore[arg-type]
            release_nvml=lambda: self.session.append("released"),
            resume_nvml=lambda: self.session.append("resumed"),
        )

    def _logged(self, reset: repair.Reset) -> repair.Reset:
        def run(uuid: str) -> None:
            # What the reset sees: no daemon may hold the GPU, nor the agent's session.
            held = policy.running(self.cluster.pods(), [DEVICE_PLUGIN, DCGM_EXPORTER])
            assert not held, f"reset while {held} hold the GPU"
            assert self.session[-1:] == ["released"]
            self.session.append(f"reset {uuid}")
            reset(uuid)

        return run

    def resets(self) -> list[tuple[str, str]]:
        return FakeNvml(self.spec_path).resets()


def asked() -> dict[str, str]:
    return {REPAIR_REQUEST: RepairRequest(Action.RESET_GPU, fault_digest(FAULT), 1, AT).encode()}


def report(gpu: str) -> Report:
    return Report(FAULT, AT, "ResetRequired95", "Xid 95", (gpu,), Severity.P0)


def test_the_daemons_are_paused_awaited_and_back_around_exactly_one_reset(tmp_path: Path) -> None:
    cluster = Cluster()
    node = Node(tmp_path, cluster)
    agent = node.agent()
    before = {p.uid for p in cluster.running}
    assert agent.answer(asked(), report(node.gpu)) is None  # pausing: the pods still run
    assert cluster.writes == [{k: PAUSED for k in LABELS}]
    assert (
        node.resets() == []
        and agent.log.attempts[next(iter(agent.log.attempts))].outcome == STOPPING
    )
    cluster.reconcile()  # the DaemonSet controller removes the paused components' pods
    assert agent.answer(asked(), report(node.gpu)) is None  # reset; restoring
    assert node.resets() == [(node.gpu, "ok")]
    assert node.session == ["released", f"reset {node.gpu}", "resumed"]
    assert cluster.writes[-1] == {k: "true" for k in LABELS}
    assert agent.answer(asked(), report(node.gpu)) is None  # not back yet
    cluster.reconcile()  # new pods: a fresh device plugin sees the device healthy
    assert not before & {p.uid for p in cluster.running}
    result = agent.answer(asked(), report(node.gpu))
    assert result is not None and result.outcome is Outcome.DONE
    assert result.detail == f"reset {node.gpu}; the GPU's daemons are back"
    assert len(node.resets()) == 1 and len(cluster.writes) == 2


def test_a_label_that_was_not_true_is_neither_paused_nor_restored(tmp_path: Path) -> None:
    cluster = Cluster()
    cluster.labels[LABELS[1]] = "false"  # dcgm-exporter off on this node by its owner
    cluster.running = [p for p in cluster.running if p.labels != DCGM_EXPORTER]
    node = Node(tmp_path, cluster)
    agent = node.agent()
    agent.answer(asked(), report(node.gpu))
    cluster.reconcile()
    agent.answer(asked(), report(node.gpu))
    cluster.reconcile()
    result = agent.answer(asked(), report(node.gpu))
    assert result is not None and result.outcome is Outcome.DONE
    assert cluster.writes == [{LABELS[0]: PAUSED}, {LABELS[0]: "true"}]
    assert cluster.labels[LABELS[1]] == "false"


def test_a_person_s_change_of_a_paused_label_is_kept(tmp_path: Path) -> None:
    cluster = Cluster()
    node = Node(tmp_path, cluster)
    agent = node.agent()
    agent.answer(asked(), report(node.gpu))
    cluster.reconcile()
    cluster.labels[LABELS[1]] = "false"  # a person turns dcgm-exporter off meanwhile
    agent.answer(asked(), report(node.gpu))
    assert cluster.writes[-1] == {LABELS[0]: "true"} and cluster.labels[LABELS[1]] == "false"


def test_a_daemon_that_never_stops_fails_the_attempt_by_name_and_the_labels_come_back(
    tmp_path: Path,
) -> None:
    cluster = Cluster(stop_on_pause=False)  # e.g. a DaemonSet that ignores the label
    node = Node(tmp_path, cluster)
    agent = node.agent()
    assert agent.answer(asked(), report(node.gpu)) is None
    cluster.reconcile()
    assert agent.answer(asked(), report(node.gpu)) is None  # still waiting, within bound
    # The bound passes: the wait's end, as the state file holds it, is behind us.
    ((key, waiting),) = agent.log.attempts.items()
    agent.log.put(key, msgspec.structs.replace(waiting, deadline="2026-01-01T00:00:00Z"))
    result = agent.answer(asked(), report(node.gpu))
    assert result is not None and result.outcome is Outcome.FAILED
    names = ", ".join(f"gpu-operator/{p.name}" for p in cluster.running)
    assert result.detail.startswith(f"the GPU's daemons did not stop within 1s: {names}; not reset")
    assert node.resets() == []  # never reset under a daemon
    assert cluster.labels[LABELS[0]] == "true" and cluster.labels[LABELS[1]] == "true"


def test_a_restart_at_each_step_resumes_and_never_resets_twice(tmp_path: Path) -> None:
    cluster = Cluster()
    node = Node(tmp_path, cluster)
    node.agent().answer(asked(), report(node.gpu))  # paused; the agent restarts
    cluster.reconcile()
    node.agent().answer(asked(), report(node.gpu))  # reset; restarts again
    assert node.resets() == [(node.gpu, "ok")]
    cluster.reconcile()
    result = node.agent().answer(asked(), report(node.gpu))
    assert result is not None and result.outcome is Outcome.DONE
    assert node.agent().answer(asked(), report(node.gpu)) == result
    assert len(node.resets()) == 1


def test_an_agent_killed_mid_reset_answers_failed_and_still_restores_the_daemons(
    tmp_path: Path,
) -> None:
    cluster = Cluster()
    node = Node(tmp_path, cluster)
    agent = node.agent()
    agent.answer(asked(), report(node.gpu))
    cluster.reconcile()

    def killed(uuid: str) -> None:
        raise KeyboardInterrupt  # the process dies in the middle of the reset

    agent.reset = killed
    with pytest.raises(KeyboardInterrupt):
        agent.answer(asked(), report(node.gpu))
    assert cluster.labels[LABELS[0]] == PAUSED
    restarted = node.agent()
    assert restarted.answer(asked(), report(node.gpu)) is None  # restoring
    assert cluster.labels[LABELS[0]] == "true"
    key = next(iter(restarted.log.attempts))
    assert restarted.log.attempts[key].outcome == RESTORING
    cluster.reconcile()
    result = restarted.answer(asked(), report(node.gpu))
    assert result is not None and result.outcome is Outcome.FAILED
    assert "restarted during the reset; not tried again" in result.detail
    assert node.resets() == []


def test_a_device_plugin_outside_the_operator_is_restarted_after_the_reset(
    tmp_path: Path,
) -> None:
    cluster = Cluster()
    cluster.by_label = {}  # no deploy labels: a plain device plugin DaemonSet
    cluster.labels = {}
    node = Node(tmp_path, cluster)
    cfg = config(repairPauseLabels=[], repairDaemonPods=[], repairRestartPods=[DEVICE_PLUGIN])
    old = next(p for p in cluster.running if p.labels == DEVICE_PLUGIN)
    node._logged = lambda reset: reset  # type: ignore[method-assign]  # DCGM stays
    agent = node.agent(cfg)
    assert agent.answer(asked(), report(node.gpu)) is None  # reset; device plugin deleted
    assert cluster.deleted == [old.name] and node.resets() == [(node.gpu, "ok")]
    cluster.running.append(pod(DEVICE_PLUGIN))  # its DaemonSet's new pod
    result = agent.answer(asked(), report(node.gpu))
    assert result is not None and result.outcome is Outcome.DONE
    assert cluster.deleted == [old.name]


def test_the_daemon_keys_are_checked() -> None:
    with pytest.raises(ConfigError, match="repairPauseLabels"):
        config(repairPauseLabels=["nvidia.com/gpu.deploy.device plugin"])
    with pytest.raises(ConfigError, match="repairDaemonPods"):
        config(repairDaemonPods=[{"app": "bad value!"}])
    with pytest.raises(ConfigError, match="repairDaemonNamespace"):
        parse_agent_config({"repairDaemonPods": [DEVICE_PLUGIN]})


def test_the_policy_pauses_only_true_and_restores_only_its_own() -> None:
    labels = {LABELS[0]: "true", LABELS[1]: "false", "x": "true"}
    assert policy.to_pause(labels, LABELS) == {LABELS[0]: PAUSED}
    assert policy.to_restore({LABELS[0]: PAUSED, LABELS[1]: "false"}, LABELS) == {LABELS[0]: "true"}
    old = pod(DEVICE_PLUGIN)
    new = pod(DEVICE_PLUGIN)
    assert policy.not_back([old], [DEVICE_PLUGIN], [old.uid]) == [
        "app=nvidia-device-plugin-daemonset"
    ]
    assert policy.not_back([new], [DEVICE_PLUGIN], [old.uid]) == []
    unready = DaemonPod(new.name, "uid-x", DEVICE_PLUGIN, ready=False)
    assert policy.not_back([unready], [DEVICE_PLUGIN], [old.uid]) != []
