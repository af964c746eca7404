"""`gpuheal doctor`'s reasoning, from hand-built API objects (no server)."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import msgspec
import pytest
import yaml
from rich.console import Console

from gpuheal.clock import duration
from gpuheal.config import Config, ConfigError, parse_config
from gpuheal.kube.details import (
    Event,
    LabelSelector,
    Node,
    Pod,
    PodDisruptionBudget,
    ResourceQuota,
    SelectorRequirement,
    Taint,
    Toleration,
)
from gpuheal.model import (
    FAULT_ID,
    FAULT_TIME,
    MAINTENANCE_REASON,
    MAINTENANCE_SINCE,
    STATE_LABEL,
    STATUS,
    TAINT_KEY,
    ActionEntry,
    FaultRecord,
    Phase,
)
from gpuheal.ops import exitcodes
from gpuheal.ops.diagnosis import Diagnosis, diagnose
from gpuheal.ops.doctor import latest_messages
from gpuheal.ops.findings import Facts, listed
from gpuheal.ops.movement import pending_causes
from gpuheal.ops.neighbours import rack_of
from gpuheal.ops.output import render
from gpuheal.ops.scheduling import (
    admits,
    gpu_requests,
    selector_matches,
    tolerates,
    usage_by_node,
)
from gpuheal.sim.nodes import gpu_node
from gpuheal.sim.workloads import gpu_pod

T = TypeVar("T")
NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
CONFIG = Config()
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def load(kind: type[T], manifest: Mapping[str, Any]) -> T:
    """An API object from its manifest, as the doctor decodes it (kube/details.py)."""
    return msgspec.json.decode(json.dumps(manifest), type=kind)


def stamp(ago_s: float) -> str:
    return (NOW - dt.timedelta(seconds=ago_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(
    name: str = "n1",
    *,
    gpus: int = 8,
    allocatable: int | None = None,
    ready: str = "True",
    pool: str = "h100",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
    conditions: Sequence[Mapping[str, str]] = (),
) -> Node:
    manifest = gpu_node(
        name,
        gpus=gpus,
        labels={"gpuheal.io/pool": pool, **(labels or {})},
        annotations=annotations,
        taints=taints,
    )
    if allocatable is not None:
        manifest["status"]["allocatable"] = {
            **manifest["status"]["allocatable"],
            "nvidia.com/gpu": str(allocatable),
        }
    manifest["status"]["conditions"] = [
        {
            "type": "Ready",
            "status": ready,
            "reason": "KubeletReady" if ready == "True" else "KubeletNotReady",
            "message": "container runtime is down" if ready == "False" else "",
            "lastTransitionTime": stamp(3600),
        },
        *conditions,
    ]
    if unschedulable:
        manifest["spec"]["unschedulable"] = True
    return load(Node, manifest)


def pod(
    name: str,
    *,
    gpus: int = 1,
    namespace: str = "ml",
    node_name: str | None = None,
    phase: str = "Running",
    labels: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    node_selector: Mapping[str, str] | None = None,
    affinity: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    status: Mapping[str, Any] | None = None,
) -> Pod:
    manifest = gpu_pod(
        name,
        namespace,
        gpus=gpus,
        node_name=node_name,
        labels=labels,
        tolerations=tolerations,
        node_selector=node_selector,
    )
    manifest["metadata"].update(
        {"uid": f"uid-{name}", "creationTimestamp": stamp(600), **(meta or {})}
    )
    if affinity:
        manifest["spec"]["affinity"] = dict(affinity)
    manifest["status"] = {"phase": phase, **(status or {})}
    return load(Pod, manifest)


def facts(target: Node | None, **kw: Any) -> Facts:
    nodes = kw.pop("nodes", [target] if target is not None else [])
    return Facts(name=kw.pop("name", "n1"), node=target, now=NOW, nodes=nodes, **kw)


def kinds(diagnosis: Diagnosis, question: str | None = None) -> dict[str, str]:
    """kind -> severity of every finding (of one question)."""
    return {
        f.kind: f.severity
        for a in diagnosis.answers
        if question is None or a.id == question
        for f in a.findings
    }


def text_of(diagnosis: Diagnosis, kind: str) -> str:
    return next(f.text for a in diagnosis.answers for f in a.findings if f.kind == kind)


def table(diagnosis: Diagnosis) -> str:
    out = io.StringIO()
    render(diagnosis, "table", Console(file=out, width=200, soft_wrap=True))
    return out.getvalue()


# -- the report -----------------------------------------------------------------------


def test_a_missing_node_stops_at_the_first_question_with_exit_5() -> None:
    diagnosis = diagnose(facts(None, name="ghost"), CONFIG)
    assert diagnosis.exit_code == exitcodes.NOT_FOUND
    assert [a.id for a in diagnosis.answers] == ["ready"]
    assert kinds(diagnosis) == {"not-registered": "bad"}
    assert "systemctl status kubelet" in text_of(diagnosis, "not-registered")
    assert diagnosis.data()["healthy"] is False


def test_a_healthy_node_answers_all_four_questions_and_exits_0() -> None:
    target = node()
    peer = node("n2")
    diagnosis = diagnose(facts(target, nodes=[target, peer], faults=[]), CONFIG)
    assert diagnosis.exit_code == exitcodes.OK, kinds(diagnosis)
    assert [a.id for a in diagnosis.answers] == ["ready", "gpus", "workloads", "affected"]
    assert all(s in ("ok", "info") for s in kinds(diagnosis).values())
    found = kinds(diagnosis)
    assert {"ready", "gpus-visible", "nothing-waiting", "pool-healthy"} <= set(found)
    data = diagnosis.data()
    assert data["node"] == "n1" and data["healthy"] is True
    assert set(data["questions"][0]) == {"id", "question", "findings"}
    assert set(data["questions"][0]["findings"][0]) == {"severity", "kind", "text"}
    json.dumps(data)  # serialisable as is
    text = table(diagnosis)
    assert "1. Is the node registered and Ready?" in text
    assert "4. What else is affected?" in text
    assert "nothing wrong found" in text


@pytest.mark.parametrize(
    ("ready", "phrase"),
    [("False", "NotReady since 2025-03-01 11:00:00Z (1h ago)"), ("Unknown", "Unknown since")],
)
def test_not_ready_says_since_when_and_why(ready: str, phrase: str) -> None:
    diagnosis = diagnose(facts(node(ready=ready), faults=[]), CONFIG)
    assert kinds(diagnosis, "ready")["not-ready"] == "bad"
    assert phrase in text_of(diagnosis, "not-ready")
    assert diagnosis.exit_code == exitcodes.FINDINGS
    if ready == "False":
        assert "container runtime is down" in text_of(diagnosis, "not-ready")


def test_pressure_and_a_foreign_cordon_are_named() -> None:
    pressure = {"type": "DiskPressure", "status": "True", "lastTransitionTime": stamp(60)}
    diagnosis = diagnose(facts(node(unschedulable=True, conditions=[pressure]), faults=[]), CONFIG)
    assert kinds(diagnosis, "ready")["node-pressure"] == "warn"
    assert "DiskPressure" in text_of(diagnosis, "node-pressure")
    assert "kubectl uncordon n1" in text_of(diagnosis, "cordoned")


def test_maintenance_is_reported_with_its_reason() -> None:
    target = node(
        labels={STATE_LABEL: "maintenance"},
        annotations={MAINTENANCE_REASON: "driver upgrade", MAINTENANCE_SINCE: stamp(600)},
        taints=[{"key": "gpuheal.io/maintenance", "effect": "NoSchedule"}],
        unschedulable=True,
    )
    diagnosis = diagnose(facts(target, faults=[]), CONFIG)
    assert "driver upgrade" in text_of(diagnosis, "in-maintenance")
    assert kinds(diagnosis, "gpus")["maintenance-taint"] == "info"


# -- 2. GPUs --------------------------------------------------------------------------


def test_zero_allocatable_with_capacity_blames_unhealthy_devices() -> None:
    diagnosis = diagnose(facts(node(allocatable=0), faults=[]), CONFIG)
    assert kinds(diagnosis, "gpus")["zero-allocatable"] == "bad"
    text = text_of(diagnosis, "zero-allocatable")
    assert text.startswith("allocatable nvidia.com/gpu is 0 while the node should offer 8")
    assert "none healthy" in text
    # No device plugin on a node without GPUs: that is the cause, not a detail.
    assert kinds(diagnosis, "gpus")["device-plugin-missing"] == "bad"


def test_zero_allocatable_without_capacity_blames_registration() -> None:
    diagnosis = diagnose(facts(node(gpus=0, labels={"nvidia.com/gpu.count": "8"})), CONFIG)
    assert "has not registered the GPUs" in text_of(diagnosis, "zero-allocatable")


def test_fewer_gpus_than_expected() -> None:
    diagnosis = diagnose(facts(node(allocatable=6), faults=[]), CONFIG)
    text = text_of(diagnosis, "gpus-missing")
    assert "offers 6 allocatable GPUs but should offer 8" in text
    assert "reports 2 unhealthy" in text


def test_the_pool_config_sets_the_expected_count() -> None:
    config = parse_config({"pools": {"byName": {"h100": {"gpusPerNode": 4}}}})
    diagnosis = diagnose(facts(node(), faults=[]), config)
    assert "more than the 4 expected (gpusPerNode of pool h100)" in text_of(
        diagnosis, "gpus-unexpected"
    )


def test_mig_resources_are_listed_separately() -> None:
    manifest = gpu_node("n1", gpus=0)
    mig = {"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"}
    manifest["status"]["capacity"] = {**manifest["status"]["capacity"], **mig}
    manifest["status"]["allocatable"] = {**manifest["status"]["allocatable"], **mig}
    manifest["metadata"]["labels"]["nvidia.com/gpu.count"] = "9"
    target = load(Node, manifest)
    text = text_of(diagnose(facts(target, faults=[]), CONFIG), "gpus-visible")
    assert "nvidia.com/mig-1g.10gb: 7 allocatable of 7 capacity" in text
    assert "nvidia.com/mig-3g.40gb: 2 allocatable" in text


def test_device_plugin_pod_states() -> None:
    plugin = {"app": "nvidia-device-plugin-daemonset"}
    broken = pod(
        "dp-a",
        gpus=0,
        namespace="gpu-operator",
        node_name="n1",
        labels=plugin,
        status={
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "x",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 9,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                }
            ]
        },
    )
    diagnosis = diagnose(facts(node(), pods_on_node=[broken], faults=[]), CONFIG)
    assert "CrashLoopBackOff" in text_of(diagnosis, "device-plugin-not-ready")
    flapping = pod(
        "dp-b",
        gpus=0,
        namespace="gpu-operator",
        node_name="n1",
        labels=plugin,
        status={
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "x",
                    "imageID": "",
                    "ready": True,
                    "restartCount": 4,
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
                }
            ]
        },
    )
    diagnosis = diagnose(facts(node(), pods_on_node=[flapping], faults=[]), CONFIG)
    assert "restarted 4 times (last: Error)" in text_of(diagnosis, "device-plugin-restarting")


def test_missing_labels_are_named() -> None:
    target = node()
    assert target.metadata is not None and target.metadata.labels is not None
    del target.metadata.labels["nvidia.com/gpu.present"]
    del target.metadata.labels["nvidia.com/gpu.count"]
    diagnosis = diagnose(facts(target, faults=[]), CONFIG)
    texts = [f.text for a in diagnosis.answers for f in a.findings if f.kind == "missing-label"]
    assert any("nvidia.com/gpu.present=true is missing" in t for t in texts)
    assert any("nvidia.com/gpu.count is missing" in t for t in texts)


def test_a_maintenance_taint_without_the_label_was_left_behind() -> None:
    target = node(taints=[{"key": "gpuheal.io/maintenance", "effect": "NoSchedule"}])
    diagnosis = diagnose(facts(target, faults=[]), CONFIG)
    assert kinds(diagnosis, "gpus")["stale-maintenance-taint"] == "bad"
    assert "gpuheal maintenance finish n1" in text_of(diagnosis, "stale-maintenance-taint")
    assert diagnosis.exit_code == exitcodes.FINDINGS


def test_a_maintenance_far_older_than_the_drain_timeout_is_overdue() -> None:
    target = node(
        labels={STATE_LABEL: "maintenance"},
        annotations={MAINTENANCE_SINCE: stamp(5 * 3600)},
        taints=[{"key": "gpuheal.io/maintenance", "effect": "NoSchedule"}],
    )
    diagnosis = diagnose(facts(target, faults=[]), CONFIG)
    assert "in maintenance for 5h" in text_of(diagnosis, "maintenance-overdue")


def record(fault_id: str, phase: Phase) -> FaultRecord:
    return FaultRecord(
        name="n1-abc",
        node="n1",
        fault_id=fault_id,
        phase=phase,
        reason="XidCritical79",
        detected_at=stamp(120),
    )


def test_our_fault_taint_is_explained_by_its_record_or_called_left_behind() -> None:
    target = node(taints=[{"key": TAINT_KEY, "value": "f-1", "effect": "NoSchedule"}])
    quarantined = diagnose(facts(target, faults=[record("f-1", Phase.DRAINED)]), CONFIG)
    text = text_of(quarantined, "quarantined")
    assert "fault f-1 (XidCritical79, phase Drained)" in text
    assert "kubectl get gpufault n1-abc" in text
    stale = diagnose(facts(target, faults=[record("f-1", Phase.RESOLVED)]), CONFIG)
    assert "kubectl taint node n1 gpuheal.io/gpu-fault-" in text_of(stale, "stale-fault-taint")
    unknown = diagnose(facts(target, faults=None), CONFIG)
    assert "could not be read" in text_of(unknown, "quarantined")


def test_the_agents_fault_report_is_shown() -> None:
    target = node(annotations={STATUS: "faulty", FAULT_ID: "f-9"})
    diagnosis = diagnose(facts(target, faults=[]), CONFIG)
    assert "fault f-9" in text_of(diagnosis, "gpu-fault-reported")


def test_a_foreign_taint_is_context_not_a_problem() -> None:
    diagnosis = diagnose(facts(node(taints=[GPU_TAINT]), faults=[]), CONFIG)
    assert kinds(diagnosis, "gpus")["taint"] == "info"
    assert diagnosis.exit_code == exitcodes.OK


# -- 3. workloads ---------------------------------------------------------------------


def pending(name: str, **kw: Any) -> Pod:
    return pod(name, phase="Pending", **kw)


def test_a_missing_toleration_is_named_with_the_toleration_to_add() -> None:
    nodes = [node(f"n{i}", pool="dedicated", taints=[GPU_TAINT]) for i in (1, 2, 3)]
    waiting = pending("train-0", node_selector={"gpuheal.io/pool": "dedicated"})
    diagnosis = diagnose(
        facts(
            nodes[0],
            nodes=nodes,
            pending=[waiting],
            bound_pods=[],
            faults=[],
            scheduler_says={"uid-train-0": "0/3 nodes are available: 3 node(s) had untolerated"},
        ),
        CONFIG,
    )
    assert kinds(diagnosis, "workloads")["missing-toleration"] == "bad"
    text = text_of(diagnosis, "missing-toleration")
    assert "does not tolerate taint nvidia.com/gpu=present:NoSchedule" in text
    assert "3 of the 3 nodes it may use carry (n1, n2, n3)" in text
    assert "{key: nvidia.com/gpu, operator: Equal, value: present, effect: NoSchedule}" in text
    assert "the scheduler says: 0/3 nodes are available" in text_of(diagnosis, "pending")
    assert diagnosis.exit_code == exitcodes.FINDINGS


def test_replicas_of_one_workload_share_one_diagnosis() -> None:
    nodes = [node("n1", taints=[GPU_TAINT])]
    owner = {
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "trainer-5d8f",
                "uid": "rs-1",
                "controller": True,
            }
        ]
    }
    replicas = [
        pending(f"trainer-5d8f-{i}", labels={"pod-template-hash": "5d8f"}, meta=owner) for i in "ab"
    ]
    diagnosis = diagnose(
        facts(nodes[0], nodes=nodes, pending=replicas, bound_pods=[], faults=[]), CONFIG
    )
    causes = [f for a in diagnosis.answers for f in a.findings if f.kind == "missing-toleration"]
    assert len(causes) == 1
    assert causes[0].text.startswith(
        "2 pods of Deployment ml/trainer (ml/trainer-5d8f-a, ml/trainer-5d8f-b) do not tolerate"
    )
    assert "to their pod template" in causes[0].text


def test_what_could_not_be_read_is_said() -> None:
    diagnosis = diagnose(facts(node(), faults=None, unread=["Events in ml (forbidden)"]), CONFIG)
    assert diagnosis.data()["unread"] == ["Events in ml (forbidden)"]
    assert "Could not read Events in ml (forbidden)." in table(diagnosis)


def test_a_request_larger_than_any_node() -> None:
    nodes = [node("n1"), node("n2")]
    waiting = pending("big", gpus=16, node_selector={"gpuheal.io/pool": "h100"})
    diagnosis = diagnose(facts(nodes[0], nodes=nodes, pending=[waiting], faults=[]), CONFIG)
    text = text_of(diagnosis, "request-too-large")
    assert text.startswith("Pod ml/big requests 16 nvidia.com/gpu but the largest node")
    assert "offers 8" in text


def test_no_free_gpus_in_the_candidates() -> None:
    nodes = [node("n1"), node("n2")]
    busy = [pod(f"run-{i}", gpus=6, node_name=f"n{i}") for i in (1, 2)]
    waiting = pending("wait", gpus=4)
    diagnosis = diagnose(
        facts(nodes[0], nodes=nodes, pending=[waiting], bound_pods=busy, faults=[]), CONFIG
    )
    assert "2 of the 2 nodes it may use have fewer free GPUs" in text_of(
        diagnosis, "insufficient-gpus"
    )


def test_candidates_down_or_quarantined_are_grouped() -> None:
    quarantined = node("n1", taints=[{"key": TAINT_KEY, "value": "f", "effect": "NoSchedule"}])
    down = node("n2", ready="False")
    waiting = pending("wait")
    diagnosis = diagnose(
        facts(quarantined, nodes=[quarantined, down], pending=[waiting], faults=None), CONFIG
    )
    found = kinds(diagnosis, "workloads")
    assert found["candidates-quarantined"] == "bad" and found["candidates-not-ready"] == "bad"


def test_pending_pods_that_cannot_use_the_node_are_context_only() -> None:
    target = node()
    elsewhere = pending("other", node_selector={"gpuheal.io/pool": "a100"})
    diagnosis = diagnose(facts(target, pending=[elsewhere], faults=[]), CONFIG)
    assert kinds(diagnosis, "workloads")["other-pending"] == "info"
    assert diagnosis.exit_code == exitcodes.OK


def test_a_selector_no_node_matches_is_named() -> None:
    lost = pending("lost", node_selector={"gpuheal.io/pool": "a10"})
    found = pending_causes([lost], facts(node(), nodes=[node()]), CONFIG, usage=None)
    assert [f.kind for f in found] == ["pending", "no-matching-node"]
    assert "nodeSelector gpuheal.io/pool=a10 matches no node" in found[1].text


def test_required_node_affinity_is_honoured() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "gpuheal.io/pool", "operator": "In", "values": ["a100"]}
                        ]
                    }
                ]
            }
        }
    }
    waiting = pending("aff", affinity=affinity)
    assert not admits(waiting, node(pool="h100"))
    assert admits(waiting, node(pool="a100"))


def pdb(name: str, allowed: int, selector: Mapping[str, str]) -> PodDisruptionBudget:
    result = load(
        PodDisruptionBudget,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"selector": {"matchLabels": dict(selector)}, "minAvailable": 2},
            "status": {
                "disruptionsAllowed": allowed,
                "currentHealthy": 2,
                "desiredHealthy": 2,
                "expectedPods": 2,
                "observedGeneration": 1,
            },
        },
    )
    return result


def test_a_pdb_blocks_the_drain_of_a_cordoned_node() -> None:
    running = [pod(f"srv-{i}", node_name="n1", labels={"app": "srv"}) for i in (1, 2)]
    budget = pdb("srv-pdb", 0, {"app": "srv"})
    cordoned = node(unschedulable=True)
    diagnosis = diagnose(facts(cordoned, pods_on_node=running, pdbs=[budget], faults=[]), CONFIG)
    text = text_of(diagnosis, "pdb-blocks")
    assert "PodDisruptionBudget ml/srv-pdb allows 0 disruptions" in text
    assert "ml/srv-1, ml/srv-2" in text
    assert "pods-remain" not in kinds(diagnosis)
    # On a node nobody drains, the same budget is only a warning of what would wait.
    calm = diagnose(facts(node(), pods_on_node=running, pdbs=[budget], faults=[]), CONFIG)
    assert kinds(calm, "workloads")["pdb-would-block"] == "info"
    assert calm.exit_code == exitcodes.OK


def test_gpu_pods_left_on_a_cordoned_node() -> None:
    running = [pod("job", node_name="n1")]
    diagnosis = diagnose(facts(node(unschedulable=True), pods_on_node=running, faults=[]), CONFIG)
    assert "gpuheal maintenance start n1" in text_of(diagnosis, "pods-remain")


def test_a_pod_stuck_terminating_on_a_finalizer() -> None:
    stuck = pod(
        "stuck",
        node_name="n1",
        meta={"deletionTimestamp": stamp(900), "finalizers": ["example.com/cleanup"]},
    )
    diagnosis = diagnose(facts(node(), pods_on_node=[stuck], faults=[]), CONFIG)
    assert "held by finalizer example.com/cleanup" in text_of(diagnosis, "stuck-terminating")


def test_an_exhausted_gpu_quota() -> None:
    quota = load(
        ResourceQuota,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": "ml"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "8"}},
            "status": {
                "hard": {"requests.nvidia.com/gpu": "8", "requests.cpu": "100"},
                "used": {"requests.nvidia.com/gpu": "8", "requests.cpu": "1"},
            },
        },
    )
    diagnosis = diagnose(facts(node(), quotas=[quota], faults=[]), CONFIG)
    assert "ResourceQuota ml/gpus is used up for requests.nvidia.com/gpu (8 of 8)" in text_of(
        diagnosis, "quota-exhausted"
    )
    assert list(kinds(diagnosis)).count("quota-exhausted") == 1  # cpu is not ours


# -- 4. what else ---------------------------------------------------------------------


def test_a_pool_with_several_nodes_down_suggests_a_shared_cause() -> None:
    nodes = [node(f"n{i}", ready="False" if i <= 3 else "True") for i in range(1, 9)]
    diagnosis = diagnose(facts(nodes[0], nodes=nodes, faults=[]), CONFIG)
    text = text_of(diagnosis, "pool-degraded")
    assert text.startswith("3 of the 8 nodes of pool h100 do not serve GPUs: 3 NotReady")
    assert "(n1, n2, n3)" in text and "shared cause" in text


def test_a_local_problem_is_called_local() -> None:
    nodes = [node("n1", ready="False"), node("n2")]
    diagnosis = diagnose(facts(nodes[0], nodes=nodes, faults=[]), CONFIG)
    assert "local to n1" in text_of(diagnosis, "pool-healthy")


def test_neighbours_in_maintenance_are_the_labelled_ones_as_everywhere_else() -> None:
    # One rule (policy/nodes.py): the state label. A maintenance taint left behind
    # without it is a stale taint (doctor says so on that node), not a maintenance.
    labelled = node("n2", labels={STATE_LABEL: "maintenance"})
    stale_taint = node("n3", taints=[{"key": "gpuheal.io/maintenance", "effect": "NoSchedule"}])
    target = node("n1")
    diagnosis = diagnose(facts(target, nodes=[target, labelled, stale_taint], faults=[]), CONFIG)
    text = text_of(diagnosis, "pool-maintenance")
    assert text.startswith("1 other node of pool h100 is in maintenance (n2)")


def test_rack_and_driver_neighbours() -> None:
    driver = {"gpuheal.io/driver-version": "550.54"}
    rack = {"topology.kubernetes.io/rack": "r7"}
    target = node("n1", annotations=driver, labels=rack)
    same_rack = node("n2", pool="other", labels=rack, ready="Unknown")
    drifted = node("n3", annotations={"gpuheal.io/driver-version": "535.1"})
    agree = node("n4", annotations=driver)
    diagnosis = diagnose(
        facts(target, nodes=[target, same_rack, drifted, agree], faults=[]), CONFIG
    )
    assert "rack r7" in text_of(diagnosis, "rack-degraded")
    assert kinds(diagnosis)["driver-healthy"] == "ok"
    drift = diagnose(facts(drifted, name="n3", nodes=[target, drifted, agree], faults=[]), CONFIG)
    assert "runs driver 535.1 while pool h100 runs 550.54 (2 of its 3 nodes)" in text_of(
        drift, "driver-drift"
    )


def test_rack_labels_are_configurable_and_validated() -> None:
    assert Config().pools.rack_labels == ("topology.kubernetes.io/rack", "rack")
    config = parse_config({"pools": {"rackLabels": ["example.com/rack"]}})
    assert rack_of({"example.com/rack": "r1", "rack": "r2"}, config) == "r1"
    assert rack_of({"rack": "r2"}, config) == ""
    with pytest.raises(ConfigError, match=r"pools\.rackLabels: must be a list"):
        parse_config({"pools": {"rackLabels": "rack"}})


# -- the scheduler's rules ------------------------------------------------------------


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),
        ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, True),
        ({"key": "nvidia.com/gpu", "value": "other"}, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"operator": "Exists"}, True),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_tolerations_match_like_the_scheduler(toleration: dict[str, str], expected: bool) -> None:
    taint = Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
    assert tolerates([load(Toleration, toleration)], taint) is expected


def test_label_selectors() -> None:
    labels = {"app": "srv", "tier": "gpu"}
    assert not selector_matches(None, labels)
    assert selector_matches(LabelSelector(), labels)
    assert selector_matches(LabelSelector(matchLabels={"app": "srv"}), labels)
    expression = SelectorRequirement(key="tier", operator="NotIn", values=["cpu"])
    assert selector_matches(LabelSelector(matchExpressions=[expression]), labels)
    absent = SelectorRequirement(key="tier", operator="DoesNotExist")
    assert not selector_matches(LabelSelector(matchExpressions=[absent]), labels)


def test_gpu_requests_and_usage() -> None:
    worker = pod("w", gpus=2, node_name="n1")
    assert gpu_requests(worker, CONFIG) == {"nvidia.com/gpu": 2}
    done = pod("d", gpus=8, node_name="n1", phase="Succeeded")
    usage = usage_by_node([worker, done], CONFIG)
    assert usage["n1"].free({"nvidia.com/gpu": 8}, "nvidia.com/gpu") == 6


def test_the_newest_scheduler_message_wins() -> None:
    def event(message: str, last: str) -> Event:
        return load(
            Event,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": message, "namespace": "ml"},
                "involvedObject": {"kind": "Pod", "uid": "u1"},
                "reason": "FailedScheduling",
                "message": message,
                "lastTimestamp": last,
            },
        )

    assert latest_messages([event("new", stamp(5)), event("old", stamp(50))]) == {"u1": "new"}


def test_the_api_servers_nulls_decode_as_unknown_times() -> None:
    # The scheduler writes events.k8s.io/v1 Events: read as core/v1, their old
    # timestamps are null, the time is in eventTime or the series.
    def event(message: str, **times: Any) -> Event:
        return load(
            Event,
            {
                "metadata": {"name": message, "namespace": "ml", "creationTimestamp": None},
                "involvedObject": {"kind": "Pod", "uid": "u1"},
                "message": message,
                "firstTimestamp": None,
                "lastTimestamp": None,
                "eventTime": None,
                "series": None,
            }
            | times,
        )

    newest = event("new", series={"lastObservedTime": "2025-03-01T11:59:00.123456Z", "count": 3})
    older = event("old", eventTime="2025-03-01T11:58:00.654321Z")
    unknown = event("unknown")
    assert latest_messages([newest, older, unknown]) == {"u1": "new"}
    assert latest_messages([unknown, older]) == {"u1": "old"}

    manifest = gpu_node("n1", gpus=8, labels={"gpuheal.io/pool": "h100"})
    manifest["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "lastTransitionTime": None}
    ]
    ready = diagnose(Facts(name="n1", node=load(Node, manifest), now=NOW), CONFIG).answers[0]
    assert "Ready since an unknown time" in ready.findings[0].text


def test_text_helpers() -> None:
    assert [duration(s) for s in (5, 120, 3 * 3600 + 720, 2 * 86400 + 4 * 3600)] == [
        "5s",
        "2m",
        "3h12m",
        "2d4h",
    ]
    assert listed(["a", "b"]) == "a, b"
    assert listed([str(i) for i in range(8)]) == "0, 1, 2, 3, 4 and 3 more"


def test_yaml_output_carries_the_same_data() -> None:
    diagnosis = diagnose(facts(node(allocatable=0), faults=[]), CONFIG)
    out = io.StringIO()
    render(diagnosis, "yaml", Console(file=out, width=200))
    assert yaml.safe_load(out.getvalue()) == diagnosis.data()


def test_malformed_annotations_are_read_as_unknown_not_a_crash() -> None:
    target = node(
        labels={STATE_LABEL: "maintenance"},
        annotations={
            MAINTENANCE_SINCE: "last tuesday",
            STATUS: "faulty",
            FAULT_TIME: "?",
        },
        taints=[{"key": "gpuheal.io/maintenance", "effect": "NoSchedule"}],
    )
    diagnosis = diagnose(facts(target, faults=[]), CONFIG)
    assert "in maintenance since an unknown time" in text_of(diagnosis, "in-maintenance")
    assert "since an unknown time" in text_of(diagnosis, "gpu-fault-reported")
    assert kinds(diagnosis, "gpus")["maintenance-taint"] == "info"  # age unknown: not overdue


# -- the fault history ----------------------------------------------------------------


def test_the_history_shows_the_records_that_remain_newest_first() -> None:
    def record(name: str, ago_s: float, phase: Phase, *entries: str, **kw: Any) -> FaultRecord:
        at = (NOW - dt.timedelta(seconds=ago_s)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        return FaultRecord(
            name, "n1", f"fault-{name}", phase, reason="XidCritical79", created_at=at,
            actions=tuple(ActionEntry(at, e, "ok") for e in entries), **kw,
        )  # fmt: skip

    old = record("a", 86400 * 3, Phase.RESOLVED, "detect", "taint", "evict", "drain", "untaint",
                 evicted_pods=("ml/a", "ml/b"))  # fmt: skip
    now_open = record("b", 120, Phase.QUARANTINED, "detect", "taint")
    diagnosis = diagnose(facts(node(), faults=[old, now_open]), CONFIG)
    assert diagnosis.history == (now_open, old)
    rows = diagnosis.data()["history"]
    assert [r["faultId"] for r in rows] == ["fault-b", "fault-a"]
    assert rows[1]["done"] == "detected, tainted, evicted 2 pod(s), drained, untainted"
    assert rows[1]["closedAt"] == "2025-02-26T12:00:00.000Z" and rows[0]["closedAt"] == ""
    printed = table(diagnosis)
    assert "Fault history (newest first)" in printed and "fault-a" in printed
    # Records that could not be read: no history, said among the unread.
    assert diagnose(facts(node(), faults=None), CONFIG).data()["history"] is None
    assert "no GPUFault records" in table(diagnose(facts(node(), faults=[]), CONFIG))
