"""Which node an alert's `instance` label names: host:port parsing and the
address index the node informer keeps current (pure, no server)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuheal.api.server import decode_webhook
from gpuheal.controller.addresses import AddressIndex, NodeFinder, instance_host
from gpuheal.kube.informer import Handler
from gpuheal.model import NodeView
from gpuheal.sources.alertmanager import interpret
from tests.corpus import EKS_NODE, EKS_NODES, FQDN_253, alert, dcgm_labels, webhook

LABELS = ("node", "Hostname", "hostname", "instance")


class CountingStore:
    """The informer's Store side (a dict and its change handlers), counting lookups."""

    def __init__(self) -> None:
        self.items: dict[str, NodeView] = {}
        self._handlers: list[Handler] = []
        self.gets = 0

    @property
    def handlers(self) -> list[Handler]:
        return self._handlers

    def get(self, key: str) -> NodeView | None:
        self.gets += 1
        return self.items.get(key)

    def put(self, view: NodeView) -> None:
        old = self.items.get(view.name)
        self.items[view.name] = view
        for handler in self._handlers:
            handler(old, view)

    def delete(self, name: str) -> None:
        old = self.items.pop(name)
        for handler in self._handlers:
            handler(old, None)


def node(name: str, *addresses: str, managed: bool = True) -> NodeView:
    labels = {"pool": "gpu"} if managed else {}
    return NodeView(name=name, resource_version="1", labels=labels, addresses=(*addresses, name))


def finder(store: CountingStore) -> NodeFinder:
    return NodeFinder(store, lambda n: n is not None and n.labels.get("pool") == "gpu")


@pytest.mark.parametrize(
    ("instance", "host"),
    [
        ("10.0.12.34:9400", "10.0.12.34"),
        ("[fd00::5]:9400", "fd00::5"),
        ("[fd00::5]", "fd00::5"),
        ("fd00::5", "fd00::5"),
        ("FD00:0:0::5", "fd00::5"),
        ("[fd00:0000::0005]:9400", "fd00::5"),
        ("10.0.12.34", "10.0.12.34"),
        (f"{EKS_NODE}:9400", EKS_NODE),
        (EKS_NODE.upper() + ".", EKS_NODE),
        (f"{FQDN_253}:9100", FQDN_253),
        ("http://10.0.12.34:9400/metrics", "10.0.12.34"),
        (" 10.0.12.34:9400 ", "10.0.12.34"),
        ("", None),
        (":9400", None),
        ("[fd00::5", None),
        ("[not-an-address]:9400", None),
    ],
)
def test_the_host_of_a_scrape_target_is_parsed_for_ipv4_ipv6_and_names(
    instance: str, host: str | None
) -> None:
    assert instance_host(instance) == host


def test_the_index_follows_address_changes_and_deletions() -> None:
    index = AddressIndex()
    a = node(EKS_NODES[0], "10.0.12.34", "fd00::5")
    index.on_node(None, a)
    assert index.nodes_at("fd00::5") == {a.name} and index.nodes_at(a.name) == {a.name}
    moved = node(a.name, "10.0.12.35")
    index.on_node(a, moved)
    assert index.nodes_at("fd00::5") == set() and index.nodes_at("10.0.12.35") == {a.name}
    index.on_node(moved, None)
    assert index.nodes_at("10.0.12.35") == set() and len(index) == 0


def test_instance_names_the_managed_node_at_that_address_and_never_guesses() -> None:
    store = CountingStore()
    find = finder(store)
    v4, v6, outsider, twin_a, twin_b = EKS_NODES[0], EKS_NODES[1], EKS_NODES[2], "a-1", "a-2"
    store.put(node(v4, "10.0.12.34"))
    store.put(node(v6, "fd00::5"))
    store.put(node(outsider, "10.0.99.1", managed=False))
    store.put(node(twin_a, "10.9.9.9"))
    store.put(node(twin_b, "10.9.9.9"))
    assert find.find("instance", "10.0.12.34:9400") == v4
    assert find.find("instance", "[fd00::5]:9400") == v6
    assert find.find("instance", "fd00::5") == v6
    assert find.find("instance", f"{v6}:9400") == v6
    assert find.find("instance", "10.0.99.1:9400") is None  # outside the selector
    assert find.find("instance", "10.9.9.9:9400") is None  # two nodes: neither
    assert find.find("Hostname", v4) == v4 and find.find("Hostname", outsider) is None
    store.delete(v6)
    assert find.find("instance", "[fd00::5]:9400") is None


def test_a_large_body_costs_a_few_lookups_per_alert_not_one_per_node() -> None:
    """12,000 alerts (dcgm-exporter's labels, the node named only by the scrape
    target) against 2,000 nodes: lookups are counted, not timed. Before the index,
    each alert scanned the fleet (up to 2,000 lookups)."""
    store = CountingStore()
    find = finder(store)
    names = [f"ip-10-1-{i >> 8}-{i & 255}.us-west-2.compute.internal" for i in range(2000)]
    for i, name in enumerate(names):
        store.put(node(name, f"10.1.{i >> 8}.{i & 255}", f"fd00::{i:x}"))
    alerts: list[dict[str, Any]] = []
    for n in range(12_000):
        i = n % 2000
        instance = f"[fd00::{i:x}]:9400" if n % 2 else f"10.1.{i >> 8}.{i & 255}:9400"
        labels = dcgm_labels(names[i], gpu=n % 8) | {"instance": instance}
        del labels["Hostname"]
        alerts.append(alert(labels | {"alertname": "GPUXidError"}, fingerprint=f"{n:016x}"))
    hook = decode_webhook(json.dumps(webhook(alerts)).encode())
    store.gets = 0
    outcomes = interpret(hook, node_labels=LABELS, find_node=find.find)
    assert [o.node for o in outcomes] == [names[n % 2000] for n in range(12_000)]
    print(f"{store.gets} store lookups for 12,000 alerts x 2,000 nodes")
    assert store.gets <= 3 * len(alerts)
