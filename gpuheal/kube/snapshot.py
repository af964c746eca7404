"""A read-only snapshot of the fleet, for the operator CLI's read commands.

Nodes, the pods bound to them and the GPUFault records are listed at once
(concurrently, each in pages, no watch: a command is a snapshot) and decoded
straight into the controller's slim projections (kube/projections.py): a Pod
costs the few fields kept, not a full model. An object the projection cannot
take is skipped with a warning naming it; the rest of its list goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec

from gpuheal.kube.api import (
    RESOURCE_API,
    ApiError,
    KubeApi,
    device_taint_rule_path,
    gpufault_path,
    node_path,
)
from gpuheal.kube.paging import each_page
from gpuheal.kube.projections import (
    ClaimJson,
    FaultJson,
    NodeJson,
    PodJson,
    RuleJson,
    SliceJson,
    claim_view_factory,
    fault_record,
    fence_view,
    slice_view_factory,
)
from gpuheal.model import DeviceKey, DraDevice, FaultRecord, FenceView
from gpuheal.policy.dra import fenced, newest_devices
from gpuheal.policy.fence import FENCE_LABEL, FENCE_LABEL_VALUE, RULE_VERSIONS

log = logging.getLogger(__name__)

LIST_PAGE = 500
ALL_PODS = "/api/v1/pods"
# Pods that hold a node's resources: bound, and neither Succeeded nor Failed (the
# scheduler's cache of assigned pods uses this selector). The rest cannot matter
# to a read command and would cost their transfer and decoding.
LIVE_BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"

J = TypeVar("J", bound=msgspec.Struct)  # the projection of one object
T = TypeVar("T")  # what a page's items decode into: a projection, or msgspec.Raw


class _ListMeta(msgspec.Struct):
    # "continue" is a Python keyword: map it.
    next_page: str = msgspec.field(default="", name="continue")


class _Page(msgspec.Struct, Generic[T]):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[T] | None = None  # null in an empty list


class _Name(msgspec.Struct):
    name: str = "?"
    namespace: str = ""


class _Named(msgspec.Struct):
    """Just enough of any object to name it when its projection fails."""

    metadata: _Name = msgspec.field(default_factory=_Name)


def _name(raw: msgspec.Raw) -> str:
    try:
        meta = msgspec.json.decode(raw, type=_Named).metadata
    except msgspec.DecodeError:
        return "?"
    return f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name


class PageDecoder(Generic[J]):
    """LIST pages of one kind into projections: a page in one pass; a page holding an
    object the projection cannot take, one object at a time, skipping just that one."""

    def __init__(self, json_type: type[J], kind: str) -> None:
        self.kind = kind
        self._page = msgspec.json.Decoder(_Page[json_type])  # type: ignore[valid-type]
        self._object = msgspec.json.Decoder(json_type)

    def decode(self, raw: bytes) -> tuple[list[J], str]:
        """The page's objects and the token of the next page ("" on the last).
        msgspec.DecodeError when the page itself is not a list."""
        try:
            page: _Page[J] = self._page.decode(raw)
        except msgspec.ValidationError:
            return self._one_by_one(raw)
        return page.items or [], page.metadata.next_page

    def _one_by_one(self, raw: bytes) -> tuple[list[J], str]:
        page = msgspec.json.decode(raw, type=_Page[msgspec.Raw])
        objects: list[J] = []
        for item in page.items or ():
            try:
                objects.append(self._object.decode(item))
            except msgspec.ValidationError as err:
                name = _name(item)
                log.warning(
                    "%s %s skipped: it cannot be read (%s)",
                    self.kind,
                    name,
                    err,
                    extra={"kind": self.kind, "object": name},
                )
        return objects, page.metadata.next_page


async def list_all(
    api: KubeApi,
    path: str,
    json_type: type[J],
    kind: str,
    *,
    label_selector: str = "",
    field_selector: str = "",
    page: int = LIST_PAGE,
) -> list[J]:
    """Every object at `path`, in pages of `page` objects."""
    pages = PageDecoder(json_type, kind)
    params = {"limit": str(page)}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    found: list[J] = []

    def take(raw: bytes) -> str:
        objects, next_page = pages.decode(raw)
        found.extend(objects)
        return next_page

    await each_page(api, path, params, take)
    return found


@dataclass
class Snapshot:
    """The fleet as one read command sees it."""

    nodes: list[NodeJson]
    pods: list[PodJson]  # as listed: bound and live (LIVE_BOUND_PODS)
    # The GPUFault records; None when not read, or when the cluster has no GPUFault CRD.
    faults: list[FaultRecord] | None = None
    # GPUs offered through DRA (when read): each node's devices, gpuheal's fences
    # joined in; and each claim's allocated devices, by "namespace/name".
    devices: dict[str, tuple[DraDevice, ...]] = field(default_factory=dict)
    allocated: dict[str, tuple[DeviceKey, ...]] = field(default_factory=dict)
    pods_by_node: dict[str, list[PodJson]] = field(init=False)

    def __post_init__(self) -> None:
        by_node: dict[str, list[PodJson]] = defaultdict(list)
        for pod in self.pods:
            if pod.spec.nodeName:
                by_node[pod.spec.nodeName].append(pod)
        self.pods_by_node = dict(by_node)


async def _fault_records(api: KubeApi, page: int) -> list[FaultRecord] | None:
    try:
        records = await list_all(api, gpufault_path(), FaultJson, "GPUFault", page=page)
    except ApiError as err:
        if err.code != 404:
            raise
        return None  # no GPUFault CRD: the controller is not installed (yet)
    return [fault_record(r) for r in records]


async def _nothing() -> None:
    return None


async def _served(listing: Awaitable[list[J]], kind: str) -> list[J]:
    """A list of a resource the cluster may not serve (DRA before 1.34, DeviceTaintRules
    before 1.36): none when it does not, or when the caller may not read it (said)."""
    try:
        return await listing
    except ApiError as err:
        if err.code == 403:
            log.warning(
                "cannot list %ss (forbidden): GPUs offered through DRA are not counted", kind,
                extra={"kind": kind},
            )  # fmt: skip
            return []
        if err.code != 404:
            raise
        return []


async def _rules(api: KubeApi, selector: str, page: int) -> tuple[str, list[RuleJson]]:
    """gpuheal's DeviceTaintRules, at the newest version that serves them: that
    version ("" when none does) and the rules."""
    for version in RULE_VERSIONS:
        try:
            return version, await list_all(
                api, device_taint_rule_path("", version), RuleJson, "DeviceTaintRule",
                label_selector=selector, page=page,
            )  # fmt: skip
        except ApiError as err:
            if err.code != 404:
                raise
    return "", []


async def _rule_items(api: KubeApi, selector: str, page: int) -> list[RuleJson]:
    return (await _rules(api, selector, page))[1]


@dataclass(frozen=True)
class NodeDra:
    """One node's GPUs offered through DRA, as a command reads them."""

    devices: tuple[DraDevice, ...] = ()  # gpuheal's fences joined in
    # The version of resource.k8s.io serving DeviceTaintRules ("" none: no device can
    # be fenced); None: not known (the rules could not be read: forbidden).
    fence_api: str | None = None
    unread: tuple[str, ...] = ()  # what could not be read, and why


