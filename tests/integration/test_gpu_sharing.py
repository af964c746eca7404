"""GPU sharing as clusters configure it, through `gpuheal gate` against the real control
plane: a time-sliced pool (4 replicas), a MIG-mixed pool, and a MIG node that lost its
layout across a reboot, seen by a real agent. The labels are GPU Feature Discovery's
and the MIG manager's, as their labelers write them (gpuheal/policy/sharing.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal.cli import main
from gpuheal.model import MIG_LAYOUT
from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import controller_config

pytestmark = pytest.mark.timeout(240)

SHARED = {
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED",
}
MIXED = {
    "nvidia.com/gpu.count": "4",
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/mig-3g.40gb.count": "8",
    "nvidia.com/mig.config": "custom-half-3g",
    "nvidia.com/mig.config.state": "success",
}


def offer(kube: Client, node: str, resources: dict[str, str]) -> None:
    """What the device plugin would advertise: capacity and allocatable."""
    body = {"status": {"capacity": resources, "allocatable": resources}}
    kube.patch(Node.Status, node, body)


def gate(
    control_plane: ControlPlane, config: Path, node: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["gate", node, "-o", "json", "--kubeconfig", str(control_plane.kubeconfig),
                 "--config", str(config)])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    return code, next(c for c in out["checks"] if c["name"] == "gpu-count")


def test_shared_and_mig_pools_pass_the_gate_and_a_lost_mig_layout_fails_it_naming_both(
    control_plane: ControlPlane,
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    pool: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "gpuheal.yaml"
    config.write_text(yaml.safe_dump(controller_config(pool)))
    (shared,) = fake_gpu_nodes(1, gpus=32, labels={**pool, **SHARED})
    code, check = gate(control_plane, config, shared, capsys)
    assert (code, check["result"]) == (0, "pass"), check
    assert "8 GPUs x 4 time-slicing replicas" in check["reason"]
    offer(kube, shared, {"nvidia.com/gpu": "28"})  # one GPU's replicas gone
    code, check = gate(control_plane, config, shared, capsys)
    assert code == 64 | 2 and "28 nvidia.com/gpu allocatable, expected 32" in check["reason"]

    (mixed,) = fake_gpu_nodes(1, gpus=4, labels={**pool, **MIXED})
    offer(kube, mixed, {"nvidia.com/gpu": "4", "nvidia.com/mig-3g.40gb": "8"})
    code, check = gate(control_plane, config, mixed, capsys)
    assert (code, check["result"]) == (0, "pass"), check

    # A node asked for all-1g.10gb whose reboot lost it: the MIG manager failed to apply
    # it, and the agent's NVML sees MIG disabled on every GPU.
    lost = {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "failed"}
    (mig,) = fake_gpu_nodes(1, labels={**pool, **lost})
    agent = AgentProcess(tmp_path, control_plane.kubeconfig, mig).start()
    try:
        wait_for(
            "the agent's MIG view",
            lambda: (
                ((kube.get(Node, mig).metadata.annotations or {}).get(MIG_LAYOUT))  # type: ignore[union-attr]
                == "disabled"
            ),
        )
        code, check = gate(control_plane, config, mig, capsys)
        assert code == 64 | 2, check
        assert check["reason"] == (
            "nvidia.com/mig.config=all-1g.10gb is not applied "
            "(nvidia.com/mig.config.state=failed, the agent sees disabled)"
        )
    finally:
        agent.stop()
