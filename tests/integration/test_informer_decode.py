"""What the controller's informers take in: every object the API server allows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from lightkube import Client
from lightkube.types import PatchType

from gpuheal.kube.api import KubeApi, gpufault_path
from gpuheal.kube.informer import Informer
from gpuheal.kube.projections import Meta
from gpuheal.model import fault_record_name
from gpuheal.sim import ControlPlane
from gpuheal.sim.resources import GPUFault
from gpuheal.values import node_label
from tests import corpus
from tests.helpers import FakeNodes, gpufault_spec, unique, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    our_taint,
    report_fault,
)

pytestmark = pytest.mark.timeout(240)


def create_record(
    kube: Client, node: str, fault_id: str, status: dict[str, Any], **labels: str
) -> str:
    """A GPUFault as a person (or an older controller) may leave it: `status`
    written through the status subresource with a JSON patch, nulls kept."""
    name = fault_record_name(node, fault_id)
    record = {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "GPUFault",
        "metadata": {"name": name, "labels": {"gpuheal.io/node": node_label(node), **labels}},
        "spec": gpufault_spec(node, fault_id),
    }
    kube.create(GPUFault.from_dict(record))
    set_status(kube, name, status)
    return name


def set_status(kube: Client, name: str, status: dict[str, Any]) -> str:
    """Replace the record's status; its new resourceVersion."""
    patch = [{"op": "add", "path": "/status", "value": status}]
    updated = kube.patch(GPUFault.Status, name, patch, patch_type=PatchType.JSON)
    return str(updated["metadata"]["resourceVersion"])


def test_a_gpufault_with_a_null_recovering_since_neither_blocks_the_start_nor_the_remediation(
    kube: Client,
    pool: dict[str, str],
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
) -> None:
    quiet, faulty = fake_gpu_nodes(2, labels=pool)
    # status.recoveringSince and status.expiry are nullable in the CRD.
    nulls = {"phase": "Recovering", "recoveringSince": None, "expiry": None}
    elsewhere = corpus.unique_eks_node()  # a node this controller does not manage
    held = create_record(kube, elsewhere, f"{elsewhere}-20261201T023012Z-a1b2c3", nulls)
    stored = kube.get(GPUFault, held)["status"]
    assert "recoveringSince" in stored and stored["recoveringSince"] is None  # kept as null
    create_record(kube, quiet, "xid-48-20261201T023013Z", {"phase": "Resolved"})
    create_record(kube, elsewhere, "xid-79-20261201T023014Z", {"phase": "Resolved"})

    # Before the fix the LIST of GPUFaults failed as a whole: never ready (start times out).
    controller = start_controller(controller_config(pool))

    # One more, while the controller watches: the watch takes it too.
    later = corpus.unique_eks_node()
    create_record(kube, later, f"{later}-20261201T023015Z-d4e5f6", nulls)
    report_fault(kube, faulty, f"{faulty}-20261201T023016Z-0f1e2d")
    wait_for("the faulty node quarantined", lambda: our_taint(kube, faulty), timeout_s=30)
    assert our_taint(kube, quiet) is None

    metrics = controller.metrics()
    for informer in ("nodes", "pods", "gpufaults", "canaries", "validations"):
        # Nothing skipped: every object the API server allows is decoded.
        assert f'gpuheal_informer_decode_errors_total{{informer="{informer}"}} 0.0' in metrics
    assert "informer failed" not in controller.log()


# The GPUFault projection as it was before nullable fields were read: a stand-in,
# on the real API server, for any object some projection cannot take.
class StrictStatus(msgspec.Struct):
    phase: str = ""
    recoveringSince: str = ""  # noqa: N815


class StrictFault(msgspec.Struct):
    metadata: Meta
    status: StrictStatus = msgspec.field(default_factory=StrictStatus)


def test_an_object_the_projection_cannot_take_is_skipped_in_the_list_and_the_watch(
    control_plane: ControlPlane, kube: Client, crds: None
) -> None:
    case = unique("decode")
    nodes = [corpus.unique_eks_node() for _ in range(3)]
    nulls = {"phase": "Recovering", "recoveringSince": None}
    good, other, bad = (
        create_record(kube, node, f"{node}-xid-79", status, **{"gpuheal.test/case": case})
        for node, status in zip(nodes, [{"phase": "Quarantined"}] * 2 + [nulls], strict=True)
    )
    counted: list[str] = []

    async def scenario() -> None:
        api = KubeApi.from_kubeconfig(control_plane.kubeconfig)
        informer: Informer[StrictFault, tuple[str, str, str]] = Informer(
            api,
            gpufault_path(),
            StrictFault,
            lambda f: (f.metadata.name, f.metadata.resourceVersion, f.status.phase),
            lambda v: v[0],
            name="strict-gpufaults",
            label_selector=f"gpuheal.test/case={case}",
            on_decode_error=lambda: counted.append("x"),
        )
        task = asyncio.create_task(informer.run())

        async def until(what: str, check: Callable[[], bool]) -> None:
            for _ in range(150):
                if check():
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"timed out waiting for {what}")

        try:
            await asyncio.wait_for(informer.synced.wait(), 20)  # before: never synced
            assert set(informer.store) == {good, other}
            assert counted == ["x"]
            kept = informer.store[good]

            # A record turning undecodable: the cache keeps its last good version.
            rv = await asyncio.to_thread(set_status, kube, good, nulls)
            await until("the bad version seen", lambda: informer.resource_version == rv)
            assert informer.store[good] == kept
            assert counted == ["x", "x"]
            # The watch goes on: a good change after it is applied.
            await asyncio.to_thread(set_status, kube, other, {"phase": "Draining"})
            await until("the next change", lambda: informer.store[other][2] == "Draining")

            # Deletions apply, decodable or not, and are not reported.
            await asyncio.to_thread(kube.delete, GPUFault, good)
            await asyncio.to_thread(kube.delete, GPUFault, bad)
            await until("the deletion", lambda: good not in informer.store)
            assert counted == ["x", "x"]
            assert (informer.relists, informer.decode_errors) == (1, 2)  # never relisted
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await api.close()

    asyncio.run(scenario())
