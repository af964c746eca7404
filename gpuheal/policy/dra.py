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
from dataclasses import replace
from typing import Any

from gpuheal.model import (
    TAINT_KEY,
    DeviceKey,
    DeviceTaint,
    DraDevice,
    FenceView,
    PodView,
    SliceView,
)

GPU_DRIVERS = frozenset({"gpu.nvidia.com"})
# The driver's `type` attribute: a whole GPU or a MIG slice of one (vfio: passed
# through to a VM, still one physical GPU).
GPU_TYPES = frozenset({"gpu", "mig", "vfio"})


def attribute(attributes: Mapping[str, str], driver: str, name: str) -> str:
    """A string attribute of the driver's domain: unqualified keys are the driver's,
    so `uuid` and `gpu.nvidia.com/uuid` are one attribute."""
    return attributes.get(name) or attributes.get(f"{driver}/{name}") or ""


def gpu_device(
    key: DeviceKey, node: str, attributes: Mapping[str, str], taints: tuple[DeviceTaint, ...]
) -> DraDevice | None:
    """One device of a slice, from its string attributes: a GPU, a MIG device or a
    passed-through GPU; None for anything else the driver offers."""
    kind = attribute(attributes, key.driver, "type")
    if kind not in GPU_TYPES:
        return None
    return DraDevice(
        key,
        node,
        uuid=attribute(attributes, key.driver, "uuid"),
        kind=kind,
        parent_uuid=attribute(attributes, key.driver, "parentUUID"),
        taints=taints,
    )


def _strings(device: Mapping[str, Any]) -> dict[str, str]:
    """A device's string attributes (the JSON `{"string": ...}` of each)."""
    return {
        k: v["string"]
        for k, v in (device.get("attributes") or {}).items()
        if isinstance(v, Mapping) and isinstance(v.get("string"), str)
    }


def slice_of(item: Mapping[str, Any], drivers: frozenset[str] = GPU_DRIVERS) -> SliceView | None:
    """A ResourceSlice (JSON as a mapping) of one of `drivers` bound to one node, with
    its GPU and MIG devices; None for any other slice."""
    spec = item.get("spec") or {}
    pool = spec.get("pool") or {}
    driver, node = str(spec.get("driver", "")), str(spec.get("nodeName") or "")
    if driver not in drivers or not node:
        return None
    name = str(pool.get("name", ""))
    found = (
        gpu_device(
            DeviceKey(driver, name, str(device.get("name", ""))),
            node,
            _strings(device),
            tuple(_taint(t) for t in device.get("taints") or ()),
        )
        for device in spec.get("devices") or []
    )
    devices = [d for d in found if d is not None]
    return SliceView(
        name=str((item.get("metadata") or {}).get("name", "")),
        driver=driver,
        pool=name,
        generation=int(pool.get("generation", 0)),
        node=node,
        devices=tuple(devices),
    )


def _taint(taint: Mapping[str, Any]) -> DeviceTaint:
    return DeviceTaint(
        str(taint.get("key", "")),
        str(taint.get("value") or ""),
        str(taint.get("effect", "")),
        str(taint.get("timeAdded") or ""),
    )


def newest_devices(slices: Iterable[SliceView]) -> dict[str, tuple[DraDevice, ...]]:
    """Each node's GPU devices. Of a pool published in more than one generation, only
    the newest counts, as the scheduler reads it."""
    chosen = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for item in chosen:
        pool_key = (item.driver, item.pool)
        newest[pool_key] = max(newest.get(pool_key, 0), item.generation)
    found: dict[str, list[DraDevice]] = {}
    for item in chosen:
        if item.generation == newest[(item.driver, item.pool)]:
            found.setdefault(item.node, []).extend(item.devices)
    return {node: tuple(sorted(devices, key=lambda d: d.key)) for node, devices in found.items()}


