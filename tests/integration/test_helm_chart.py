"""The Helm chart on the real control plane: it renders, applies with
server-side apply, and its RBAC is exactly enough — the controller runs with the
chart's ServiceAccount token through a whole fault cycle and is refused what it
must not do; the agent may patch only the node its token is bound to; the
operator roles run the CLI (a maintenance round trip; status, audit, doctor,
gate read-only) and the view role cannot change a node."""

from __future__ import annotations

import base64
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, Pod, Secret, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding, RoleBinding
from lightkube.types import PatchType

from gpuheal.cli import main
from gpuheal.sim import ControlPlane
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from gpuheal.sources.dcgm import not_node_faults
from gpuheal.vocabulary import Entry
from tests.helpers import FakeNodes, refusals, unique, wait_for
from tests.integration.chart import (
    CHART,
    as_token,
    bind,
    forbidden,
    helm,
    helm_template,
    installed,
    is_test_hook,
    render,
    token_for,
)
from tests.integration.conftest import clear_fault, faults_of, our_taint, report_fault

pytestmark = pytest.mark.timeout(300)

DATA = Path(__file__).parent / "data"


def kinds(objects: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for obj in objects:
        counts[obj["kind"]] = counts.get(obj["kind"], 0) + 1
    return counts


def test_the_chart_renders_for_the_default_and_other_values(control_plane: ControlPlane) -> None:
    rendered = render(control_plane, "gh", "gpuheal-system")
    default = [o for o in rendered if not is_test_hook(o)]
    # `helm test`'s hooks: its identity (nodes, the one Lease) and its pod.
    assert kinds([o for o in rendered if is_test_hook(o)]) == {
        "ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Role": 1,
        "RoleBinding": 1, "Pod": 1,
    }  # fmt: skip
    assert kinds(default) == {
        "CustomResourceDefinition": 2, "ServiceAccount": 2, "ClusterRole": 4, "ClusterRoleBinding": 2,
        "Role": 4, "RoleBinding": 3, "ConfigMap": 2, "Secret": 1, "Deployment": 1, "Service": 1,
        "PodDisruptionBudget": 1, "ValidatingAdmissionPolicy": 9, "ValidatingAdmissionPolicyBinding": 9,
        "DaemonSet": 1, "ResourceQuota": 1,
    }  # fmt: skip
    crds = {o["metadata"]["name"]: o for o in default if o["kind"] == "CustomResourceDefinition"}
    assert set(crds) == {"gpufaults.gpuheal.io", "gpurollouts.gpuheal.io"}
    for name, crd in crds.items():
        assert crd == yaml.safe_load((CHART.parents[1] / "crds" / f"{name}.yaml").read_text())
    # Canary pods (and a DRA device's canary claim): create/delete pods and claims in
    # the release namespace only, where the config runs them.
    canary = next(o for o in default if o["metadata"]["name"] == "gh-controller-canary")
    assert canary["kind"] == "Role" and canary["metadata"]["namespace"] == "gpuheal-system"
    assert canary["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["create", "delete"]},
    ]  # fmt: skip
    # Validation Jobs: create/get/delete Jobs in the release namespace, where the config runs them.
    validation = next(o for o in default if o["metadata"]["name"] == "gh-controller-validation")
    assert validation["kind"] == "Role"
    assert validation["metadata"]["namespace"] == "gpuheal-system"
    assert validation["rules"] == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "delete"]}
    ]
    config = next(
        o for o in default if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gh-controller"
    )
    assert yaml.safe_load(config["data"]["config.yaml"])["deviceHealth"] == {
        "canaryNamespace": "gpuheal-system"
    }
    assert yaml.safe_load(config["data"]["config.yaml"])["healthGate"] == {
        "validation": {"namespace": "gpuheal-system"}
    }
    # A staged roll-out starts where nothing is written to Nodes or Pods.
    assert yaml.safe_load(config["data"]["config.yaml"])["mode"] == "observe"
    minimal = kinds(render(control_plane, "gh", "ops", DATA / "values-minimal.yaml"))
    assert "DaemonSet" not in minimal and "Secret" not in minimal
    full = render(control_plane, "gh", "ops", DATA / "values-full.yaml")
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= set(kinds(full))
    # Every program is scraped under the job name its rules select.
    jobs = {
        o["kind"]: {r["replacement"] for e in o["spec"].get("endpoints", [])
                    + o["spec"].get("podMetricsEndpoints", [])
                    for r in e["relabelings"] if r["targetLabel"] == "job"}
        for o in full if o["kind"] in ("ServiceMonitor", "PodMonitor")
    }  # fmt: skip
    assert jobs == {"ServiceMonitor": {"gpuheal-controller"}, "PodMonitor": {"gpuheal-agent"}}
    exprs = " ".join(
        r["expr"] for o in full if o["kind"] == "PrometheusRule"
        for g in o["spec"]["groups"] for r in g["rules"]
    )  # fmt: skip
    assert set(re.findall(r'job="([^"]+)"', exprs)) == {"gpuheal-controller", "gpuheal-agent"}
    role = next(
        o for o in full if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "gh-controller"
    )
    pods = next(r for r in role["rules"] if r["resources"] == ["pods"])
    assert "delete" in pods["verbs"]  # only with allowPodDelete
    # The DCGM rules: GPUXidError fires on the catalogue's node-fault Xids only, with the
    # value in `xid` for the controller to classify (tests/integration/test_dcgm_catalogue.py
    # runs them in a real Prometheus).
    (rule,) = [o for o in full if o["kind"] == "PrometheusRule"]
    dcgm = {r["alert"]: r for g in rule["spec"]["groups"] if g["name"] == "gpuheal-dcgm"
            for r in g["rules"]}  # fmt: skip
    xid = dcgm["GPUXidError"]
    assert xid["labels"]["xid"] == "{{ $value }}" and "gpuheal_reason" not in xid["labels"]
    assert {int(c) for c in re.findall(r"!= (\d+)", xid["expr"])} == {0, *not_node_faults()}
    assert dcgm["GPURowRemapPending"]["labels"]["severity"] == "warning"
    assert dcgm["GPURepeatedApplicationXids"]["expr"].endswith(">= 10")
    (counters,) = [o for o in full if o["metadata"]["name"] == "gh-dcgm-counters"]
    fields = [line.split(",")[0] for line in counters["data"]["dcgm-metrics.csv"].splitlines()
              if not line.startswith("#")]  # fmt: skip
    assert "DCGM_EXP_XID_ERRORS_COUNT" in fields and "DCGM_FI_DEV_ROW_REMAP_PENDING" in fields
    own = render(control_plane, "gh", "ops", DATA / "values-own-rules.yaml")
    (rule,) = [o for o in own if o["kind"] == "PrometheusRule"]
    assert [g["name"] for g in rule["spec"]["groups"]] == [
        "gpuheal-agent",
        "gpuheal-self",
        "gpuheal-hygiene",
    ]


