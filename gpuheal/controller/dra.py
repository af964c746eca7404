"""GPUs offered through Dynamic Resource Allocation, joined to the node and pod views.

On a DRA node no `nvidia.com/gpu` says how many GPUs it has or which pod holds one:
its driver's ResourceSlices list the devices, and a pod holds what the scheduler
allocated to its ResourceClaims. This index keeps both from their informers and
joins them into the views every other part reads: NodeView.devices, and
PodView.held with its gpu and gpu_count. A view is joined whenever its informer
stores it, decoded from a watch or written through after our own write (the
informer's `join`: `with_node`, `with_pod`), and joined again when a slice or claim
changes (`Informer.refresh`), whichever comes first: the watches of nodes, pods,
slices and claims arrive in no fixed order.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterable

from gpuheal.kube.informer import Store
from gpuheal.model import (
    ClaimView,
    DeviceKey,
    DraDevice,
    FenceView,
    NodeView,
    PodView,
    SliceView,
)
from gpuheal.policy.dra import claim_gpus, fenced, gpu_count, holding, newest_devices

RefreshNode = Callable[[str, Callable[[NodeView], NodeView]], None]
RefreshPod = Callable[[str, Callable[[PodView], PodView]], None]


class DraIndex:
    """Each node's GPU devices and each claim's, kept current by the slice and claim
    informers' handlers; `refresh_node` and `refresh_pod` re-join a cached view."""

    def __init__(self) -> None:
        self._slices: dict[str, SliceView] = {}  # by slice name
        self._slices_of: dict[str, set[str]] = defaultdict(set)  # node -> slice names
        self.devices: dict[str, tuple[DraDevice, ...]] = {}  # node -> its GPU devices
        self._by_key: dict[DeviceKey, DraDevice] = {}
        self._allocated: dict[str, tuple[DeviceKey, ...]] = {}  # claim (namespace/name)
        self._pods_of: dict[str, set[str]] = defaultdict(set)  # claim key -> pod keys
        # gpuheal's fences by node, then by rule name: joined into the devices' taints
        # (the scheduler reads DeviceTaintRules beside the slices; so does the count of
        # usable GPUs).
        self._fences_on: dict[str, dict[str, FenceView]] = defaultdict(dict)
        self._pods_on: Callable[[str], Iterable[str]] = lambda _node: ()
        self.refresh_node: RefreshNode = lambda _key, _change: None
        self.refresh_pod: RefreshPod = lambda _key, _change: None

    def watch(
        self,
        slices: Store[SliceView],
        claims: Store[ClaimView],
        pods: Store[PodView],
        pods_on: Callable[[str], Iterable[str]],
        *,
        refresh: tuple[RefreshNode, RefreshPod],
        fences: Iterable[Store[FenceView]] = (),
    ) -> None:
        """Follow the slice, claim and pod caches; `pods_on(node)`: its pods' keys;
        `refresh`: how to re-join a cached node view and pod view."""
        self.refresh_node, self.refresh_pod = refresh
        slices.handlers.append(self.on_slice)
        claims.handlers.append(self.on_claim)
        pods.handlers.append(self.on_pod)
        for cache in fences:
            cache.handlers.append(self.on_fence)
        self._pods_on = pods_on

    # -- the joins -------------------------------------------------------------

    def with_node(self, view: NodeView) -> NodeView:
        devices = self._fenced(view.name, self.devices.get(view.name, ()))
        return view if view.devices == devices else dataclasses.replace(view, devices=devices)

    def _fenced(self, node: str, devices: tuple[DraDevice, ...]) -> tuple[DraDevice, ...]:
        """The devices with gpuheal's fences among their taints."""
        rules = self._fences_on.get(node)
        return fenced(devices, rules.values()) if rules else devices

    def with_pod(self, view: PodView) -> PodView:
        """The pod with the GPU devices its claims hold: a GPU pod if it holds one,
        its gpu_count its extended resources' and its devices' together."""
        if not view.claims and not view.held:
            return view
        return holding(view, self.held_by(view.namespace, view.claims))

    def held_by(self, namespace: str, claims: Iterable[str]) -> tuple[DraDevice, ...]:
        """The GPU devices of the named claims, as the slices publish them now."""
        return claim_gpus(namespace, claims, self._allocated, self._by_key)

    def gpus(self) -> int:
        """The GPUs the drivers offer on every node (the gpuheal_dra_gpus gauge)."""
        return sum(gpu_count(devices) for devices in tuple(self.devices.values()))

    def device(self, key: DeviceKey) -> DraDevice | None:
        return self._by_key.get(key)

    # -- the caches' handlers --------------------------------------------------

    def on_slice(self, old: SliceView | None, new: SliceView | None) -> None:
        nodes = set()
        if old is not None:
            self._slices.pop(old.name, None)
            self._slices_of[old.node].discard(old.name)
            nodes.add(old.node)
        if new is not None and new.node:
            self._slices[new.name] = new
            self._slices_of[new.node].add(new.name)
            nodes.add(new.node)
        for node in nodes - {""}:
            self._recount(node)

    def _recount(self, node: str) -> None:
        names = self._slices_of.get(node, set())
        found = newest_devices(self._slices[n] for n in names).get(node, ())
        if not names:
            self._slices_of.pop(node, None)
        before = self.devices.get(node, ())
        if found == before:
            return
        for device in before:
            self._by_key.pop(device.key, None)
        for device in found:
            self._by_key[device.key] = device
        if found:
            self.devices[node] = found
        else:
            self.devices.pop(node, None)
        self.refresh_node(node, self.with_node)
        for pod in tuple(self._pods_on(node)):
            self.refresh_pod(pod, self.with_pod)

    def on_fence(self, old: FenceView | None, new: FenceView | None) -> None:
        if old is not None:
            self._fences_on[old.node].pop(old.name, None)
            if not self._fences_on[old.node]:
                del self._fences_on[old.node]
        if new is not None:
            self._fences_on[new.node][new.name] = new
        for node in {f.node for f in (old, new) if f is not None}:
            self.refresh_node(node, self.with_node)

    def on_claim(self, old: ClaimView | None, new: ClaimView | None) -> None:
        either = new or old
        if either is None:
            return
        key = either.key
        if new is None:
            self._allocated.pop(key, None)
        else:
            self._allocated[key] = new.allocated
        if (old.allocated if old else ()) != (new.allocated if new else ()):
            for pod in tuple(self._pods_of.get(key, ())):
                self.refresh_pod(pod, self.with_pod)

    def on_pod(self, old: PodView | None, new: PodView | None) -> None:
        """Which pods use which claim, to re-join them when the claim is allocated."""
        if old is not None:
            for name in old.claims:
                pods = self._pods_of.get(f"{old.namespace}/{name}")
                if pods is not None:
                    pods.discard(old.key)
                    if not pods:
                        del self._pods_of[f"{old.namespace}/{name}"]
        if new is not None:
            for name in new.claims:
                self._pods_of[f"{new.namespace}/{name}"].add(new.key)
