"""The node's GPU daemons around a GPU reset: what to pause, what to wait for, what
must come back. Pure: the agent reads the Node and its pods (agent/daemons.py).

`nvidia-smi -r` refuses while any process holds the GPU open ("In use by another
client"), and on a GPU node the NVIDIA device plugin, DCGM's host engine,
dcgm-exporter and GPU Feature Discovery all do. The GPU Operator runs each of them
as a DaemonSet selecting the node label `nvidia.com/gpu.deploy.<component>=true`,
and documents setting it to another value to take the component off one node; its
own driver upgrade uses `paused-for-driver-upgrade`. A reset pauses the labels that
are `true` to PAUSED (a value that names who paused them and that the operator's
driver manager does not restore), waits until the daemons' pods on the node are
gone, resets, and sets back to `true` exactly the labels that still say PAUSED: a
label a person changed meanwhile stays theirs. The device plugin marks a device
that went Unhealthy so until it restarts; a paused and restored device plugin is a
new pod, and `restart` names the daemons (not under the operator) whose pod is
deleted after the reset instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ON = "true"
PAUSED = "paused-for-gpu-reset"

Selector = Mapping[str, str]  # equality-based: every pair must match


@dataclass(frozen=True)
class DaemonPod:
    name: str
    uid: str
    labels: Mapping[str, str]
    phase: str = "Running"
    ready: bool = True
    deleting: bool = False

    @property
    def gone(self) -> bool:
        """Holds the GPU no longer: finished (its containers exited)."""
        return self.phase in ("Succeeded", "Failed")


def matches(selector: Selector, labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def selector_text(selector: Selector) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def to_pause(labels: Mapping[str, str], keys: Sequence[str]) -> dict[str, str]:
    """The label changes that take the operator's components off this node."""
    return {k: PAUSED for k in keys if labels.get(k) == ON}


def to_restore(labels: Mapping[str, str], paused: Sequence[str]) -> dict[str, str]:
    """The label changes that put back what this reset paused, and only that."""
    return {k: ON for k in paused if labels.get(k) == PAUSED}


def running(pods: Sequence[DaemonPod], selectors: Sequence[Selector]) -> list[DaemonPod]:
    """The daemons' pods that still hold the GPU (a deleting pod's containers may)."""
    return [p for p in pods if not p.gone and any(matches(s, p.labels) for s in selectors)]


def present(pods: Sequence[DaemonPod], selectors: Sequence[Selector]) -> list[Selector]:
    """The selectors that match a pod now: the daemons that must come back."""
    return [s for s in selectors if running(pods, [s])]


def not_back(
    pods: Sequence[DaemonPod], expected: Sequence[Selector], old_uids: Sequence[str]
) -> list[str]:
    """The expected daemons (as selector text) without a new, ready pod yet."""
    fresh = [p for p in pods if p.uid not in old_uids and p.ready and not p.deleting and not p.gone]
    return [
        selector_text(want) for want in expected if not any(matches(want, p.labels) for p in fresh)
    ]