def slice_devices(
    slices: Iterable[Mapping[str, Any]], drivers: frozenset[str] = GPU_DRIVERS
) -> dict[str, tuple[DraDevice, ...]]:
    """Each node's GPU devices, from the ResourceSlices of `drivers` (others, and
    slices not bound to one node, are left out)."""
    return newest_devices(v for item in slices if (v := slice_of(item, drivers)) is not None)


def gpu_count(devices: Iterable[DraDevice]) -> int:
    """GPUs as people count them: whole GPUs, and each MIG device of a GPU not also
    offered whole (as `gpuheal status` counts MIG profiles of a device plugin)."""
    devices = tuple(devices)
    whole = {d.uuid for d in devices if d.kind != "mig"}
    return sum(1 for d in devices if d.kind != "mig" or d.parent_uuid not in whole)


def usable_count(devices: Iterable[DraDevice]) -> int:
    """Of gpu_count, those new claims may be given (no fencing taint)."""
    return gpu_count(d for d in devices if d.usable)


def device_key(resource_id: str) -> DeviceKey | None:
    """A DRA device from the kubelet's resourceID, "<driver>/<pool>/<device>" (a pool
    may hold slashes; driver and device hold none); None for any other ID."""
    driver, _, rest = resource_id.partition("/")
    pool, _, device = rest.rpartition("/")
    return DeviceKey(driver, pool, device) if driver and pool and device else None


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
    """The GPU devices a pod holds through its claims, from the objects as JSON (the
    read commands and tests; the controller's index joins its projections through
    claim_gpus). `claims` by (namespace, name); `devices` by key (from
    slice_devices). A claim not yet allocated holds none; an allocated device no
    slice publishes any longer is left out (its node is gone)."""
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    allocated = {f"{ns}/{name}": allocated_keys(claim) for (ns, name), claim in claims.items()}
    return claim_gpus(namespace, pod_claim_names(pod), allocated, devices)


def by_key(nodes: Mapping[str, Iterable[DraDevice]]) -> dict[DeviceKey, DraDevice]:
    """slice_devices' answer indexed by device key."""
    return {d.key: d for devices in nodes.values() for d in devices}


def fenced(devices: Iterable[DraDevice], fences: Iterable[FenceView]) -> tuple[DraDevice, ...]:
    """The devices with gpuheal's fences (its DeviceTaintRules) among their taints:
    the scheduler reads the rules beside the slices, and so does every count of the
    GPUs new claims may be given."""
    taints: dict[DeviceKey, list[DeviceTaint]] = {}
    for rule in fences:
        taints.setdefault(rule.device, []).append(DeviceTaint(TAINT_KEY, "", rule.effect))
    return tuple(
        replace(d, taints=(*d.taints, *taints[d.key])) if d.key in taints else d for d in devices
    )


def claim_gpus(
    namespace: str,
    claims: Iterable[str],
    allocated: Mapping[str, Iterable[DeviceKey]],
    devices: Mapping[DeviceKey, DraDevice],
) -> tuple[DraDevice, ...]:
    """The GPU devices a pod's claims (by name) were allocated, as the slices publish
    them; `allocated`: each claim's devices by "namespace/name"."""
    held: dict[DeviceKey, DraDevice] = {}
    for name in claims:
        for key in allocated.get(f"{namespace}/{name}", ()):
            if key in devices:
                held[key] = devices[key]
    return tuple(held[k] for k in sorted(held))


def holding(view: PodView, held: tuple[DraDevice, ...]) -> PodView:
    """The pod holding `held` through its claims: a GPU pod if it holds one, its
    gpu_count its extended resources' and its devices' together (the same view given
    again is joined again, not added to)."""
    if held == view.held:
        return view
    own = view.gpu_count - gpu_count(view.held)  # what its extended resources ask
    return replace(
        view,
        held=held,
        gpu=(own > 0 if view.held else view.gpu) or bool(held),
        gpu_count=own + gpu_count(held),
    )
