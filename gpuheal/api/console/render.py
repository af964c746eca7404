"""The console's HTML: Jinja templates with autoescape always on, so every string
from the cluster (node names, annotations, fault reasons from alert labels) is
text, never markup; and its two static files, served from the package under a
path that changes with their content."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import jinja2

from gpuheal.api.console.auth import Session
from gpuheal.api.console.views import STATES, Cluster, fault, fleet, node, open_faults

HERE = Path(__file__).parent
# The files under static/ and their types; nothing else is served from there.
ASSET_TYPES = {"console.js": "text/javascript", "console.css": "text/css"}
ASSETS = {name: (HERE / "static" / name).read_bytes() for name in ASSET_TYPES}
# In each asset's path: a new release's files are new URLs, so they may be cached for good.
ASSET_VERSION = hashlib.sha256(b"".join(ASSETS[n] for n in sorted(ASSETS))).hexdigest()[:12]

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,  # every template, whatever its name: nothing is trusted
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.globals["asset"] = lambda name: f"/console/static/{ASSET_VERSION}/{name}"


def page(template: str, *, fragment: bool = False, **context: Any) -> str:
    """A whole page, or only its live part (`#live`, what the script swaps in)."""
    layout = "fragment.html" if fragment else "base.html"
    context.setdefault("session", None)
    context.setdefault("version", "")
    return _env.get_template(template).render(layout=layout, **context)


def fleet_page(cluster: Cluster, session: Session | None, *, fragment: bool = False) -> str:
    shown = fleet(cluster)
    return page(
        "fleet.html",
        fragment=fragment,
        fleet=shown,
        states=STATES,
        session=session,
        version=shown.version,
    )


def faults_page(cluster: Cluster, session: Session | None, *, fragment: bool = False) -> str:
    return page(
        "faults.html",
        fragment=fragment,
        faults=open_faults(cluster),
        session=session,
        version=cluster.version,
    )


def fault_page(
    cluster: Cluster, name: str, session: Session | None, *, fragment: bool = False
) -> str | None:
    shown = fault(cluster, name)
    if shown is None:
        return None
    return page("fault.html", fragment=fragment, f=shown, session=session, version=shown.version)


def node_page(
    cluster: Cluster, name: str, session: Session | None, *, fragment: bool = False
) -> str | None:
    shown = node(cluster, name)
    if shown is None:
        return None
    return page("node.html", fragment=fragment, n=shown, session=session, version=shown.version)
