"""The small Kubernetes runtime (informer, leader election, write gate) against
the real API server."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpuheal.kube.api import KubeApi, NotLeaderError, node_path
from gpuheal.kube.informer import Informer
from gpuheal.kube.leader import LeaderElector
from gpuheal.kube.projections import NodeJson, node_view
from gpuheal.model import NodeView
from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes
from tests.corpus import unique_eks_node
from tests.helpers import unique

pytestmark = pytest.mark.timeout(120)


def node_informer(api: KubeApi, selector: str, **kw: Any) -> Informer[NodeJson, NodeView]:
    return Informer(
        api, node_path(), NodeJson, node_view, lambda n: n.name, name="test-nodes",
        label_selector=selector, **kw,
    )  # fmt: skip


def test_informer_relists_after_410_gone_and_reports_what_vanished(tmp_path: Path) -> None:
    # Watches straight from etcd (no watch cache), so compacting etcd makes an old
    # resourceVersion truly expire and the API server answer 410 Gone.
    config = ControlPlaneConfig(
        scheduler=False,
        controller_manager=False,
        kwok=False,
        extra_args={"kube-apiserver": ["--watch-cache=false"]},
        workdir=tmp_path / "cp",
    )
    seen: list[tuple[str | None, str | None]] = []
    with ControlPlane(config) as cp:
        kube = cp.client()
        names = create_gpu_nodes(kube, ["gone", "stays"])

        async def scenario() -> None:
            api = KubeApi.from_kubeconfig(cp.kubeconfig)
            informer = node_informer(api, "")
            informer.handlers.append(
                lambda old, new: seen.append((old and old.name, new and new.name))
            )
            try:
                await informer._list()
                assert set(informer.store) == set(names)
                delete_nodes(kube, ["gone"])
                kube.patch(Node, "stays", {"metadata": {"labels": {"touched": "yes"}}})
                _compact_etcd(cp.etcd_url)
                assert await informer._watch() is False  # 410: the version expired
                await informer._list()
                assert set(informer.store) == {"stays"}
                assert informer.store["stays"].labels.get("touched") == "yes"
            finally:
                await api.close()

        asyncio.run(scenario())
    assert ("gone", None) in seen  # the deletion the watch missed reached the handlers


def _compact_etcd(etcd_url: str) -> None:
    """Compact etcd to its current revision through etcd's JSON gateway."""

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(  # noqa: S310 -- loopback etcd we started
            etcd_url + path, data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            result: dict[str, Any] = json.load(response)
            return result

    key = base64.b64encode(b"/").decode()
    revision = int(post("/v3/kv/range", {"key": key})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})


def test_a_silent_watch_is_reopened_and_updates_still_arrive(
    control_plane: ControlPlane, kube: Client
) -> None:
    prefix = unique("quiet")
    (name,) = create_gpu_nodes(kube, [f"{prefix}-a"], labels={"test": prefix})

    async def scenario() -> None:
        api = KubeApi.from_kubeconfig(control_plane.kubeconfig)
        informer = node_informer(api, f"test={prefix}", inactivity_s=1.0)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 10)
            await asyncio.sleep(2.5)  # nothing changes: the watchdog fires
            assert informer.stalls >= 1
            kube.patch(Node, name, {"metadata": {"annotations": {"gpuheal.io/status": "faulty"}}})
            deadline = time.monotonic() + 10
            while (informer.get(name) or NodeView("", "")).annotations.get(
                "gpuheal.io/status"
            ) != "faulty":
                assert time.monotonic() < deadline, "update not delivered after the stall"
                await asyncio.sleep(0.05)
            assert informer.relists == 1  # reopened from its version, no relist
        finally:
            task.cancel()
            await api.close()

    try:
        asyncio.run(scenario())
    finally:
        delete_nodes(kube, [name])