async def read_node_dra(api: KubeApi, node: str, drivers: frozenset[str]) -> NodeDra:
    """The node's GPU devices (its ResourceSlices of `drivers`, by field selector)
    with gpuheal's DeviceTaintRules on them, and which version serves the rules.
    A cluster without DRA has none; a refused read is named in `unread`."""
    rules = f"{FENCE_LABEL}={FENCE_LABEL_VALUE}"
    slices, fences = await asyncio.gather(
        _refusable(list_all(api, f"{RESOURCE_API}/resourceslices", SliceJson, "ResourceSlice",
                            field_selector=f"spec.nodeName={node}"), "ResourceSlices"),
        _refusable(_rules(api, rules, LIST_PAGE), "DeviceTaintRules"),
    )  # fmt: skip
    to_slice = slice_view_factory(drivers)
    found = newest_devices(v for s in slices[0] or () if (v := to_slice(s)).node == node)
    version, items = fences[0] if fences[0] is not None else (None, [])
    on_node = [f for r in items if (f := fence_view(r)).node == node]
    unread = tuple(why for _, why in (slices, fences) if why)
    return NodeDra(fenced(found.get(node, ()), on_node), version, unread)


async def _refusable(read: Awaitable[T], what: str) -> tuple[T | None, str]:
    """A read a command may be refused (403) or a cluster may not serve (404: none)."""
    try:
        return await read, ""
    except ApiError as err:
        if err.code == 403:
            return None, f"{what} (forbidden)"
        if err.code != 404:
            raise
        return None, ""


async def read_dra(
    api: KubeApi, drivers: frozenset[str], page: int = LIST_PAGE
) -> tuple[dict[str, tuple[DraDevice, ...]], dict[str, tuple[DeviceKey, ...]]]:
    """Each node's GPU devices (ResourceSlices of `drivers`, gpuheal's DeviceTaintRules
    joined in) and each claim's allocated devices (ResourceClaims)."""
    rules = f"{FENCE_LABEL}={FENCE_LABEL_VALUE}"
    slices, claims, fences = await asyncio.gather(
        _served(list_all(api, f"{RESOURCE_API}/resourceslices", SliceJson, "ResourceSlice",
                         page=page), "ResourceSlice"),
        _served(list_all(api, f"{RESOURCE_API}/resourceclaims", ClaimJson, "ResourceClaim",
                         page=page), "ResourceClaim"),
        _served(_rule_items(api, rules, page), "DeviceTaintRule"),
    )  # fmt: skip
    to_slice, to_claim = slice_view_factory(drivers), claim_view_factory(drivers)
    found = newest_devices(v for s in slices if (v := to_slice(s)).node)
    rules_by_name = {r.metadata.name: fence_view(r) for r in fences}
    on_node: dict[str, list[FenceView]] = defaultdict(list)
    for rule in rules_by_name.values():
        on_node[rule.node].append(rule)
    devices = {node: fenced(d, on_node.get(node, ())) for node, d in found.items()}
    allocated = {(c := to_claim(item)).key: c.allocated for item in claims}
    return devices, allocated


async def read_snapshot(
    api: KubeApi,
    *,
    faults: bool,
    node_selector: str = "",
    page: int = LIST_PAGE,
    drivers: frozenset[str] = frozenset(),
) -> Snapshot:
    """Nodes (those matching `node_selector`, a labelSelector, when given), every live
    pod bound to a node, (`faults`) the GPUFault records and (`drivers`) the GPUs
    those DRA drivers offer, listed concurrently."""
    nodes, pods, records, dra = await asyncio.gather(
        list_all(api, node_path(), NodeJson, "Node", label_selector=node_selector, page=page),
        list_all(api, ALL_PODS, PodJson, "Pod", field_selector=LIVE_BOUND_PODS, page=page),
        _fault_records(api, page) if faults else _nothing(),
        read_dra(api, drivers, page) if drivers else _nothing(),
    )
    devices, allocated = dra if dra is not None else ({}, {})
    return Snapshot(nodes=nodes, pods=pods, faults=records, devices=devices, allocated=allocated)
