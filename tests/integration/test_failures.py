"""Failures are visible and cheap, on the real control plane.

A reconcile the API server keeps refusing is counted by reason, logged once,
put on the node as one Warning Event and retried with backoff (counted from the
API server's audit log); the chart's remediation-failure alert fires on it in
real Prometheus; a lease namespace that does not exist is said at warning level
and in /readyz, and the replica leads once the namespace is there.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.resources.admissionregistration_v1 import (
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
)
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding

from gpuheal.cli import main
from gpuheal.kube import crds
from gpuheal.model import TAINT_KEY
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.controller import ControllerProcess, install_crds
from gpuheal.sim.monitoring import Monitoring
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes, wait_nodes_ready
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, create_namespace
from tests.conftest import AUDITED_CONTROLLER
from tests.corpus import unique_eks_node
from tests.helpers import FakeNodes, unique, wait_for
from tests.integration.chart import alert_rules, firing, render
from tests.integration.conftest import (
    StartController,
    controller_config,
    events_for,
    faults_of,
    our_taint,
    report_fault,
)
from tests.integration.test_helm_chart import DATA

pytestmark = pytest.mark.timeout(300)

POLICY_MESSAGE = "taints on this pool are set by the platform team only"
FAULT_ID = "xid79-gpu3-20260101T000000Z"  # short: the policy refuses it, no length limit


def log_lines(controller: ControllerProcess) -> list[dict[str, Any]]:
    lines = []
    for raw in controller.log().splitlines():
        if raw.startswith("{"):
            lines.append(json.loads(raw))
    return lines


def readyz(controller: ControllerProcess) -> dict[str, Any]:
    """The /readyz body, whatever its status code."""
    try:
        with urllib.request.urlopen(f"{controller.url}/readyz", timeout=5) as response:  # noqa: S310
            body: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as err:
        body = json.load(err)
    return body


def metric(controller: ControllerProcess, series: str) -> float:
    """The value of one exposition line (`name{labels}`), 0 when absent."""
    for line in controller.metrics().splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture
def eks_node(kube: Client, pool: dict[str, str]) -> Iterator[str]:
    """One fake GPU node of the test's pool, named as EKS names them."""
    (node,) = create_gpu_nodes(kube, [unique_eks_node()], labels=pool)
    wait_nodes_ready(kube, [node])
    yield node
    delete_nodes(kube, [node])


@pytest.fixture
def taints_refused(kube: Client, pool: dict[str, str], eks_node: str) -> Iterator[None]:
    """A cluster policy, as platform teams write them, that refuses gpuheal's
    taint on the test's nodes: every taint write is answered 422 Invalid."""
    name = unique("no-gpu-fault-taint")
    apply(kube, {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                "resources": ["nodes"],
            }]},
            "validations": [{
                "expression": "!has(object.spec.taints) || "
                f"!object.spec.taints.exists(t, t.key == '{TAINT_KEY}')",
                "message": POLICY_MESSAGE,
            }],
        },
    })  # fmt: skip
    apply(kube, {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"objectSelector": {"matchLabels": pool}}},
    })  # fmt: skip

    def refused() -> bool:
        taint = {"key": TAINT_KEY, "value": "probe", "effect": "NoSchedule"}
        try:
            kube.patch(Node, eks_node, {"spec": {"taints": [taint]}}, dry_run=True)
        except ApiError as err:
            return err.status.code == 422
        return False

    # A new policy takes effect within moments: probe until it does.
    wait_for("the policy", refused, timeout_s=30)
    yield
    kube.delete(ValidatingAdmissionPolicyBinding, name)
    kube.delete(ValidatingAdmissionPolicy, name)


ALL: list[dict[str, Any]] = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
# Everything the controller touches but leases (coordination.k8s.io).
NO_LEASES: list[dict[str, Any]] = [
    {
        "apiGroups": ["", "gpuheal.io", "events.k8s.io", "policy"],
        "resources": ["*"],
        "verbs": ["*"],
    },
    # The GPUs DRA offers and the device fence (the chart grants the same).
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices", "resourceclaims", "devicetaintrules"],
        "verbs": ["*"],
    },
    # Its own CRDs, read to compare their schema (the chart grants the same).
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "resourceNames": ["gpufaults.gpuheal.io", "gpurollouts.gpuheal.io"],
        "verbs": ["get"],
    },
]
LEASES: list[dict[str, Any]] = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}
]
AuditedStart = Callable[[dict[str, Any], list[dict[str, Any]]], ControllerProcess]


