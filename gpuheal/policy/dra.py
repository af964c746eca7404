"""GPUs offered through Dynamic Resource Allocation: which devices a node has, and
which GPUs a pod holds, read from ResourceSlices and ResourceClaims.

On a DRA node a GPU is no count: it is a device (driver, pool, name) in a
ResourceSlice, and a pod holds the devices its allocated claims name. A fault is
reported against a GPU's UUID (NVML, the kernel log, DCGM), so both sides meet at
the `uuid` attribute NVIDIA's DRA driver publishes for every GPU and MIG device.

Pure functions of the objects as the API server returns them (JSON as mappings):
the shell lists them; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GPU_DRIVERS = frozenset({"gpu.nvidia.com"})
# The driver's `type` attribute: a whole GPU or a MIG slice of one (vfio: passed
# through to a VM, still one physical GPU).
GPU_TYPES = frozenset({"gpu", "mig", "vfio"})


@dataclass(frozen=True, order=True)
class DeviceKey:
    """How a ResourceClaim's allocation and a DeviceTaintRule name one device."""

    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class DraDevice:
    """One GPU or MIG device a DRA driver offers on a node."""

    key: DeviceKey
    node: str
    uuid: str  # GPU-… for a whole GPU, MIG-… for a MIG device; "" when unpublished
    kind: str  # gpu | mig | vfio
    parent_uuid: str  # the GPU a MIG device is carved from; "" otherwise

    @property
    def gpu_uuid(self) -> str:
        """The physical GPU: what an Xid or a reset names."""
        return self.parent_uuid or self.uuid


def _attribute(device: Mapping[str, Any], driver: str, name: str) -> str:
    """A string attribute of the driver's domain: unqualified keys are the driver's,
    so `uuid` and `gpu.nvidia.com/uuid` are one attribute."""
    attributes = device.get("attributes") or {}
    for key in (name, f"{driver}/{name}"):
        value = attributes.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("string"), str):
            return str(value["string"])
    return ""


def slice_devices(
    slices: Iterable[Mapping[str, Any]], drivers: frozenset[str] = GPU_DRIVERS
) -> dict[str, tuple[DraDevice, ...]]:
    """Each node's GPU devices, from the ResourceSlices of `drivers` (others, and
    slices not bound to one node, are left out). Of a pool published in more than
    one generation, only the newest counts, as the scheduler reads it."""
    newest: dict[tuple[str, str], int] = {}
    chosen: list[Mapping[str, Any]] = []
    for item in slices:
        spec = item.get("spec") or {}
        pool = spec.get("pool") or {}
        if spec.get("driver") not in drivers or not spec.get("nodeName"):
            continue
        chosen.append(spec)
        pool_key = (str(spec["driver"]), str(pool.get("name", "")))
        newest[pool_key] = max(newest.get(pool_key, 0), int(pool.get("generation", 0)))
    found: dict[str, list[DraDevice]] = {}
    for spec in chosen:
        pool = spec.get("pool") or {}
        pool_key = (str(spec["driver"]), str(pool.get("name", "")))
        if int(pool.get("generation", 0)) != newest[pool_key]:
            continue
        node = str(spec["nodeName"])
        for device in spec.get("devices") or []:
            kind = _attribute(device, pool_key[0], "type")
            if kind not in GPU_TYPES:
                continue
            key = DeviceKey(pool_key[0], pool_key[1], str(device.get("name", "")))
            uuid = _attribute(device, key.driver, "uuid")
            parent = _attribute(device, key.driver, "parentUUID")
            found.setdefault(node, []).append(DraDevice(key, node, uuid, kind, parent))
    return {node: tuple(sorted(devices, key=lambda d: d.key)) for node, devices in found.items()}


def pod_claim_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceClaims a pod uses, by name: named in its spec, or generated from a
    template (the name the control plane chose is in the pod's status)."""
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names = []
    for claim in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = claim.get("resourceClaimName") or generated.get(claim.get("name"))
        if name:
            names.append(str(name))
    return tuple(names)


def allocated_keys(
    claim: Mapping[str, Any], drivers: frozenset[str] = GPU_DRIVERS
) -> tuple[DeviceKey, ...]:
    """The devices of `drivers` the scheduler allocated to a claim (none before)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return tuple(
        DeviceKey(str(r["driver"]), str(r.get("pool", "")), str(r.get("device", "")))
        for r in results
        if r.get("driver") in drivers
    )


def pod_gpus(
    pod: Mapping[str, Any],
    claims: Mapping[tuple[str, str], Mapping[str, Any]],
    devices: Mapping[DeviceKey, DraDevice],
) -> tuple[DraDevice, ...]:
    """The GPU devices a pod holds through its claims. `claims` by (namespace, name);
    `devices` by key (from slice_devices). A claim not yet allocated holds none; an
    allocated device no slice publishes any longer is left out (its node is gone)."""
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    held: list[DraDevice] = []
    for name in pod_claim_names(pod):
        claim = claims.get((namespace, name))
        if claim is None:
            continue
        held.extend(devices[k] for k in allocated_keys(claim) if k in devices)
    return tuple(held)


def by_key(nodes: Mapping[str, Iterable[DraDevice]]) -> dict[DeviceKey, DraDevice]:
    """slice_devices' answer indexed by device key."""
    return {d.key: d for devices in nodes.values() for d in devices}
