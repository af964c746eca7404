"""DRA-native GPU nodes for the local control plane: the DeviceClasses and the
ResourceSlice NVIDIA's DRA driver publishes, and pods that ask for GPUs through a
ResourceClaim, which the real kube-scheduler allocates and kwok runs.

The shapes are the driver's (kubernetes-sigs/dra-driver-nvidia-gpu at DRIVER_COMMIT,
default feature gates): one slice per node, its pool named after the node; a device
per GPU named `gpu-<minor>`, with the attributes of cmd/gpu-kubelet-plugin/deviceinfo.go
(`type`, `uuid`, `productName`, `brand`, `architecture`, three versions, and the
standard `resource.kubernetes.io/pciBusID`); `memory` as capacity. The driver writes
`resource.k8s.io/v1` where the API server serves it (GA since Kubernetes 1.34).
`index` and `minor` are no attributes since 2025-09: a GPU is known by its uuid.
A GPU in MIG mode is published as its MIG devices only (`type: mig`, their own
`uuid`, the GPU's as `parentUUID`, the `profile`), named by profile and placement.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from gpuheal.sim.nodes import GPU_RESOURCE, gpu_node
from gpuheal.sim.workloads import WORKLOAD_IMAGE

DRIVER = "gpu.nvidia.com"
DRIVER_COMMIT = "95932046683719c43b6a0dd9613c2e5aad5d6703"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
RESOURCE_API = "resource.k8s.io/v1"
# The slice's generateName, `00000-gpu.nvidia.com-<node>-`, less its final dash, must
# fit in 253 characters (seen on the real API server: 254 taken, 255 refused): the
# driver can publish no slice for a node whose name is longer than this.
MAX_DRA_NODE_NAME = 253 - len(f"00000-{DRIVER}-")

# What the driver reads from NVML for an H100 SXM on a 570 driver (CUDA 12.8).
H100 = {
    "productName": "NVIDIA H100 80GB HBM3",
    "brand": "Nvidia",
    "architecture": "Hopper",
    "cudaComputeCapability": "9.0.0",
    "memory": "81559Mi",
}
CUDA_DRIVER_VERSION = "12.8.0"


def device_classes() -> list[dict[str, Any]]:
    """The driver chart's classes for full GPUs and MIG devices: a CEL check on `type`."""
    return [
        {
            "apiVersion": RESOURCE_API,
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f"device.driver == '{DRIVER}' && "
                            f"device.attributes['{DRIVER}'].type == '{kind}'"
                        }
                    }
                ]
            },
        }
        for name, kind in ((GPU_CLASS, "gpu"), (MIG_CLASS, "mig"))
    ]


def semver(version: str) -> str:
    """As the driver writes an NVML version: three parts, no leading zeros
    (`550.54.15` stays, `570.172.08` becomes `570.172.8`, `12.8` becomes `12.8.0`)."""
    parts = [str(int(p)) for p in version.split(".")][:3]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def bus_id(nvml_bus_id: str) -> str:
    """NVML's `00000000:18:00.0` as the standard attribute's `0000:18:00.0`."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{domain[-4:]}:{rest}".lower()


def gpu_device(minor: int, gpu: Mapping[str, Any], driver_version: str) -> dict[str, Any]:
    """One full GPU of the slice, from one device of the NVML stand-in's spec."""
    string = {
        "type": "gpu",
        "uuid": str(gpu["uuid"]),
        "productName": str(gpu.get("name", H100["productName"])),
        "brand": H100["brand"],
        "architecture": H100["architecture"],
        "resource.kubernetes.io/pciBusID": bus_id(str(gpu["pciBusId"])),
    }
    versions = {
        "cudaComputeCapability": H100["cudaComputeCapability"],
        "driverVersion": semver(driver_version),
        "cudaDriverVersion": CUDA_DRIVER_VERSION,
    }
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            **{k: {"string": v} for k, v in string.items()},
            **{k: {"version": v} for k, v in versions.items()},
        },
        "capacity": {"memory": {"value": H100["memory"]}},
    }


# H100 80GB's MIG GPU-instance profiles: name -> (profile id, memory slices,
# multiprocessors, memory). Ids, slices and SM counts as NVIDIA's MIG User Guide
# tables them for H100 (`nvidia-smi mig -lgip`); the memory sizes are approximate
# (gpuheal reads no capacity). The driver publishes each statically created MIG device
# as `gpu-<minor>-mig-<name without dots>-<id>-<start>` (its mig.go, ToCanonicalName).
H100_MIG = {
    "1g.10gb": (19, 1, 16, "9856Mi"),
    "1g.20gb": (15, 2, 26, "19968Mi"),
    "2g.20gb": (14, 2, 32, "19968Mi"),
    "3g.40gb": (9, 4, 60, "40192Mi"),
    "4g.40gb": (5, 4, 64, "40192Mi"),
    "7g.80gb": (0, 8, 132, "80896Mi"),
}