@pytest.fixture
def audited(
    kube: Client, control_plane: ControlPlane, crds: None, tmp_path: Path
) -> Iterator[tuple[AuditedStart, Callable[[list[dict[str, Any]]], None]]]:
    """Run controllers as the identity whose requests the API server audits, with
    the RBAC a test grants it (`grant(rules)`, cluster-wide; removed afterwards)."""
    started: list[ControllerProcess] = []
    granted: list[str] = []

    def grant(rules: list[dict[str, Any]]) -> None:
        name = unique("audited")
        apply(kube, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                     "metadata": {"name": name}, "rules": rules})  # fmt: skip
        granted.append(name)
        apply(kube, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": AUDITED_CONTROLLER}],
        })  # fmt: skip

    def start(config: dict[str, Any], rules: list[dict[str, Any]]) -> ControllerProcess:
        grant(rules)
        kubeconfig = control_plane.kubeconfig_for(AUDITED_CONTROLLER)
        process = ControllerProcess(tmp_path, kubeconfig, config, identity=unique("ctl"))
        started.append(process)
        # A new binding takes effect within moments: the start waits for the caches.
        return process.start()

    yield start, grant
    for process in started:
        process.stop()
        print(f"--- {process.identity} log (tail) ---\n{process.log()[-4000:]}")
    for name in granted:
        kube.delete(ClusterRoleBinding, name)
        kube.delete(ClusterRole, name)
    kube.deletecollection(GPUFault)


def test_a_reconcile_the_api_server_keeps_refusing_is_told_once_and_backs_off(
    kube: Client,
    control_plane: ControlPlane,
    tmp_path: Path,
    pool: dict[str, str],
    eks_node: str,
    taints_refused: None,
    audited: tuple[AuditedStart, Any],
) -> None:
    start, _ = audited
    # The documented backoff of a failed reconcile (the test pools' 0.2/1 s would retry
    # every second).
    backoff = {"evictionRetryBaseSeconds": 2, "evictionRetryMaxSeconds": 60}
    controller = start(controller_config(pool, **backoff), ALL)
    controller.wait_leading()
    since = audit.offset(control_plane.audit_log)
    report_fault(kube, eks_node, FAULT_ID)
    invalid = 'gpuheal_reconcile_errors_total{reason="Invalid"}'
    wait_for("the first refused reconcile", lambda: metric(controller, invalid) >= 1)
    time.sleep(30)  # half a minute of retries

    found = list(audit.requests(control_plane.audit_log, user=AUDITED_CONTROLLER, since=since))
    print("requests in the half minute:", audit.by_verb_and_resource(iter(found)))
    taint_writes = [r for r in found if r.resource == "nodes" and r.verb in ("patch", "update")]
    refused = [r for r in taint_writes if r.code == 422]
    # Backoff 2, 4, 8, 16 s (less up to 10 % jitter): 4 or 5 attempts in the first 30 s
    # (a retry storm at the test pools' 0.2 s would be a hundred).
    assert 3 <= len(refused) <= 6, taint_writes
    print("node writes:", [(r.verb, r.code, r.at) for r in taint_writes])
    # Besides the retries: the record, its status, the Events; the lease renewals aside.
    writes = [r for r in found if r.verb not in ("get", "list", "watch") and r.resource != "leases"]
    assert len(writes) <= len(taint_writes) + 6, audit.by_verb_and_resource(iter(found))
    errors = metric(controller, invalid)
    assert errors >= len(refused) - 1, errors  # every failure counted (one may be in flight)
    assert our_taint(kube, eks_node) is None
    assert faults_of(kube, eks_node)  # the record says a fault was seen

    failed = events_for(kube, eks_node, "GPUHealReconcileFailed")
    assert len(failed) == 1, failed  # once per streak, not per retry
    assert failed[0].type == "Warning"
    assert "Invalid" in str(failed[0].message) and POLICY_MESSAGE in str(failed[0].message)

    lines = log_lines(controller)
    told = [e for e in lines if e["level"] == "error" and e.get("node") == eks_node]
    assert [e["msg"] for e in told] == ["reconcile failed"], told
    assert told[0]["reason"] == "Invalid" and POLICY_MESSAGE in told[0]["error"]
    assert not [e for e in lines if "exc" in e], "no traceback for an answer of the API server"


