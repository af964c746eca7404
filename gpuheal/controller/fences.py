"""The controller's cache of its own device fences (DeviceTaintRules), at whichever
version the API server serves them.

DeviceTaintRule is beta in Kubernetes 1.36 (resource.k8s.io/v1beta2, served only
where that version is turned on) and GA in 1.37 (resource.k8s.io/v1). One optional
informer per version watches gpuheal's rules (by their label); each that finds its
version not served stays empty and looks again every 30 s, so a cluster upgraded or
reconfigured is followed without a restart. Where both are served the rules arrive
twice, as one object at two versions: the newest version's cache is the one read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuheal.kube.api import device_taint_rule_path
from gpuheal.kube.informer import Informer
from gpuheal.kube.projections import RuleJson
from gpuheal.model import FenceView
from gpuheal.policy.devicefence import Fences, fence_problem
from gpuheal.policy.fence import RULE_VERSIONS

MakeInformer = Callable[[str, str], Informer[RuleJson, FenceView]]


class FenceCaches:
    """The rules' informers, newest version first, and what the plan reads of them."""

    def __init__(self, informer: MakeInformer) -> None:
        """`informer(name, path)`: one of the controller's optional informers."""
        self.by_version: dict[str, Informer[RuleJson, FenceView]] = {
            version: informer(f"devicetaintrules-{version}", device_taint_rule_path("", version))
            for version in RULE_VERSIONS
        }

    @property
    def informers(self) -> tuple[Informer[RuleJson, FenceView], ...]:
        return tuple(self.by_version.values())

    def served(self) -> str:
        """The newest version the API server serves the rules at ("" for none, or
        while the caches have not looked yet)."""
        return next(
            (v for v, i in self.by_version.items() if i.synced.is_set() and not i.missing), ""
        )

    def of(self, node: str) -> Fences:
        """The node's rules, and the version to write new ones at."""
        version = self.served()
        if not version:
            return Fences()
        store: Mapping[str, FenceView] = self.by_version[version].store
        rules = {n: f for n, f in store.items() if f.node == node}
        return Fences(rules=rules, api_version=version)

    def upsert(self, view: FenceView, resource_version: str) -> Any:
        """A rule we created, into the cache the plan reads (write-through)."""
        version = self.served()
        if version:
            self.by_version[version].upsert(view, resource_version)

    def get(self, name: str) -> FenceView | None:
        version = self.served()
        return self.by_version[version].get(name) if version else None


def problem(gpus: int, fences: FenceCaches, effect: str) -> str | None:
    """Where `gpus` DRA GPUs have no fence: why (devicefence.fence_problem), else None."""
    looked = all(i.synced.is_set() for i in fences.informers)
    return fence_problem(gpus, fences.served(), looked, effect)


def said(gpus: int, fences: FenceCaches, effect: str) -> str:
    """Which fence a bad DRA GPU gets, in a sentence; "" without DRA GPUs."""
    served = fences.served()
    why = problem(gpus, fences, effect)
    if why or not gpus or not served:
        return why or ""
    return (
        f"device fence: a bad one of the {gpus} DRA GPUs gets a DeviceTaintRule "
        f"(resource.k8s.io/{served}, {effect})"
    )