def test_a_leader_that_cannot_renew_stops_writing_at_once(control_plane: ControlPlane) -> None:
    lease_name = unique("lease")
    events: list[str] = []

    async def scenario() -> None:
        api = KubeApi.from_kubeconfig(control_plane.kubeconfig)
        elector = LeaderElector(
            api,
            namespace="default",
            name=lease_name,
            identity="replica-a",
            lease_s=3,
            renew_deadline_s=2,
            retry_s=0.2,
            on_started=lambda: _note(events, "started"),
            on_stopped=lambda: _note(events, "stopped"),
        )
        api.write_gate = elector.may_write
        task = asyncio.create_task(elector.run())
        try:
            while not leading(elector):
                await asyncio.sleep(0.05)
            # Another holder takes the lease (as a partitioned replica would see it).
            path = f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{lease_name}"
            lease = json.loads(await api.get(path))
            lease["spec"]["holderIdentity"] = "intruder"
            lease["spec"]["leaseDurationSeconds"] = 60
            await api.update(path, lease, ungated=True)
            taken = time.monotonic()
            while leading(elector):
                await asyncio.sleep(0.05)
            assert time.monotonic() - taken <= 2.5  # within the renew deadline
            with pytest.raises(NotLeaderError):
                await api.patch(node_path("any"), {"metadata": {}})
            await asyncio.sleep(0.5)
            assert events == ["started", "stopped"]
        finally:
            task.cancel()
            await api.close()

    asyncio.run(scenario())


def test_releasing_the_lease_stops_leading_once(control_plane: ControlPlane) -> None:
    """SIGTERM releases the lease: the workers are stopped once, not twice (a second
    on-stopped call would cancel what a new term had started meanwhile)."""
    lease_name = unique("lease")
    events: list[str] = []

    async def scenario() -> None:
        api = KubeApi.from_kubeconfig(control_plane.kubeconfig)
        elector = LeaderElector(
            api,
            namespace="default",
            name=lease_name,
            identity="replica-a",
            lease_s=3,
            renew_deadline_s=2,
            retry_s=0.2,
            on_started=lambda: _note(events, "started"),
            on_stopped=lambda: _note(events, "stopped"),
        )
        task = asyncio.create_task(elector.run())
        try:
            while not leading(elector):
                await asyncio.sleep(0.05)
            await elector.release()
            await asyncio.wait_for(task, 5)  # run() ends on its own after a release
            path = f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{lease_name}"
            lease = json.loads(await api.get(path))
            assert lease["spec"].get("holderIdentity", "") == ""  # freed for a standby
            print(events)
            assert events == ["started", "stopped"]
        finally:
            task.cancel()
            await api.close()

    asyncio.run(scenario())


def leading(elector: LeaderElector) -> bool:
    return elector.is_leader


async def _note(events: list[str], what: str) -> None:
    events.append(what)


def test_our_writes_are_ours_in_managed_fields(control_plane: ControlPlane, kube: Client) -> None:
    """kubectl --show-managed-fields names gpuheal for what it wrote: the API
    server takes the manager from our User-Agent (no fieldManager needed)."""
    [node] = create_gpu_nodes(kube, [unique_eks_node()])

    async def mark() -> None:
        api = KubeApi.from_kubeconfig(control_plane.kubeconfig)
        try:
            await api.patch(node_path(node), {"metadata": {"annotations": {"gpuheal.io/x": "1"}}})
        finally:
            await api.close()

    try:
        asyncio.run(mark())
        found: Any = kube.get(Node, node)
        managers = {f.manager: f.fieldsV1 for f in found.metadata.managedFields or [] if f.fieldsV1}
        assert "gpuheal" in managers, sorted(managers)
        assert "f:gpuheal.io/x" in json.dumps(managers["gpuheal"])
    finally:
        delete_nodes(kube, [node])


def test_a_list_in_pages_fills_the_cache_with_every_object(
    control_plane: ControlPlane, kube: Client
) -> None:
    """Pages of 2 over 7 nodes: the next page is asked for while one is decoded,
    and every page is taken once (no object lost, none from a stale page)."""
    pool = unique("pages")
    names = create_gpu_nodes(
        kube, [unique_eks_node() for _ in range(7)], labels={"gpuheal.test/pool": pool}
    )

    async def fill() -> set[str]:
        api = KubeApi.from_kubeconfig(control_plane.kubeconfig)
        try:
            informer = node_informer(api, f"gpuheal.test/pool={pool}", page_size=2)
            await informer._list()
            return set(informer.store)
        finally:
            await api.close()

    try:
        assert asyncio.run(fill()) == set(names)
    finally:
        delete_nodes(kube, names)