def test_the_chart_alert_on_remediation_failures_fires_in_real_prometheus(
    kube: Client,
    control_plane: ControlPlane,
    tmp_path: Path,
    pool: dict[str, str],
    eks_node: str,
    taints_refused: None,
    start_controller: StartController,
) -> None:
    rendered = render(control_plane, "gh", "gpuheal-system", DATA / "values-full.yaml")
    rules = next(o for o in rendered if o["kind"] == "PrometheusRule")["spec"]["groups"]
    rule = next(
        r for g in rules for r in g["rules"] if r.get("alert") == "GPUHealRemediationFailures"
    )
    rule = {**rule, "for": "5s"}  # the chart's expression as is; minutes of `for` made seconds
    token_file = tmp_path / "token"
    token_file.write_text("alertmanager-token\n")
    controller = start_controller(controller_config(pool, apiTokenFile=str(token_file)))
    controller.wait_leading()
    monitoring = Monitoring(
        tmp_path / "monitoring",
        targets=[f"127.0.0.1:{controller.port}"],
        rules=[rule],
        webhook_url=f"{controller.url}/api/v1/alerts",
        token_file=token_file,
    ).start()

    def alert_state() -> str:
        url = f"{monitoring.prometheus_url}/api/v1/rules?type=alert"
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310
            groups = json.load(response)["data"]["groups"]
        return str(groups[0]["rules"][0]["state"]) if groups else ""

    try:
        # Healthy: evaluated and silent.
        wait_for("the rule evaluated", lambda: alert_state() == "inactive", timeout_s=30)
        time.sleep(8)  # longer than `for`
        assert alert_state() == "inactive"
        report_fault(kube, eks_node, FAULT_ID)
        wait_for("the alert firing", lambda: alert_state() == "firing", timeout_s=90)
        url = f"{monitoring.prometheus_url}/api/v1/alerts"
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310
            alerts = json.load(response)["data"]["alerts"]
        assert [a["labels"]["reason"] for a in alerts if a["state"] == "firing"] == ["Invalid"]
    finally:
        monitoring.stop()


def test_a_missing_lease_namespace_is_told_and_leading_starts_once_it_exists(
    kube: Client, pool: dict[str, str], start_controller: StartController
) -> None:
    missing = unique("gpuheal-system")
    config = controller_config(pool)
    config["leaderElection"] = {**config["leaderElection"], "namespace": missing}
    controller = start_controller(config)  # ready: its caches synced
    try:
        body = wait_for("a reason in /readyz", lambda: (b := readyz(controller))["reasons"] and b)
        assert body["ready"] is True and body["leader"] is False
        assert len(body["reasons"]) == 1, body
        assert missing in body["reasons"][0] and "not found" in body["reasons"][0], body
        errors = 'gpuheal_leader_election_errors_total{reason="NotFound"}'
        wait_for("retries", lambda: metric(controller, errors) >= 6)  # retry period 0.5 s

        warned = [
            e for e in log_lines(controller) if e["level"] == "warning" and "lease" in e["msg"]
        ]
        assert len(warned) == 1, warned  # said once, not once per retry period
        assert warned[0]["namespace"] == missing and missing in warned[0]["error"], warned
        assert warned[0]["reason"] == "NotFound"
        assert not controller.leading()

        create_namespace(kube, missing)
        controller.wait_leading()
        assert readyz(controller)["reasons"] == []
        assert "lease works again" in [e["msg"] for e in log_lines(controller)]
    finally:
        with contextlib.suppress(ApiError):
            kube.delete(Namespace, missing)


