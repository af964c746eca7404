"""Read the local apiserver's audit log: what one client really asked of the
server, counted on the server's side (see ControlPlaneConfig.audit_users).

Used by the benchmarks (API cost per remediation, requests while idle) and the
chaos tests (no pod evicted twice), where a client's own bookkeeping would not
survive the SIGKILLs being tested.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import Client

from gpuheal.sim.workloads import apply


@dataclass(frozen=True)
class Request:
    user: str
    verb: str
    resource: str  # "pods", "pods/eviction"; the path for non-resource URLs
    namespace: str
    name: str
    code: int
    at: str  # the stage timestamp, RFC 3339 with microseconds
    # The request's body, where the policy logs it (node patches): None elsewhere.
    body: Any = None


def requests(
    path: Path, *, user: str | None = None, since: int = 0, until: int | None = None
) -> Iterator[Request]:
    """Completed requests (a watch counts when it starts) from byte offset `since`,
    up to offset `until` (both from `offset()`; None: to the end)."""
    if not path.exists():
        return
    with path.open("rb") as log:
        log.seek(since)
        while until is None or log.tell() < until:
            raw = log.readline()
            if not raw:
                break
            event = json.loads(raw)
            verb = event.get("verb", "")
            if event.get("stage") != ("ResponseStarted" if verb == "watch" else "ResponseComplete"):
                continue
            who = event.get("user", {}).get("username", "")
            if user is not None and who != user:
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource") or event.get("requestURI", "")
            if ref.get("subresource"):
                resource = f"{resource}/{ref['subresource']}"
            yield Request(
                user=who,
                verb=verb,
                resource=resource,
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                code=int(event.get("responseStatus", {}).get("code", 0)),
                at=event.get("stageTimestamp", ""),
                body=event.get("requestObject"),
            )


def offset(path: Path) -> int:
    """Where the log ends now: pass as `since` to count only what follows."""
    return path.stat().st_size if path.exists() else 0


def by_verb_and_resource(found: Iterator[Request]) -> dict[str, int]:
    """{"create pods/eviction": 8, "list pods": 1, ...}, sorted by key."""
    counts = Counter(f"{r.verb} {r.resource}" for r in found)
    return dict(sorted(counts.items()))


def evictions(found: Iterator[Request]) -> dict[tuple[str, str], list[int]]:
    """(namespace, pod) -> the response codes of every eviction request for it, in
    order. 201: accepted (also for a pod already terminating, so two are a pod
    evicted twice); 504 or 0: the client went away mid-request (a SIGKILLed
    controller; the server cancels its context) and the server may or may not
    have acted."""
    found_by_pod: dict[tuple[str, str], list[int]] = {}
    for r in found:
        if r.verb == "create" and r.resource == "pods/eviction":
            found_by_pod.setdefault((r.namespace, r.name), []).append(r.code)
    return found_by_pod


def grant_cluster_admin(client: Client, user: str) -> None:
    """Bind cluster-admin to `user` (benchmarks; the tests bind the chart's roles)."""
    apply(
        client,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{user}-cluster-admin"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )
