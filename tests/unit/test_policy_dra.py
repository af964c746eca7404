"""Which GPUs a DRA node offers and which a pod holds: ResourceSlices and
ResourceClaims as NVIDIA's DRA driver and the scheduler write them (sim/dra.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuheal.model import DeviceKey
from gpuheal.policy.dra import (
    allocated_keys,
    by_key,
    pod_claim_names,
    pod_gpus,
    slice_devices,
)
from gpuheal.sim.agent import gpu_spec
from gpuheal.sim.dra import DRIVER, MAX_DRA_NODE_NAME, bus_id, claim_pod, resource_slice, semver
from tests.corpus import fqdn

pytestmark = pytest.mark.unit

NODE = "ip-10-0-12-34.us-west-2.compute.internal"


def stored(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest as the API server returns it (generateName filled in)."""
    item = copy.deepcopy(manifest)
    item["metadata"]["name"] = item["metadata"].pop("generateName", "") + "x7k2p"
    return item


def allocated(name: str, namespace: str, *devices: str, pool: str = NODE) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": DRIVER, "pool": pool, "device": d}
                        for d in devices
                    ]
                }
            }
        },
    }


def test_an_eight_gpu_slice_is_eight_gpus_known_by_uuid() -> None:
    spec = gpu_spec(NODE)
    devices = slice_devices([stored(resource_slice(NODE, spec))])[NODE]
    assert [d.key.device for d in devices] == [f"gpu-{i}" for i in range(8)]
    assert [d.uuid for d in devices] == [g["uuid"] for g in spec["devices"]]
    assert {d.kind for d in devices} == {"gpu"} and {d.key.pool for d in devices} == {NODE}
    assert devices[3].gpu_uuid == spec["devices"][3]["uuid"]


def test_other_drivers_unbound_slices_and_older_generations_are_not_gpus() -> None:
    spec = gpu_spec(NODE)
    current = stored(resource_slice(NODE, spec, generation=2))
    older = stored(resource_slice(NODE, gpu_spec("elsewhere"), generation=1))
    nic = copy.deepcopy(current)
    nic["spec"]["driver"] = "sriovnetwork.k8s.io"
    unbound = copy.deepcopy(current)
    unbound["spec"].pop("nodeName")
    unbound["spec"]["pool"]["name"] = "fabric"
    found = slice_devices([older, nic, unbound, current])
    assert list(found) == [NODE]
    assert [d.uuid for d in found[NODE]] == [g["uuid"] for g in spec["devices"]]


def test_a_device_of_another_type_is_no_gpu_and_a_mig_device_names_its_gpu() -> None:
    item = stored(resource_slice(NODE, gpu_spec(NODE, 1)))
    parent = item["spec"]["devices"][0]["attributes"]["uuid"]["string"]
    item["spec"]["devices"] += [
        {
            "name": "gpu-0-mig-1g10gb-19-0",
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": "MIG-5c89852c-d268-5e49-9bc4-0a4a8a3a5c11"},
                "gpu.nvidia.com/parentUUID": {"string": parent},
                "profile": {"string": "1g.10gb"},
            },
        },
        {"name": "channel-0", "attributes": {"type": {"string": "channel"}}},
        {"name": "other-domain", "attributes": {"example.com/type": {"string": "gpu"}}},
    ]
    devices = slice_devices([item])[NODE]
    assert [(d.key.device, d.kind) for d in devices] == [
        ("gpu-0", "gpu"),
        ("gpu-0-mig-1g10gb-19-0", "mig"),
    ]
    assert devices[1].uuid.startswith("MIG-") and devices[1].gpu_uuid == parent


def test_a_pod_names_its_claims_directly_or_through_a_template() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "gpus", "resourceClaimName": "train-0-gpus"},
                {"name": "more", "resourceClaimTemplateName": "one-gpu"},
                {"name": "pending", "resourceClaimTemplateName": "one-gpu"},
            ]
        },
        "status": {
            "resourceClaimStatuses": [
                {"name": "more", "resourceClaimName": "train-0-more-q8x2n"},
                {"name": "pending"},  # not generated yet
            ]
        },
    }
    assert pod_claim_names(pod) == ("train-0-gpus", "train-0-more-q8x2n")
    assert pod_claim_names({"spec": {"containers": []}}) == ()


def test_a_pod_holds_the_gpus_its_allocated_claims_name() -> None:
    spec = gpu_spec(NODE)
    devices = by_key(slice_devices([stored(resource_slice(NODE, spec))]))
    pod = claim_pod("train-0", "ml", "train-0-gpus")
    claims = {
        ("ml", "train-0-gpus"): allocated("train-0-gpus", "ml", "gpu-3", "gpu-5"),
        ("other", "train-0-gpus"): allocated("train-0-gpus", "other", "gpu-1"),
    }
    held = pod_gpus(pod, claims, devices)
    assert [d.uuid for d in held] == [spec["devices"][3]["uuid"], spec["devices"][5]["uuid"]]
    # Before the scheduler allocates: nothing held.
    assert pod_gpus(pod, {("ml", "train-0-gpus"): {"status": {}}}, devices) == ()
    # A device no slice publishes any more (its node went): left out.
    gone = {("ml", "train-0-gpus"): allocated("train-0-gpus", "ml", "gpu-3", pool="gone")}
    assert pod_gpus(pod, gone, devices) == ()


def test_only_the_gpu_drivers_allocations_count() -> None:
    claim = allocated("c", "ml", "gpu-0")
    claim["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "sriovnetwork.k8s.io", "pool": NODE, "device": "vf-0"}
    )
    assert allocated_keys(claim) == (DeviceKey(DRIVER, NODE, "gpu-0"),)


def test_the_drivers_value_shapes() -> None:
    assert semver("570.172.08") == "570.172.8" and semver("12.8") == "12.8.0"
    assert bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    # The pool is the node's name; the slice's generated name holds it too, so the
    # longest node name the driver can publish for leaves that name at 253 and a dash.
    long_name = fqdn(MAX_DRA_NODE_NAME)
    item = resource_slice(long_name, gpu_spec(long_name, 1))
    assert item["spec"]["pool"]["name"] == long_name == item["spec"]["nodeName"]
    assert len(item["metadata"]["generateName"]) == 254
