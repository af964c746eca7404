"""Real-shaped values, as real fleets have them, for every test tier.

Node names as EKS, GKE, AKS and on-prem clusters name them (up to the 253
characters of a DNS subdomain), GPU and MIG UUIDs as NVML prints them, the
labels dcgm-exporter really puts on its series, Alertmanager v4 bodies with
real fingerprints. Tests take their values from here, not from tidy
`gpu-node-0` stand-ins that hide every length and character limit.
"""

from __future__ import annotations

import itertools
import os
import uuid
from typing import Any

from gpuheal.sim.monitoring import exporter_labels

# EKS outside us-east-1: ip-<dashed private IP>.<region>.compute.internal.
EKS_NODE = "ip-192-168-12-34.us-west-2.compute.internal"
EKS_NODES = (
    "ip-10-0-12-34.us-west-2.compute.internal",
    EKS_NODE,
    "ip-172-31-250-201.ap-southeast-2.compute.internal",
)
# GKE: gke-<cluster>-<pool>-<8 hex instance-group id>-<4 char suffix>.
GKE_NODE = "gke-ml-prod-us-central1-a3-highgpu-8g-p-3f9c2a1b-x7k2"
# AKS: aks-<pool>-<8 digit>-vmss<6 base-36 digits>.
AKS_NODE = "aks-gpupool-12345678-vmss000000"
# Exactly at the 63-character label-value limit.
NODE_63 = "ip-10-100-200-250.ap-northeast-3.compute.internal.gpu-fleet-a12"


def fqdn(length: int, head: str = "gpu-node-0017") -> str:
    """An on-prem FQDN of exactly `length` characters (dots between labels of <= 63)."""
    labels, total = [head], len(head)
    words = ["rack-b07", "row-3", "hall-2", "dc-fra1", "bm", "gpu", "prod", "corp", "example"]
    filler = iter(words)
    while total < length:
        word = next(filler, "zone")
        room = length - total - 1
        if room <= 0:
            break
        labels.append(word[:room] if room < len(word) + 2 else word)
        total += 1 + len(labels[-1])
    name = ".".join(labels)
    if len(name) < length:  # pad the last label (all labels stay <= 63)
        pad = length - len(name)
        name = name[: len(name) - len(labels[-1])] + labels[-1] + "a" * pad
    return name[:length]


FQDN_253 = fqdn(253)
NODE_NAMES = (*EKS_NODES, GKE_NODE, AKS_NODE, NODE_63, FQDN_253)

# NVML's UUIDs: GPU-8-4-4-4-12 hex; MIG devices since R470: MIG-<uuid>.
GPU_UUIDS = (
    "GPU-5b2f4a8e-9c1d-3f7a-b0e2-4d6c8a1f3e95",
    "GPU-a7e1c9d3-2b4f-6e80-91c3-5d7f9b1e3a26",
    "GPU-0c4e8a2f-6b1d-4c93-87e5-f2a9d6b3c1e0",
    "GPU-e91b3d75-1f4a-2c68-d0b7-3a5e8c2f9d41",
    "GPU-3d6f9b2e-8a1c-5e47-b2d9-6c0a4e7f1b38",
    "GPU-78c2e5a1-4d9b-3f60-a8e1-c5b7d2f0a963",
    "GPU-f05a7c3e-9d2b-1e84-6c3f-b8a0e4d2c751",
    "GPU-2a9d4f61-c7e3-8b05-d1a4-9e6c3b7f0e82",
)
MIG_UUIDS = (
    "MIG-2f3a4b5c-6d7e-5f80-9a1b-2c3d4e5f6a7b",
    "MIG-9e8d7c6b-5a49-4382-b1a0-f9e8d7c6b5a4",
)
PCI_BUS_IDS = tuple(
    f"00000000:{bus:02X}:00.0" for bus in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
)


# Tests on one control plane must not share node names: each call takes the next
# /24 of 10.0.0.0/8 (from a random start), unique within a test session.
_SUBNETS = itertools.count(int.from_bytes(os.urandom(3)))


def eks_node_names(count: int, region: str = "us-west-2") -> list[str]:
    """`count` (<= 254) fresh EKS-style names in one subnet, as a node group has them:
    ip-10-a-b-1.us-west-2.compute.internal, ip-10-a-b-2..."""
    if not 0 < count <= 254:
        raise ValueError(f"one subnet holds 1..254 nodes, not {count}")
    a, b = divmod(next(_SUBNETS) % 65536, 256)
    return [f"ip-10-{a}-{b}-{host}.{region}.compute.internal" for host in range(1, count + 1)]


def unique_eks_node() -> str:
    """A fresh EKS-style node name."""
    return eks_node_names(1)[0]


def unique_fqdn(length: int = 253) -> str:
    """A fresh on-prem FQDN of exactly `length` characters."""
    return fqdn(length, head=f"gpu-{uuid.uuid4().hex[:12]}")


def dcgm_labels(node: str, gpu: int = 0, *, ip: str = "10.0.12.34") -> dict[str, str]:
    """The labels dcgm-exporter (3.x, 4.x, Kubernetes mode) puts on a per-GPU series,
    in its order, with a pod using the GPU, plus the ones Prometheus' Kubernetes
    service discovery adds."""
    labels = exporter_labels(
        node,
        gpu,
        GPU_UUIDS[gpu % len(GPU_UUIDS)],
        pci_bus_id=PCI_BUS_IDS[gpu % len(PCI_BUS_IDS)],
        pod=("ml-training", "llama-70b-pretrain-worker-3"),
    )
    labels["container"] = "pytorch"
    return labels | {"instance": f"{ip}:9400", "job": "dcgm-exporter"}


def alert(
    labels: dict[str, str],
    *,
    status: str = "firing",
    starts_at: str = "2026-12-01T02:30:12.345678901Z",
    fingerprint: str = "c3e2a0b7d18f4e95",
) -> dict[str, Any]:
    """One alert as Alertmanager's webhook (v4) sends it."""
    return {
        "status": status,
        "labels": labels,
        "annotations": {
            "summary": f"{labels.get('alertname', 'alert')} on {labels.get('Hostname', '?')}"
        },
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-12-01T02:45:12.345Z",
        "generatorURL": "http://prometheus-k8s-0:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS+%21%3D+0",
        "fingerprint": fingerprint,
    }


def webhook(alerts: list[dict[str, Any]], *, status: str = "firing") -> dict[str, Any]:
    """An Alertmanager v4 webhook body around `alerts`."""
    return {
        "version": "4",
        "status": status,
        "receiver": "gpuheal",
        "groupKey": '{}/{severity="critical"}:{alertname="GPUXidError"}',
        "truncatedAlerts": 0,
        "groupLabels": {"alertname": "GPUXidError"},
        "commonLabels": {"alertname": "GPUXidError", "severity": "critical"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager-main-0:9093",
        "alerts": alerts,
    }
