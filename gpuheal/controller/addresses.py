"""Nodes by address: which node an alert's `instance="host:port"` label means.

Prometheus names a scrape target `host:port` (`10.0.12.34:9400`), an IPv6
target `[fd00::5]:9400`, and relabelling often leaves a bare host or address.
One alert body can carry thousands of alerts against thousands of nodes, so
the lookup is a dict kept current by the node informer's change handler, not
a scan of the fleet per alert.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Iterable

from gpuheal.kube.informer import Store
from gpuheal.model import NodeView


def address_key(address: str) -> str:
    """The form an address is indexed and looked up under: an IP address in its
    canonical text (`fd00:0::5` and `FD00::5` are `fd00::5`), a host name in lower
    case without a trailing dot."""
    try:
        return ipaddress.ip_address(address).compressed
    except ValueError:
        return address.lower().rstrip(".")


def instance_host(instance: str) -> str | None:
    """The host of a scrape target (`host:port`, `[v6]:port`, `[v6]`, a bare host
    or address, a URL) as an address key, or None when it names no host."""
    value = instance.strip()
    if not value:
        return None
    try:
        # A bare address first: `fd00::5` would otherwise read as host `fd00`, port `:5`.
        return ipaddress.ip_address(value).compressed
    except ValueError:
        pass
    try:
        # `//` makes urlsplit read `host:port` as a network location, not a scheme.
        host = urllib.parse.urlsplit(value if "://" in value else f"//{value}").hostname
    except ValueError:  # e.g. an unclosed `[`
        return None
    return address_key(host) if host else None


class AddressIndex:
    """Node names by name and by each of their status.addresses (InternalIP,
    ExternalIP, Hostname, ...), fed by the node informer's change handler."""

    def __init__(self) -> None:
        self._nodes: defaultdict[str, set[str]] = defaultdict(set)
        self._keys: dict[str, frozenset[str]] = {}

    def on_node(self, old: NodeView | None, new: NodeView | None) -> None:
        changed = new or old
        if changed is None:
            return
        name = changed.name
        keys = frozenset() if new is None else _keys_of(new)
        before = self._keys.get(name, frozenset())
        if keys == before:
            return
        for key in before - keys:
            names = self._nodes[key]
            names.discard(name)
            if not names:
                del self._nodes[key]
        for key in keys - before:
            self._nodes[key].add(name)
        if keys:
            self._keys[name] = keys
        else:
            self._keys.pop(name, None)

    def nodes_at(self, host: str) -> set[str]:
        """Names of the nodes with this address key (or this name)."""
        return set(self._nodes.get(host, ()))

    def __len__(self) -> int:
        return len(self._keys)


def _keys_of(node: NodeView) -> frozenset[str]:
    return frozenset({node.name, *(address_key(a) for a in node.addresses)})


class NodeFinder:
    """The managed node an alert label names: `instance` by the host of the scrape
    target (node name, else address), any other label by node name."""

    def __init__(
        self,
        nodes: Store[NodeView],
        managed: Callable[[NodeView | None], bool],
        known: Iterable[str] = (),
        *,
        index: AddressIndex | None = None,
    ) -> None:
        """`index`: one kept current elsewhere (the fleet's); else this finder keeps
        its own, from the nodes in `known` and every change as it comes."""
        self.nodes = nodes
        self.managed = managed
        if index is None:
            index = AddressIndex()
            for name in known:
                index.on_node(None, nodes.get(name))
            nodes.handlers.append(index.on_node)
        self.index = index

    def find(self, label: str, value: str) -> str | None:
        if label == "instance":
            return self._at(value)
        return value if self.managed(self.nodes.get(value)) else None

    def _at(self, instance: str) -> str | None:
        """Two managed nodes at one address name neither: acting on the wrong one
        is worse than skipping the alert."""
        host = instance_host(instance)
        if host is None:
            return None
        if self.managed(self.nodes.get(host)):
            return host
        managed = [n for n in self.index.nodes_at(host) if self.managed(self.nodes.get(n))]
        return managed[0] if len(managed) == 1 else None
