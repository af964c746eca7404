"""Releasing a fault the breaker holds, on the real control plane: the released
fault is quarantined and drained exactly once, past the full breaker, audited in
its record and an Event; every other held fault stays held; a second release is
refused (docs/controller.md#releasing-a-held-fault)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from lightkube import Client

from gpuheal.sim import ControlPlane
from gpuheal.sim.controlplane import ADMIN
from gpuheal.sim.workloads import apply, gpu_pod, wait_pods_running
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    clear_fault,
    controller_config,
    entries_of,
    events_for,
    our_taint,
    pods_on,
    pods_told_evicted,
    report_fault,
)
from tests.integration.test_approval import TOKEN, gpuheal, post, status_of, the_record

pytestmark = pytest.mark.timeout(240)


def breaker_of_one(pool: dict[str, str], tmp_path: Path) -> dict[str, object]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    return controller_config(pool, breakerMaxNodes=1, apiTokenFile=str(token_file))


def test_a_released_fault_is_remediated_once_past_the_breaker_and_the_others_stay_held(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    first, second, third = fake_gpu_nodes(3, labels=pool)
    for node in (first, second, third):
        apply(kube, gpu_pod(f"trainer-{node.split('.')[0]}", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=3)
    controller = start_controller(breaker_of_one(pool, tmp_path)).wait_leading()
    report_fault(kube, first, "xid-79-first")
    wait_for("the first taint", lambda: our_taint(kube, first) is not None, timeout_s=30)
    report_fault(kube, second, "xid-79-second")
    report_fault(kube, third, "xid-79-third")
    held = {node: the_record(kube, node, "Held") for node in (second, third)}
    assert our_taint(kube, second) is None and our_taint(kube, third) is None

    code, out, err = gpuheal(control_plane, capsys, "release", "xid-79-second")
    assert code == 0, err
    released = json.loads(out)
    assert (released["name"], released["by"], released["node"]) == (held[second], ADMIN, second)
    assert status_of(kube, held[second])["release"] == {"by": ADMIN, "at": released["at"]}

    wait_for("the released taint", lambda: our_taint(kube, second) is not None, timeout_s=30)
    wait_for("the drain", lambda: not pods_on(kube, namespace, second), timeout_s=30)
    the_record(kube, second, "Drained")
    (entry,) = entries_of(kube, "released", name=held[second])
    assert entry["detail"] == f"by {ADMIN} at {released['at']}"
    assert len(entries_of(kube, "taint", name=held[second])) == 1
    assert len(events_for(kube, second, "GPUFaultReleased", at_least=1)) == 1
    assert len(events_for(kube, second, "GPUFaultQuarantined", at_least=1)) == 1
    assert pods_told_evicted(kube, second, at_least=1) == [
        f"{namespace}/trainer-{second.split('.')[0]}"
    ]
    # A second release is refused and changes nothing.
    code, _, err = gpuheal(control_plane, capsys, "release", held[second])
    assert code == 2 and "already released" in err

    # The other held fault stays held: the breaker is still full.
    time.sleep(2)  # several holdRetrySeconds: whatever it would do, it would have done
    assert the_record(kube, third, "Held") == held[third]
    assert our_taint(kube, third) is None
    assert pods_on(kube, namespace, third) == {f"trainer-{third.split('.')[0]}"}

    # Through the API: released once (in the API's name), refused after.
    code, body = post(controller, f"/api/v1/faults/{held[third]}/release")
    assert code == 200 and body["by"] == "api-token" and body["released"] is True
    assert post(controller, f"/api/v1/faults/{held[third]}/release")[0] == 409
    wait_for("the API's taint", lambda: our_taint(kube, third) is not None, timeout_s=30)
    the_record(kube, third, "Drained")
    (entry,) = entries_of(kube, "released", name=held[third])
    assert entry["detail"].startswith("by api-token at ")
    assert len(events_for(kube, third, "GPUFaultReleased", at_least=1)) == 1


def test_a_held_fault_that_cleared_takes_no_release(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    first, second = fake_gpu_nodes(2, labels=pool)
    controller = start_controller(breaker_of_one(pool, tmp_path)).wait_leading()
    report_fault(kube, first, "xid-79-first")
    wait_for("the first taint", lambda: our_taint(kube, first) is not None, timeout_s=30)
    report_fault(kube, second, "xid-79-transient")
    name = the_record(kube, second, "Held")
    clear_fault(kube, second)
    the_record(kube, second, "Resolved")

    code, _, err = gpuheal(control_plane, capsys, "release", name)
    assert code == 2 and "Resolved, not held by the breaker nor a repeat offender" in err
    assert post(controller, f"/api/v1/faults/{name}/release")[0] == 409
    time.sleep(1)
    assert our_taint(kube, second) is None
    assert "release" not in status_of(kube, name)
    assert not events_for(kube, second, "GPUFaultReleased")
