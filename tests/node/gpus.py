"""The real node's GPUs: the NVML stand-in's spec in the node's directory (what the
agent and NVIDIA's device plugin both read, as both read one driver on a real node),
and NVIDIA's device plugin as a DaemonSet, the source of the kubelet's nvidia.com/gpu."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuheal.sim.agent import gpu_spec
from gpuheal.sim.binaries import default_nvml
from tests.node.workload import REAL_NODE_TOLERATION

STAND_IN = "/opt/nvml"  # where a container sees the stand-in: lib/, bin/ and spec/
SPEC_FILE = "nvml-spec.yaml"
# The static manifest's pod label: a site without the GPU Operator selects its plugin by
# it (the gate's devicePluginSelector, the agent's gpuReset.restartPods).
PLUGIN_LABELS = {"name": "nvidia-device-plugin-ds"}


@dataclass
class NodeGpus:
    """The spec file of one node's GPUs; `xid` adds an Xid event NVML delivers."""

    directory: Path
    spec: dict[str, Any]

    @classmethod
    def create(cls, directory: Path, node: str) -> NodeGpus:
        directory.mkdir(parents=True, exist_ok=True)
        gpus = cls(directory, gpu_spec(node))
        gpus.write()
        return gpus

    def write(self) -> None:
        # By rename: a reader sees a whole file, never a half-written one.
        tmp = self.directory / (SPEC_FILE + ".tmp")
        tmp.write_text(yaml.safe_dump(self.spec))
        tmp.replace(self.directory / SPEC_FILE)

    def uuid(self, index: int) -> str:
        return str(self.spec["devices"][index]["uuid"])

    def xid(self, index: int, xid: int) -> None:
        events = self.spec.setdefault("xidEvents", [])
        events.append({"id": len(events) + 1, "device": index, "xid": xid})
        self.write()

    def reset(self, index: int) -> None:
        """As the stand-in's `nvidia-smi -r` leaves the spec: the GPU's past Xids reach no
        NVML session opened after it (a restarted device plugin's)."""
        for event in self.spec.get("xidEvents", []):
            if event["device"] == index:
                event["reset"] = True
        self.write()

    def env(self) -> list[dict[str, str]]:
        """A container's environment to load the stand-in over this spec."""
        return [
            {"name": "LD_LIBRARY_PATH", "value": f"{STAND_IN}/lib"},
            {"name": "GPUHEAL_FAKE_NVML_SPEC", "value": f"{STAND_IN}/spec/{SPEC_FILE}"},
        ]

    def volumes(self) -> list[dict[str, Any]]:
        nvml = default_nvml().require()
        return [
            {"name": "nvml", "hostPath": {"path": str(nvml.lib_dir), "type": "Directory"}},
            {"name": "nvml-bin", "hostPath": {"path": str(nvml.smi.parent), "type": "Directory"}},
            {"name": "nvml-spec", "hostPath": {"path": str(self.directory), "type": "Directory"}},
        ]

    def mounts(self, *, resets: bool = False) -> list[dict[str, Any]]:
        """`resets`: the stand-in's nvidia-smi too, and the spec writable (a reset
        rewrites it and logs itself beside it), for the agent's GPU reset."""
        mounts = [
            {"name": "nvml", "mountPath": f"{STAND_IN}/lib", "readOnly": True},
            {"name": "nvml-spec", "mountPath": f"{STAND_IN}/spec", "readOnly": not resets},
        ]
        if resets:
            mounts.append({"name": "nvml-bin", "mountPath": f"{STAND_IN}/bin", "readOnly": True})
        return mounts


def device_plugin_daemonset(
    namespace: str, image: str, node: str, gpus: NodeGpus
) -> dict[str, Any]:
    """NVIDIA's device plugin as its own static manifest deploys it
    (deployments/static/nvidia-device-plugin.yml: the kubelet's device-plugins
    directory, no privileges, its toleration), on the real node, over the stand-in."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": PLUGIN_LABELS},
            "template": {
                "metadata": {"labels": PLUGIN_LABELS},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "priorityClassName": "system-node-critical",
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        # As docs/operations.md#gpu-reset asks: back on a quarantined node.
                        {
                            "key": "gpuheal.io/gpu-fault",
                            "operator": "Exists",
                            "effect": "NoSchedule",
                        },
                        REAL_NODE_TOLERATION,
                    ],
                    "containers": [
                        {
                            "name": "nvidia-device-plugin-ctr",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "env": [{"name": "FAIL_ON_INIT_ERROR", "value": "false"}, *gpus.env()],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {
                                    "name": "device-plugin",
                                    "mountPath": "/var/lib/kubelet/device-plugins",
                                },
                                *gpus.mounts(),
                            ],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "device-plugin",
                            "hostPath": {"path": "/var/lib/kubelet/device-plugins"},
                        },
                        *gpus.volumes(),
                    ],
                },
            },
        },
    }