def test_no_rbac_on_leases_is_told_and_leading_starts_once_granted(
    pool: dict[str, str], audited: tuple[AuditedStart, Callable[[list[dict[str, Any]]], None]]
) -> None:
    start, grant = audited
    controller = start(controller_config(pool), NO_LEASES)  # ready: its caches synced
    body = wait_for("a reason in /readyz", lambda: (b := readyz(controller))["reasons"] and b)
    assert body["ready"] is True and body["leader"] is False
    (reason,) = body["reasons"]
    assert "403 Forbidden" in reason and 'cannot get resource "leases"' in reason, reason
    errors = 'gpuheal_leader_election_errors_total{reason="Forbidden"}'
    wait_for("retries", lambda: metric(controller, errors) >= 6)  # retry period 0.5 s
    warned = [e for e in log_lines(controller) if e["level"] == "warning" and "lease" in e["msg"]]
    assert len(warned) == 1 and warned[0]["reason"] == "Forbidden", warned

    grant(LEASES)
    controller.wait_leading()
    assert readyz(controller)["reasons"] == []


def test_without_rbac_on_dra_the_controller_is_ready_says_so_and_asks_once(
    control_plane: ControlPlane,
    pool: dict[str, str],
    audited: tuple[AuditedStart, Callable[[list[dict[str, Any]]], None]],
) -> None:
    """A ClusterRole from before DRA (what an upgrade that kept an old role leaves):
    the controller is ready and leads, /readyz names each DRA list it may not make,
    and each is asked once, not in a loop (the audit log counts them)."""
    start, _ = audited
    without_dra = [r for r in NO_LEASES if "resource.k8s.io" not in r["apiGroups"]]
    started = audit.offset(control_plane.audit_log)
    controller = start(controller_config(pool), [*without_dra, *LEASES])
    controller.wait_leading()
    reasons = readyz(controller)["reasons"]
    forbidden = sorted(r.split()[2] for r in reasons if "(forbidden)" in r)
    assert forbidden == [
        "devicetaintrules-v1", "devicetaintrules-v1beta2", "resourceclaims", "resourceslices",
    ], reasons  # fmt: skip
    time.sleep(3)  # what a retry loop would send meanwhile
    made = audit.requests(control_plane.audit_log, user=AUDITED_CONTROLLER, since=started)
    asked = sorted(
        (r.resource, r.code)
        for r in made
        if r.resource in ("resourceslices", "resourceclaims", "devicetaintrules")
    )
    assert asked == [
        ("devicetaintrules", 403), ("devicetaintrules", 403), ("resourceclaims", 403),
        ("resourceslices", 403),
    ], asked  # fmt: skip


