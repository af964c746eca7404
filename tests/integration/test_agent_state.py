"""A real agent process started on a node whose state files are broken."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
from lightkube import Client

from gpuheal.sim import ControlPlane
from gpuheal.sim.agent import AgentProcess
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import gpu_healthy

pytestmark = pytest.mark.timeout(240)

XID_79 = "NVRM: Xid (PCI:0000:1a:00): 79, pid=<unknown>, GPU has fallen off the bus."

# (kernel log cursor, sticky faults): what a full disk, a filesystem repair or a
# hand edit leaves behind. The agent writes both files; boot "boot-1" is the node's.
BROKEN = {
    "truncated": (
        b'{"boot_id": "boot-1", "se',
        b'{"boot_id": "boot-1", "items": {"XidCritical79/GPU-5b2f4a8e-9c1d-3f7a-b0e2-4d6c',
    ),
    "wrong types": (
        b'{"boot_id": "boot-1", "seq": 1e400}',
        json.dumps(
            {
                "boot_id": "boot-1",
                "items": {
                    "XidCritical79/GPU-5b2f4a8e-9c1d-3f7a-b0e2-4d6c8a1f3e95": {
                        "at": "yesterday",
                        "reason": 79,
                        "severity": "P9",
                        "message": None,
                    }
                },
            }
        ).encode(),
    ),
    "binary garbage": (bytes(range(255, -1, -1)) * 4, b"\x00" * 4096),
    "empty": (b"", b""),
}


def reports_xid_79(kube: Client, node: str) -> bool:
    return gpu_healthy(kube, node)[:2] == ("False", "XidCritical79")


@pytest.mark.parametrize("shape", list(BROKEN))
def test_a_broken_state_file_is_set_aside_and_the_agent_starts_fresh(
    shape: str,
    control_plane: ControlPlane,
    kube: Client,
    fake_gpu_nodes: FakeNodes,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    (node,) = fake_gpu_nodes(1)
    agent = AgentProcess(tmp_path, control_plane.kubeconfig, node)
    state = agent.dir / "state"
    state.mkdir(parents=True)
    cursor, faults = state / "agent-state.json", state / "agent-state-faults.json"
    cursor.write_bytes(BROKEN[shape][0])
    faults.write_bytes(BROKEN[shape][1])
    agents.append(agent)
    agent.start()  # before the fix: "wrong types" crashed here, at every restart

    for role, path, broken in (("cursor", cursor, 0), ("faults", faults, 1)):
        aside = path.with_name(path.name + ".corrupt")
        assert aside.read_bytes() == BROKEN[shape][broken], role  # kept for a person
        assert agent.metric(f'gpuheal_agent_state_file_errors_total{{file="{role}"}}') == 1
        lines = [
            json.loads(line)
            for line in agent.log().splitlines()
            if "agent state file unreadable" in line
        ]
        said = [(e["level"], e["kept_as"]) for e in lines if e["path"] == str(path)]
        assert said == [("warning", str(aside))], role

    # A fresh start that works: a new Xid is reported, and saved in good files.
    agent.kernel(XID_79)
    wait_for("the Xid reported", partial(reports_xid_79, kube, node))
    assert json.loads(cursor.read_text())["seq"] >= 0
    assert len(json.loads(faults.read_text())["items"]) == 1
