"""Pod status -> device reports: the projection and the times kept per device."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import msgspec

from gpuheal.config import Config
from gpuheal.controller.devices import DeviceReports
from gpuheal.kube.projections import PodJson, pod_view_factory
from gpuheal.model import DeviceHealth, DeviceReport, PodView

T0 = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)
# The kubelet's resourceID of a DRA device: "<driver>/<pool>/<device>" (a pool may
# hold slashes itself).
DRA_GPU = "gpu.nvidia.com/ip-10-0-12-34.us-west-2.compute.internal/gpu-3"
DRA_NIC = "net.example.com/rack-4/mlx-0/eth1"


def decode(status: dict[str, object], labels: dict[str, str] | None = None) -> PodView:
    raw = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": labels or {}},
        "spec": {
            "nodeName": "n1",
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
        "status": status,
    }
    pod = msgspec.json.decode(msgspec.json.encode(raw), type=PodJson)
    return pod_view_factory(Config().is_gpu_resource)(pod)


def test_device_plugin_and_dra_entries_are_read_and_other_resources_ignored() -> None:
    view = decode(
        {
            "phase": "Running",
            "conditions": [{"type": "Ready", "lastTransitionTime": "2026-11-29T11:00:00Z"}],
            "containerStatuses": [
                {
                    "state": {"running": {"startedAt": "2026-11-29T11:30:00Z"}},
                    "allocatedResourcesStatus": [
                        {
                            "name": "nvidia.com/gpu",
                            "resources": [
                                {"resourceID": "GPU-b", "health": "Unhealthy", "message": "Xid 79"},
                                {"resourceID": "GPU-a", "health": "Healthy"},
                            ],
                        },
                        {"name": "example.com/nic", "resources": [{"resourceID": "nic0"}]},
                    ],
                }
            ],
            "allocatedResourcesStatus": [
                {
                    "name": "claim:train-gpus/gpus",
                    "resources": [{"resourceID": DRA_GPU, "health": "Weird"}],
                },
                # Another driver's device (a NIC through DRA) is no GPU.
                {
                    "name": "claim:nic",
                    "resources": [{"resourceID": DRA_NIC, "health": "Unhealthy"}],
                },
            ],
        },
        labels={"gpuheal.io/canary": "true"},
    )
    assert view.devices == (
        # An unknown word is Unknown; a DRA GPU is its driver's "driver/pool/device".
        DeviceReport("gpu.nvidia.com", DRA_GPU, DeviceHealth.UNKNOWN),
        DeviceReport("nvidia.com/gpu", "GPU-a", DeviceHealth.HEALTHY),
        DeviceReport("nvidia.com/gpu", "GPU-b", DeviceHealth.UNHEALTHY, "Xid 79"),
    )
    assert view.status_time == "2026-11-29T11:30:00Z"
    assert view.canary
    bare = decode({"phase": "Pending", "containerStatuses": None})
    assert bare.devices == () and bare.status_time == ""


def test_a_shared_gpus_replicas_are_one_device_with_its_worst_report() -> None:
    """Time-slicing and MPS: the device plugin's replica IDs are `<GPU>::<n>`
    (NVIDIA/k8s-device-plugin rm.AnnotatedID); the GPU is the device."""
    view = decode(
        {
            "containerStatuses": [
                {
                    "allocatedResourcesStatus": [
                        {
                            "name": "nvidia.com/gpu",
                            "resources": [
                                {"resourceID": "GPU-b::0", "health": "Healthy"},
                                {
                                    "resourceID": "GPU-b::3",
                                    "health": "Unhealthy",
                                    "message": "Xid 48",
                                },
                                {"resourceID": "GPU-b::1", "health": "Unknown"},
                                {"resourceID": "GPU-a::2", "health": "Healthy"},
                            ],
                        }
                    ]
                }
            ]
        }
    )
    assert view.devices == (
        DeviceReport("nvidia.com/gpu", "GPU-a", DeviceHealth.HEALTHY),
        DeviceReport("nvidia.com/gpu", "GPU-b", DeviceHealth.UNHEALTHY, "Xid 48"),
    )


def test_since_moves_only_on_a_health_change_and_a_restart_uses_the_status_time() -> None:
    clock = [T0]
    synced = [False]
    reports = DeviceReports(lambda: synced[0], lambda: clock[0])
    healthy = decode(
        {
            "conditions": [{"type": "Ready", "lastTransitionTime": "2026-11-29T11:00:00Z"}],
            "containerStatuses": [
                {
                    "allocatedResourcesStatus": [
                        {
                            "name": "nvidia.com/gpu",
                            "resources": [{"resourceID": "G", "health": "Healthy"}],
                        }
                    ]
                }
            ],
        }
    )
    reports.on_pod(None, healthy)  # the initial list: seen at the status time, not now
    (entry,) = reports.entries(["ns/p"])
    assert entry.seen == entry.since == T0 - dt.timedelta(hours=1)

    synced[0] = True
    clock[0] = T0 + dt.timedelta(seconds=10)
    relabelled = replace(healthy, resource_version="2")
    reports.on_pod(healthy, relabelled)
    (entry,) = reports.entries(["ns/p"])
    assert entry.seen == clock[0] and entry.since == T0 - dt.timedelta(hours=1)

    clock[0] = T0 + dt.timedelta(seconds=20)
    unknown = replace(
        relabelled, devices=(DeviceReport("nvidia.com/gpu", "G", DeviceHealth.UNKNOWN),)
    )
    reports.on_pod(relabelled, unknown)
    (entry,) = reports.entries(["ns/p"])
    assert entry.since == clock[0] and entry.report.health is DeviceHealth.UNKNOWN

    reports.on_pod(unknown, None)
    assert reports.entries(["ns/p"]) == ()