def test_without_the_gpurollout_crd_faults_are_handled_and_readyz_names_it(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    """What `helm upgrade` from a chart before roll-outs leaves (Helm installs no new
    CRD on upgrade): the controller is ready, handles faults, and says what is off."""
    (node,) = fake_gpu_nodes(1, labels=pool)
    crd = "gpurollouts.gpuheal.io"
    kube.delete(CustomResourceDefinition, crd)
    wait_for("the CRD gone", lambda: not _served(kube, crd), timeout_s=60)
    try:
        controller = start_controller(controller_config(pool))
        body = wait_for("ready", lambda: (b := readyz(controller))["ready"] and b, timeout_s=30)
        (reason,) = [r for r in body["reasons"] if "gpurollouts" in r]
        assert "not served" in reason and "crds/" in reason, body
        report_fault(kube, node, "f-no-rollouts")
        wait_for("quarantined without roll-outs", lambda: our_taint(kube, node))
        time.sleep(2)
        said = [e for e in log_lines(controller) if e.get("informer") == "gpurollouts"]
        assert [e["msg"] for e in said] == [
            "resource not served: the features that need it are off until it is"
        ], said  # once, not a relist storm
        install_crds(kube)
        wait_for(
            "the reason gone once it is served",
            lambda: not [r for r in readyz(controller)["reasons"] if "gpurollouts" in r],
            timeout_s=60,
        )
        assert "resource served again" in [e["msg"] for e in log_lines(controller)]
    finally:
        install_crds(kube)


def _served(kube: Client, crd: str) -> bool:
    try:
        kube.get(CustomResourceDefinition, crd)
    except ApiError as err:
        if err.status.code == 404:
            return False
        raise
    return True


def test_the_no_leader_alert_fires_when_every_replica_is_gone(
    control_plane: ControlPlane,
    pool: dict[str, str],
    tmp_path: Path,
    start_controller: StartController,
) -> None:
    """No replica, no series: `sum(gpuheal_leader) == 0` alone never fires then."""
    controller = start_controller(controller_config(pool)).wait_leading()
    rules = [
        r for r in alert_rules(control_plane, "gpuheal-self") if r["alert"] == "GPUHealNoLeader"
    ]
    token = tmp_path / "token"
    token.write_text("unused\n")
    monitoring = Monitoring(
        tmp_path / "monitoring", targets=[f"127.0.0.1:{controller.port}"], rules=rules,
        webhook_url="http://127.0.0.1:9/unused", token_file=token, job="gpuheal-controller",
    ).start()  # fmt: skip
    try:
        wait_for(
            "scraped",
            lambda: _query(monitoring.prometheus_url, 'gpuheal_leader{job="gpuheal-controller"}'),
            timeout_s=30,
        )
        time.sleep(5)  # longer than `for`
        assert firing(monitoring.prometheus_url) == set()  # one replica leads
        controller.stop()
        wait_for(
            "GPUHealNoLeader",
            lambda: ("GPUHealNoLeader", "") in firing(monitoring.prometheus_url),
            timeout_s=60,
        )
    finally:
        monitoring.stop()


def _query(prometheus_url: str, expr: str) -> list[Any]:
    url = f"{prometheus_url}/api/v1/query?query={urllib.parse.quote(expr)}"
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310
        return list(json.load(response)["data"]["result"])


def test_after_an_upgrade_that_left_an_older_gpufault_crd_the_controller_says_what_to_run(
    kube: Client,
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    """`helm upgrade` leaves crds/ as the first install made them. The previous
    version's GPUFault schema lacks `status.repairApproval`: a write of it would be
    pruned. The new controller neither leads nor is ready until `gpuheal crds apply`."""
    name = "gpufaults.gpuheal.io"
    older = crds.shipped()[name]
    older = json.loads(json.dumps(older))
    version = older["spec"]["versions"][0]
    del version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["repairApproval"]
    older["metadata"]["annotations"][crds.DIGEST_ANNOTATION] = crds.digest(older["spec"])
    kube.apply(codecs.from_dict(older), field_manager="helm", force=True)
    try:
        (node,) = fake_gpu_nodes(1, labels=pool)
        controller = start_controller(controller_config(pool), ready=False)

        def synced_with_a_reason() -> dict[str, Any] | None:
            b = readyz(controller)
            reasons = b["reasons"]
            return b if reasons and not any("not synced" in r for r in reasons) else None

        body = wait_for("synced, and a reason", synced_with_a_reason)
        assert body is not None
        assert body["ready"] is False and body["leader"] is False, body
        (reason,) = body["reasons"]
        assert name in reason and "`gpuheal crds apply`" in reason, body
        report_fault(kube, node, "f-after-upgrade")
        time.sleep(3)
        assert our_taint(kube, node) is None  # no replica leads over the older schema
        kubeconfig = ["--kubeconfig", str(control_plane.kubeconfig)]
        capsys.readouterr()
        assert main(["crds", "check", *kubeconfig]) == 3
        assert "an older schema is served" in capsys.readouterr().out
        assert main(["crds", "apply", *kubeconfig, "-o", "json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert {c["state"] for c in report["crds"]} == {"current"}
        served = kube.get(CustomResourceDefinition, name).to_dict()
        schema = served["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert "repairApproval" in schema["properties"]["status"]["properties"]
        wait_for("ready and leading", lambda: readyz(controller)["leader"], timeout_s=30)
        wait_for("the fault handled", lambda: our_taint(kube, node), timeout_s=30)
        said = [e for e in log_lines(controller) if e["msg"] == "CRD not this version's"]
        assert len(said) == 1, said  # once, not every check
        assert main(["crds", "check", *kubeconfig]) == 0
    finally:
        install_crds(kube)
        kube.apply(codecs.from_dict(crds.shipped()[name]), field_manager="gpuheal-crds", force=True)