@pytest.fixture
def release(
    kube: Client, control_plane: ControlPlane, crds: None
) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    with installed(kube, control_plane) as chart:
        yield chart.name, chart.namespace, chart.objects


def test_the_chart_rbac_is_enough_for_a_whole_cycle_and_no_more(
    kube: Client,
    control_plane: ControlPlane,
    tmp_path: Path,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    release: tuple[str, str, list[dict[str, Any]]],
) -> None:
    name, system, objects = release
    (node,) = fake_gpu_nodes(1, labels=pool)
    for i in range(2):
        apply(kube, gpu_pod(f"job-{i}", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=2)

    kubeconfig, as_controller = as_token(
        control_plane, tmp_path, token_for(kube, system, f"{name}-controller"), "ctl"
    )
    rendered = next(
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == f"{name}-controller"
    )
    config = yaml.safe_load(rendered["data"]["config.yaml"])
    token_file = tmp_path / "api-token"
    token_file.write_text("t")
    # The roll-out's last stage (the chart starts in observe): every write of the cycle.
    config.update(mode="full", nodeSelector=pool, apiTokenFile=str(token_file), recoveryWindowSeconds=1,
                  breakerMaxPercent=100, rateLimitPerSecond=100, rateLimitBurst=100)  # fmt: skip
    # The pods are asked to checkpoint first: that write too passes the chart's policy.
    config["checkpoint"] = {"reasons": ["XidCritical79"], "waitSeconds": 1}
    controller = ControllerProcess(tmp_path, kubeconfig, config, identity="chart").start()
    try:
        controller.wait_leading()
        report_fault(kube, node, "chart-fault")
        wait_for("the taint", lambda: our_taint(kube, node) == "chart-fault")
        wait_for("evicted", lambda: not [p for p in kube.list(Pod, namespace=namespace)
                                         if p.metadata and not p.metadata.deletionTimestamp])  # fmt: skip

        def timed_out() -> int:
            (record,) = faults_of(kube, node)
            said = [e["action"] for e in (record.status or {}).get("actions", [])]
            return said.count(Entry.CHECKPOINT_TIMEOUT)

        wait_for("each pod's checkpoint timed out", lambda: timed_out() == 2)
        clear_fault(kube, node)
        wait_for("recovered", lambda: our_taint(kube, node) is None)
        assert not refusals(controller.log())
    finally:
        controller.stop()

    assert forbidden(lambda: list(as_controller.list(Secret, namespace=system)))
    assert forbidden(lambda: list(as_controller.list(Secret, namespace="kube-system")))
    assert forbidden(lambda: as_controller.delete(Node, node))
    assert forbidden(lambda: as_controller.delete(Pod, "job-0", namespace=namespace))
    assert forbidden(lambda: as_controller.create(Namespace(metadata=ObjectMeta(name=unique("x")))))


def test_the_agent_may_patch_only_the_node_its_token_is_bound_to(
    kube: Client,
    control_plane: ControlPlane,
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    release: tuple[str, str, list[dict[str, Any]]],
) -> None:
    name, system, _ = release
    own, other, probe = fake_gpu_nodes(3)
    _, as_agent = as_token(
        control_plane, tmp_path, token_for(kube, system, f"{name}-agent", bound_node=own), "agent"
    )
    patch = {
        "metadata": {"annotations": {"gpuheal.io/status": "faulty", "gpuheal.io/fault-id": "x"}}
    }

    def patch_status(target: str) -> None:
        as_agent.patch(Node.Status, target, patch, patch_type=PatchType.STRATEGIC)

    # A new policy takes effect within moments: probe a third node until it does.
    wait_for("the policy", lambda: forbidden(lambda: patch_status(probe)), timeout_s=30)
    assert forbidden(lambda: patch_status(other))
    patch_status(own)
    assert kube.get(Node, own).metadata.annotations["gpuheal.io/fault-id"] == "x"  # type: ignore[union-attr,index]
    assert "gpuheal.io/fault-id" not in (kube.get(Node, other).metadata.annotations or {})  # type: ignore[union-attr]
    assert forbidden(lambda: as_agent.patch(Node, own, {"spec": {"taints": []}}))  # never taints
    assert forbidden(lambda: list(as_agent.list(Pod, namespace="default")))


def cli(capsys: pytest.CaptureFixture[str], kubeconfig: Path, *argv: str) -> tuple[int, str]:
    code = main([*argv, "--kubeconfig", str(kubeconfig)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _chart_controller(
    kube: Client,
    control_plane: ControlPlane,
    tmp_path: Path,
    release: tuple[str, str, list[dict[str, Any]]],
    pool: dict[str, str],
) -> ControllerProcess:
    """The chart's controller, with its own token and config, leading."""
    name, system, objects = release
    kubeconfig, _ = as_token(
        control_plane, tmp_path, token_for(kube, system, f"{name}-controller"), "ctl"
    )
    rendered = next(
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == f"{name}-controller"
    )
    config = yaml.safe_load(rendered["data"]["config.yaml"])
    token_file = tmp_path / "api-token"
    token_file.write_text("t")
    config.update(nodeSelector=pool, apiTokenFile=str(token_file))
    config.setdefault("maintenance", {})["pollSeconds"] = 0.2
    controller = ControllerProcess(tmp_path, kubeconfig, config, identity="chart-ops").start()
    return controller.wait_leading()


def test_the_operator_roles_are_enough_for_the_cli_and_no_more(
    kube: Client,
    control_plane: ControlPlane,
    tmp_path: Path,
    namespace: str,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    release: tuple[str, str, list[dict[str, Any]]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    name, system, _ = release
    node, other = fake_gpu_nodes(2, labels=pool)
    apply(kube, gpu_pod("job-0", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)
    bindings = []
    for account, role in (("ops", f"{name}-operator"), ("viewer", f"{name}-operator-view")):
        kube.create(ServiceAccount(metadata=ObjectMeta(name=account)), namespace=system)
        bindings.append(bind(kube, role, account, system))
    try:
        ops, _ = as_token(control_plane, tmp_path, token_for(kube, system, "ops"), "ops")
        viewer, as_viewer = as_token(
            control_plane, tmp_path, token_for(kube, system, "viewer"), "viewer"
        )
        # A new binding takes effect within moments.
        wait_for("the binding", lambda: cli(capsys, viewer, "status")[0] == 0, timeout_s=30)

        # The maintenance role: the whole round trip, with no refusal anywhere; the
        # chart's controller, with its own token, carries out both requests (the
        # pod asked to checkpoint, evicted, the node returned: its policies too).
        controller = _chart_controller(kube, control_plane, tmp_path, release, pool)
        try:
            code, out = cli(capsys, ops, "maintenance", "start", node, "--reason", "rbac",
                            "--checkpoint-wait", "0", "--timeout", "60", "--force")  # fmt: skip
            assert code == 0, out
            assert "not recorded" not in out and not refusals(out)  # the Event was written too
            code, out = cli(capsys, ops, "maintenance", "finish", node)
            assert code == 0, out
            assert "not recorded" not in out and not refusals(out)
            assert not refusals(controller.log())
        finally:
            controller.stop()
        # The read-only role: every read-only command works; it cannot change a node.
        for argv in (("status",), ("audit",), ("doctor", other), ("gate", other)):
            code, out = cli(capsys, viewer, *argv)
            assert code in (0, 3), (argv, out)  # 3: findings, never a refusal
            assert not refusals(out) and "unread" not in out.lower(), (argv, out)
        code, out = cli(capsys, viewer, "maintenance", "start", other, "--reason", "no")
        assert code == 1 and refusals(out), out
        assert forbidden(lambda: as_viewer.patch(Node, other, {"spec": {"unschedulable": True}}))
        assert forbidden(lambda: list(as_viewer.list(Secret, namespace=system)))

        # The controller's config: unreadable without the config Role (said, and the
        # defaults used); with it, that one ConfigMap and no other.
        ref = ("--controller-config", f"{system}/{name}-controller")
        code, out = cli(capsys, viewer, "status", *ref)
        assert code == 0 and f"not allowed to read ConfigMap {ref[1]}" in out, out
        kube.create(
            RoleBinding(
                metadata=ObjectMeta(name="viewer-config"),
                roleRef=RoleRef(
                    apiGroup="rbac.authorization.k8s.io",
                    kind="Role",
                    name=f"{name}-operator-config",
                ),
                subjects=[Subject(kind="ServiceAccount", name="viewer", namespace=system)],
            ),
            namespace=system,
        )
        said = f"config: ConfigMap {ref[1]} (the controller's"
        wait_for("the config Role", lambda: said in cli(capsys, viewer, "status", *ref)[1])
        code, out = cli(capsys, viewer, "gate", other, *ref)
        assert code in (0, 3) and said in out and not refusals(out), out
        assert forbidden(lambda: as_viewer.get(ConfigMap, "kube-root-ca.crt", namespace=system))
        assert forbidden(lambda: list(as_viewer.list(ConfigMap, namespace=system)))
    finally:
        for binding in bindings:
            kube.delete(ClusterRoleBinding, binding)


# -- the API token across upgrades -------------------------------------------------


def installed_token(kube: Client, name: str, namespace: str) -> str:
    secret = kube.get(Secret, f"{name}-api-token", namespace=namespace)
    assert secret.data is not None
    return base64.b64decode(secret.data["token"]).decode()


def test_the_api_token_outlives_upgrades(
    kube: Client, control_plane: ControlPlane, crds: None, tmp_path: Path
) -> None:
    name, namespace = unique("gh"), unique("gpuheal-system")
    # No pods: kwok would place them on other tests' nodes; the Secret is the point.
    install = ["upgrade", "--install", name, str(CHART), "--namespace", namespace,
               "--create-namespace", "--set", "controller.replicas=0", "--set", "agent.enabled=false"]  # fmt: skip
    try:
        helm(control_plane, tmp_path, *install)
        first = installed_token(kube, name, namespace)
        assert len(first) == 48
        # Before: every upgrade made a new random token, and the running controller
        # and Alertmanager kept the old one.
        for revision in (2, 3):
            helm(control_plane, tmp_path, *install, "--set", f"controller.replicas={revision % 2}")
            assert installed_token(kube, name, namespace) == first
        # A token given as a value wins, and stays on the next upgrade that gives none.
        helm(control_plane, tmp_path, *install, "--set", "controller.apiToken=0per4tor-ch0sen")
        assert installed_token(kube, name, namespace) == "0per4tor-ch0sen"
        helm(control_plane, tmp_path, *install)
        assert installed_token(kube, name, namespace) == "0per4tor-ch0sen"
    finally:
        helm(control_plane, tmp_path, "uninstall", name, "--namespace", namespace)
        kube.delete(Namespace, namespace)


def test_without_a_cluster_to_look_in_each_render_makes_a_new_token_or_uses_an_existing_secret(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """`helm template` (and a client-side dry run) cannot read the installed Secret:
    each render has a new random token. GitOps tools that render with `helm
    template` (Argo CD) name a Secret they manage instead."""

    def token_of(objects: list[dict[str, Any]]) -> str:
        (secret,) = [o for o in objects if o["kind"] == "Secret"]
        return base64.b64decode(secret["data"]["token"]).decode()

    assert token_of(render(control_plane, "gh", "ops")) != token_of(
        render(control_plane, "gh", "ops")
    )
    values = tmp_path / "existing.yaml"
    values.write_text(
        yaml.safe_dump({"controller": {"existingTokenSecret": "alertmanager-gpuheal"}})
    )
    objects = render(control_plane, "gh", "ops", values)
    assert "Secret" not in kinds(objects)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "token"]
    assert volume["secret"]["secretName"] == "alertmanager-gpuheal"
    # Mounted as a directory (no subPath): the kubelet updates the file in place.
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "token"]
    assert "subPath" not in mount
    config = next(
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gh-controller"
    )
    token_file = Path(yaml.safe_load(config["data"]["config.yaml"])["apiTokenFile"])
    assert token_file.parent == Path(mount["mountPath"]) and token_file.name == "token"


@pytest.mark.parametrize("kernel_log", ["default", "off", "privileged"])
def test_the_agent_runs_with_the_least_the_kernel_log_needs(
    kube: Client, control_plane: ControlPlane, namespace: str, tmp_path: Path, kernel_log: str
) -> None:
    values = tmp_path / "values.yaml"
    settings = {"default": {}, "off": {"enabled": False}, "privileged": {"privileged": True}}
    values.write_text(yaml.safe_dump({"agent": {"kernelLog": settings[kernel_log]}}))
    objects = render(control_plane, "gh", namespace, values)
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    context = agent["securityContext"]
    config = next(o for o in objects if o["metadata"]["name"] == "gh-agent" and o["kind"] == "ConfigMap")  # fmt: skip
    kmsg_enabled = yaml.safe_load(config["data"]["config.yaml"])["kmsgEnabled"]
    mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    # Never in a user namespace of its own: CAP_SYSLOG counts only in the host's.
    assert pod["hostUsers"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    if kernel_log == "privileged":
        assert context["privileged"] is True and "/dev/kmsg" in mounts and kmsg_enabled
        # Root too: the image's user (65532) would hold no capability, privileged or not
        # (found on a real kubelet: tests/node/test_chart.py).
        assert (context["runAsUser"], context["runAsNonRoot"]) == (0, False)
    else:
        assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
        assert context["runAsUser"] == 0  # host UID 0: the state directory is root's
        added = ["SYSLOG"] if kernel_log == "default" else []
        assert context["capabilities"] == {"drop": ["ALL"], **({"add": added} if added else {})}
        assert ("/dev/kmsg" in mounts) == bool(added) == kmsg_enabled
    # The API server takes the DaemonSet as rendered.
    kube.create(codecs.from_dict(daemonset), dry_run=True)


def test_a_sentinel_reboot_mounts_its_own_directory_and_never_the_runtimes(
    kube: Client, control_plane: ControlPlane, namespace: str
) -> None:
    """kured reboots while its sentinel exists: the agent writes it on the host, in a
    directory of its own (a tmpfs a reboot empties, and the agent removes it besides);
    /var/run itself holds the container runtime's socket and is never mounted."""
    sentinel = "/var/run/gpuheal/reboot-required"
    sets = {"agent.config.repairEnabled": "true", "agent.config.repairRebootMethod": "sentinel",
            "agent.config.repairRebootSentinel": sentinel}  # fmt: skip
    objects = render(control_plane, "gh", namespace, sets=sets)
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "reboot-sentinel"]
    assert volume["hostPath"] == {"path": "/var/run/gpuheal", "type": "DirectoryOrCreate"}
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "reboot-sentinel"]
    assert mount["mountPath"] == "/var/run/gpuheal" and not mount.get("readOnly")
    config = next(
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gh-agent"
    )
    assert yaml.safe_load(config["data"]["config.yaml"])["repairRebootSentinel"] == sentinel
    kube.create(codecs.from_dict(daemonset), dry_run=True)  # the API server takes it
    # Without sentinel reboots, nothing of the host's is mounted writable for them.
    default = next(o for o in render(control_plane, "gh", "x") if o["kind"] == "DaemonSet")
    assert "reboot-sentinel" not in {
        v["name"] for v in default["spec"]["template"]["spec"]["volumes"]
    }
    for path, said in (
        ("/var/run/reboot-required", "a directory of its own (not /var/run"),
        ("/run/reboot-required", "(not /run"),
        ("reboot-required", "an absolute path"),
        ("", "set it with repairRebootMethod sentinel"),
    ):
        done = helm_template(
            control_plane, "gh", "x", sets={**sets, "agent.config.repairRebootSentinel": path}
        )
        assert done.returncode != 0 and said in done.stderr, (path, done.stderr)


def test_a_mistyped_value_fails_the_render_naming_it(control_plane: ControlPlane) -> None:
    for key, where in (
        ("controller.config.breakerMaxNodez", "/controller/config"),
        ("agent.config.kmsgPth", "/agent/config"),
        ("controller.config.pools.byName.a100.gpusPerNod", "/controller/config/pools/byName/a100"),
        ("agent.kernelLog.privilegd", "/agent/kernelLog"),
    ):
        done = helm_template(control_plane, "gh", "x", sets={key: "1"})
        assert done.returncode != 0, key
        assert where in done.stderr and key.rsplit(".", 1)[-1] in done.stderr, done.stderr
    # What the chart documents passes.
    sets = {"controller.config.breakerMaxNodes": "3", "agent.config.kmsgPath": "/dev/kmsg",
            "controller.nodeSelector.pool": "infra", "serviceMonitor.labels.release": "kps"}  # fmt: skip
    assert helm_template(control_plane, "gh", "x", sets=sets).returncode == 0


def test_helm_template_needs_no_kube_version(control_plane: ControlPlane) -> None:
    """As people run it first: `helm template` with no cluster and no --kube-version
    renders for the Kubernetes of helm's own client libraries, which the chart takes."""
    argv = [str(control_plane.config.binaries.helm), "template", "gh", str(CHART)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "kind: DaemonSet" in done.stdout
    lint = [str(control_plane.config.binaries.helm), "lint", str(CHART)]
    linted = subprocess.run(lint, capture_output=True, text=True, timeout=60, check=False)
    assert linted.returncode == 0, linted.stdout + linted.stderr
