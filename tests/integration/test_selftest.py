"""`helm test`: the chart's selftest hook, run as its pod would run it — its args from
the rendered Pod, its identity the hook's ServiceAccount with the hook's RBAC —
against a real controller and agent: all good exits 0; a GPU node without an agent,
and a controller that stopped, exit 3 naming what is wrong. Its identity can read
nodes and the one Lease, nothing more."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Node, Pod, Secret

from gpuheal.cli import main
from gpuheal.ops import exitcodes
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from tests.helpers import FakeNodes, wait_for
from tests.integration.chart import CHART, Release, as_token, forbidden, installed, token_for
from tests.integration.conftest import StartController, controller_config

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def release(kube: Client, control_plane: ControlPlane, crds: None) -> Iterator[Release]:
    with installed(kube, control_plane) as release:
        # What `helm test` creates before the pod (hook weight -1): its identity.
        hooks = [o for o in release.tests if o["kind"] != "Pod"]
        for obj in hooks:
            kube.apply(codecs.from_dict(obj), field_manager="helm-test", force=True)
        try:
            yield release
        finally:
            for obj in hooks:
                if obj["kind"].startswith("ClusterRole"):
                    kube.delete(type(codecs.from_dict(obj)), obj["metadata"]["name"])


def selftest_args(release: Release) -> list[str]:
    (pod,) = [o for o in release.tests if o["kind"] == "Pod"]
    (container,) = pod["spec"]["containers"]
    return [str(a) for a in container["args"]]


def run_selftest(
    args: list[str],
    kubeconfig: Path,
    config: Path,
    api: str,
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, dict[str, Any]]:
    """The pod's command with this machine's paths: its config file and the
    controller's address (the Service's DNS name does not resolve here)."""
    argv = list(args)
    argv[argv.index("--config") + 1] = str(config)
    argv[argv.index("--api") + 1] = api
    capsys.readouterr()
    code = main([*argv, "--kubeconfig", str(kubeconfig), "-o", "json"])
    out = capsys.readouterr().out
    return code, yaml.safe_load(out)


def test_helm_test_passes_on_a_working_install_and_names_what_is_not(
    kube: Client,
    control_plane: ControlPlane,
    release: Release,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = selftest_args(release)
    assert args[0] == "selftest"
    assert args[args.index("--api") + 1] == (
        f"http://{release.name}-controller.{release.namespace}.svc:8080"
    )
    election = {
        "namespace": release.namespace,
        "name": f"{release.name}-controller",  # the chart's Lease, which the hook may read
        "leaseSeconds": 4,
        "renewDeadlineSeconds": 3,
        "retryPeriodSeconds": 0.5,
    }
    config = controller_config(pool, leaderElection=election)
    config_path = tmp_path / "controller.yaml"
    config_path.write_text(yaml.safe_dump(config))
    (node,) = fake_gpu_nodes(1, labels=pool)
    controller = start_controller(config)
    controller.wait_leading()
    agent = AgentProcess(tmp_path, control_plane.kubeconfig, node).start()
    token = token_for(kube, release.namespace, f"{release.name}-selftest")
    kubeconfig, client = as_token(control_plane, tmp_path, token, "selftest")
    api = f"http://127.0.0.1:{controller.port}"
    try:

        def reported() -> bool:
            node_now = kube.get(Node, node)
            conditions = (node_now.status.conditions if node_now.status else None) or []
            return any(c.type == "GPUHealthy" for c in conditions)

        wait_for("the agent's report", reported)

        def passing() -> dict[str, Any] | None:
            code, report = run_selftest(args, kubeconfig, config_path, api, capsys)
            return report if code == exitcodes.OK else None

        report = wait_for("the selftest passing", passing, timeout_s=30)
        assert report is not None and report["ok"] is True
        details = {c["name"]: c["detail"] for c in report["checks"]}
        assert details["api"] == f"the controller answers at {api} and is ready"
        assert details["leader"].startswith(f"{controller.identity} leads")
        assert details["agents"] == "1 of 1 GPU nodes' agents report and see NVML and their GPUs"

        # A second GPU node where no agent runs.
        (silent,) = fake_gpu_nodes(1, labels=pool)
        code, report = run_selftest(args, kubeconfig, config_path, api, capsys)
        assert code == exitcodes.FINDINGS and report["ok"] is False
        (agents,) = [c for c in report["checks"] if c["name"] == "agents"]
        assert agents == {
            "name": "agents",
            "ok": False,
            "detail": "1 of 2 GPU nodes' agents report and see NVML and their GPUs; "
            f"no agent report from {silent}",
        }

        # The controller gone: no API, and no leader.
        controller.stop()

        def no_leader() -> dict[str, Any] | None:
            code, report = run_selftest(args, kubeconfig, config_path, api, capsys)
            checks = {c["name"]: c for c in report["checks"]}
            return checks if code == exitcodes.FINDINGS and not checks["leader"]["ok"] else None

        checks = wait_for("the Lease run out", no_leader, timeout_s=30)
        assert checks is not None
        assert not checks["api"]["ok"] and "/readyz does not answer" in checks["api"]["detail"]
        # A stopped controller gives its Lease up (no holder); a killed one lets it lapse.
        assert "no replica leads" in checks["leader"]["detail"]

        # The hook's identity reads nodes and its Lease, nothing else.
        assert forbidden(lambda: list(client.list(Pod, namespace=release.namespace)))
        assert forbidden(lambda: list(client.list(Secret, namespace=release.namespace)))
        assert forbidden(lambda: client.patch(Node, node, {"metadata": {"labels": {"x": "y"}}}))
    finally:
        agent.stop()


def notes(control_plane: ControlPlane, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it (a client-side dry run: nothing installed)."""
    argv = [
        str(control_plane.config.binaries.helm), "install", "gh-notes", str(CHART),
        "--namespace", "gpuheal-system", "--dry-run=client",
        "--kubeconfig", str(control_plane.kubeconfig),
    ]  # fmt: skip
    for value in sets:
        argv += ["--set", value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_the_install_notes_say_what_to_check_first(control_plane: ControlPlane) -> None:
    said = notes(control_plane)  # the chart's default: observe first
    assert "mode: observe" in said and "Mode observe: nothing is written to Nodes" in said
    assert "helm test gh-notes -n gpuheal-system --logs" in said
    assert "sum(gpuheal_agent_nvml_up) / count(gpuheal_agent_nvml_up)" in said
    assert "gpuheal crds check" in said and "WARNING" not in said
    full = notes(control_plane, "controller.config.mode=full", "agent.gpuReset.enabled=true")
    assert "mode: full" in full and "Mode observe" not in full
    assert "WARNING: agent.gpuReset.enabled without agent.config.repairEnabled" in full
    assert "must tolerate gpuheal.io/gpu-fault" in full
    off = notes(control_plane, "selftest.enabled=false")
    assert "helm test" not in off and "gpuheal selftest --config" in off
