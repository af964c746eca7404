"""How a node offers its GPUs, as NVIDIA's device plugin and GPU Feature Discovery
(GFD) label it: whole GPUs, shared ones (time-slicing, MPS) or MIG devices.

GFD's labels, as its labeler writes them (NVIDIA/k8s-device-plugin, internal/lm):
- `nvidia.com/gpu.count`: the physical GPUs; with the MIG `single` strategy the MIG
  devices instead (every GPU split the same way).
- `nvidia.com/gpu.replicas`: replicas per GPU (1 unshared, 0 for MIG devices) and
  `nvidia.com/gpu.sharing-strategy` (`none`, `time-slicing`, `mps`): a shared GPU is
  offered `replicas` times, as `nvidia.com/gpu` or, with `renameByDefault`, as
  `nvidia.com/gpu.shared`.
- `nvidia.com/mig.strategy` (`single`, `mixed`); with `mixed`, per MIG profile
  `nvidia.com/mig-<profile>.count` devices offered as `nvidia.com/mig-<profile>`.
- The MIG manager's `nvidia.com/mig.config` (the layout asked for, a name of its
  config) and `nvidia.com/mig.config.state` (`success` once applied; `pending`,
  `rebooting`, `failed`).

Pure functions of a node's labels and allocatable resources.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
REPLICAS = "nvidia.com/gpu.replicas"
SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
MIG_DISABLED = "all-disabled"
_ALL_ONE = re.compile(r"^all-(?P<profile>\d+g\.\d+gb(?:\+me)?)$")
_MIG_COUNT = re.compile(r"^nvidia\.com/(?P<resource>mig-[0-9a-z.+]+)\.count$")


@dataclass(frozen=True)
class Sharing:
    strategy: str  # none, time-slicing, mps
    replicas: int  # per GPU (1: not shared)
    mig: str  # none, single, mixed

    @property
    def shared(self) -> bool:
        return self.strategy not in ("", "none") and self.replicas > 1


def sharing(labels: Mapping[str, str]) -> Sharing:
    try:
        replicas = int(labels.get(REPLICAS, "1"))
    except ValueError:
        replicas = 1
    return Sharing(
        labels.get(SHARING_STRATEGY, "none") or "none",
        max(replicas, 1),
        labels.get(MIG_STRATEGY, "none") or "none",
    )


def offered_as(resource: str, allocatable: Mapping[str, int], how: Sharing) -> str:
    """The resource the node's GPUs are offered as: a shared GPU renamed by the device
    plugin (`renameByDefault`) is `nvidia.com/gpu.shared`."""
    if resource == GPU and how.shared and SHARED in allocatable and GPU not in allocatable:
        return SHARED
    return resource


def expected_offers(
    gpus: int, resource: str, labels: Mapping[str, str], allocatable: Mapping[str, int]
) -> dict[str, int]:
    """Resource -> the allocatable the node should offer, for `gpus` expected GPUs
    (physical ones; MIG devices under the `single` strategy, as GFD counts them)."""
    how = sharing(labels)
    offers = {offered_as(resource, allocatable, how): gpus * how.replicas}
    if how.mig == "mixed":
        for key, value in labels.items():
            match = _MIG_COUNT.match(key)
            if match is not None and value.isdigit():
                offers[f"nvidia.com/{match.group('resource')}"] = int(value)
    return offers


def physical_gpus(resource: str, allocatable: int, labels: Mapping[str, str]) -> int:
    """GPUs behind an allocatable count: a shared GPU is offered `replicas` times."""
    how = sharing(labels)
    if resource in (GPU, SHARED) and how.shared:
        return allocatable // how.replicas
    return allocatable


def gpus_offered(labels: Mapping[str, str], capacity: Mapping[str, int]) -> int | None:
    """The physical GPUs the node's capacity stands for (the device plugin registers
    every GPU it enumerated, healthy or not), or None where capacity does not count
    GPUs: MIG devices, or no GPU resource."""
    how = sharing(labels)
    if how.mig != "none":
        return None
    for resource in (GPU, SHARED):
        if capacity.get(resource):
            return physical_gpus(resource, capacity[resource], labels)
    return None


def label_counts_gpus(labels: Mapping[str, str]) -> bool:
    """GFD's `nvidia.com/gpu.count` counts physical GPUs, except under the MIG `single`
    strategy, where it counts the MIG devices."""
    return sharing(labels).mig != "single"


def mig_layout_problem(labels: Mapping[str, str], seen: str) -> str:
    """Why the node's MIG layout is not the one asked for ("" when it is): the MIG
    manager has not applied `nvidia.com/mig.config` (after a reboot that lost the
    layout it says pending, rebooting or failed), or the agent's view of the GPUs
    (`seen`, the agent's `gpuheal.io/mig-layout` fact: "" when not reported) is
    not the layout GFD's labels describe."""
    asked = labels.get(MIG_CONFIG, "")
    if not asked:
        return ""
    state = labels.get(MIG_CONFIG_STATE, "")
    if state != "success":
        shown = f", the agent sees {seen}" if seen else ""
        return (
            f"{MIG_CONFIG}={asked} is not applied ({MIG_CONFIG_STATE}={state or 'absent'}{shown})"
        )
    return _view_problem(asked, seen) if seen else ""


def _view_problem(asked: str, seen: str) -> str:
    """The agent's view against the layout asked for, where the name says it."""
    differs = f"{MIG_CONFIG}={asked}, but the agent sees MIG {seen}"
    if asked == MIG_DISABLED:
        return "" if seen == "disabled" else differs
    if seen == "disabled":
        return f"{MIG_CONFIG}={asked}, but the agent sees MIG disabled on every GPU"
    # The MIG manager's "all-<profile>" layouts split every GPU into that one profile.
    one = _ALL_ONE.match(asked)
    profiles = {part.partition("=")[0] for part in seen.split(",") if part}
    if one is not None and profiles != {one.group("profile")}:
        return differs
    return ""


def layout(counts: Mapping[str, int]) -> str:
    """The agent's `gpuheal.io/mig-layout` value: MIG devices per profile over the node's
    GPUs ("1g.10gb=56", sorted), or "disabled" when no GPU has MIG enabled."""
    shown = ",".join(f"{profile}={n}" for profile, n in sorted(counts.items()) if n > 0)
    return shown or "disabled"