def resource_slice(node: str, spec: Mapping[str, Any], *, generation: int = 1) -> dict[str, Any]:
    """The driver's one slice for `node`, from the node's NVML spec (sim/agent.gpu_spec):
    the GPU at NVML index i is `gpu-i` (the driver names by device minor, which on a
    standard node follows the index). A GPU in MIG mode (its spec's `mig`: the MIG
    devices' profiles, as the NVML stand-in takes them) is not published whole: its
    MIG devices are, each its own device (cmd/gpu-kubelet-plugin/nvlib.go)."""
    version = str(spec.get("driverVersion", "550.54.15"))
    devices: list[dict[str, Any]] = []
    for minor, gpu in enumerate(spec.get("devices") or []):
        profiles = list(gpu.get("mig") or [])
        if not profiles:
            devices.append(gpu_device(minor, gpu, version))
        devices += mig_devices(minor, gpu, version, profiles)
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        # The kubelet plugin helper's name: a five-digit index, the driver, the node.
        "metadata": {"generateName": f"00000-{DRIVER}-{node}-"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def mig_devices(
    minor: int, gpu: Mapping[str, Any], driver_version: str, profiles: Sequence[str]
) -> list[dict[str, Any]]:
    """The GPU's MIG devices, in its memory slices from the first, each aligned to its
    size as NVML places them; attributes as cmd/gpu-kubelet-plugin/mig.go writes them
    (CommonAttributesMig, the device's own `uuid`), capacity its multiprocessors,
    memory and memory slices (the engine counts the driver adds are left out: gpuheal
    reads no capacity)."""
    whole = gpu_device(minor, gpu, driver_version)["attributes"]
    devices, start = [], 0
    for slot, profile in enumerate(profiles):
        profile_id, size, multiprocessors, memory = H100_MIG[profile]
        start = -(-start // size) * size  # the next placement aligned to its size
        digest = hashlib.sha256(f"{gpu['uuid']}/{slot}".encode()).hexdigest()
        uuid = f"MIG-{digest[:8]}-{digest[8:12]}-5{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"
        attributes = {
            **{k: v for k, v in whole.items() if k not in ("type", "uuid")},
            "type": {"string": "mig"},
            "uuid": {"string": uuid},
            "parentUUID": {"string": str(gpu["uuid"])},
            "profile": {"string": profile},
        }
        capacity = {
            "multiprocessors": {"value": str(multiprocessors)},
            "memory": {"value": memory},
            **{f"memorySlice{i}": {"value": "1"} for i in range(start, start + size)},
        }
        name = f"gpu-{minor}-mig-{profile.replace('.', '')}-{profile_id}-{start}"
        devices.append({"name": name, "attributes": attributes, "capacity": capacity})
        start += size
    return devices


def with_taint(
    item: Mapping[str, Any], device: str, key: str, value: str = "", effect: str = "NoSchedule"
) -> dict[str, Any]:
    """The slice with one more taint on `device`, as the driver's NVMLDeviceHealthCheck
    writes it (cmd/gpu-kubelet-plugin/device_health.go): no timeAdded (the API server
    stamps it), an empty value for gpu-lost and unmonitored."""
    tainted = copy.deepcopy(dict(item))
    for entry in tainted["spec"]["devices"]:
        if entry["name"] == device:
            taint = {"key": key, "effect": effect, **({"value": value} if value else {})}
            entry.setdefault("taints", []).append(taint)
    return tainted


def dra_node(name: str, *, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A GPU node whose GPUs only the DRA driver offers: no `nvidia.com/gpu` capacity
    and no device plugin's count label (GPU Operator's DRA mode)."""
    manifest = gpu_node(name, labels=labels)
    manifest["metadata"]["labels"].pop("nvidia.com/gpu.count", None)
    status = manifest["status"]
    resources = {k: v for k, v in status["capacity"].items() if k != GPU_RESOURCE}
    status.update(capacity=resources, allocatable=resources)
    return manifest


def gpu_claim(
    name: str, namespace: str, *, gpus: int = 1, device_class: str = GPU_CLASS
) -> dict[str, Any]:
    """A ResourceClaim for `gpus` whole GPUs of the class, in one request named `gpus`."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {
                            "deviceClassName": device_class,
                            "allocationMode": "ExactCount",
                            "count": gpus,
                        },
                    }
                ]
            }
        },
    }


def claim_pod(
    name: str,
    namespace: str,
    claim: str,
    *,
    labels: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A bare pod whose container uses the ResourceClaim `claim` (no extended resource)."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": WORKLOAD_IMAGE,
                "resources": {"claims": [{"name": "gpus"}]},
            }
        ],
        "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
        "terminationGracePeriodSeconds": 30,
        "automountServiceAccountToken": False,
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": spec,
    }
