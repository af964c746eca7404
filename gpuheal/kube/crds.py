"""gpuheal's CRDs as this version ships them, and the ones the API server serves.

Helm installs a chart's `crds/` once and never upgrades them, so after `helm
upgrade` the cluster may serve an older schema than the programs were built for;
an object field the schema lacks is pruned on every write, silently. Each shipped
CRD carries the digest of its `spec` (DIGEST_ANNOTATION, written by
tools/crd_digest.py), so a served CRD is this version's when its digest is the
shipped one: `gpuheal crds check` says which are not, `gpuheal crds apply` installs
them, and the controller says what to run (controller/app.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from gpuheal.kube.api import ApiError, KubeApi

DIGEST_ANNOTATION = "gpuheal.io/schema-digest"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
FIELD_MANAGER = "gpuheal-crds"
APPLY_COMMAND = "gpuheal crds apply"

# Served but not this version's, or not served at all.
CURRENT, OUTDATED, MISSING = "current", "outdated", "missing"


def digest(spec: Any) -> str:
    """The digest of a CRD's spec: its canonical JSON's sha256, 16 hex digits."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def shipped() -> dict[str, dict[str, Any]]:
    """Name -> manifest of every CRD in the package (gpuheal/crds)."""
    found: dict[str, dict[str, Any]] = {}
    for entry in sorted(resources.files("gpuheal.crds").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            manifest = yaml.safe_load(entry.read_text())
            found[manifest["metadata"]["name"]] = manifest
    return found


@dataclass(frozen=True)
class Served:
    name: str
    state: str  # CURRENT, OUTDATED or MISSING
    served: str = ""  # the served CRD's digest ("" when it has none)
    wanted: str = ""  # this version's

    def sentence(self) -> str:
        if self.state == CURRENT:
            return f"{self.name}: this version's schema ({self.wanted})"
        if self.state == MISSING:
            return f"{self.name}: not installed; run `{APPLY_COMMAND}`"
        was = self.served or "none"
        return (
            f"{self.name}: an older schema is served (digest {was}, this version's "
            f"{self.wanted}: Helm does not upgrade CRDs); run `{APPLY_COMMAND}`"
        )


async def served(api: KubeApi, name: str, manifest: dict[str, Any]) -> Served:
    """How the API server serves one of gpuheal's CRDs against the shipped one."""
    wanted = manifest["metadata"]["annotations"][DIGEST_ANNOTATION]
    try:
        raw = await api.get(f"{CRD_PATH}/{name}")
    except ApiError as err:
        if err.code == 404:
            return Served(name, MISSING, wanted=wanted)
        raise
    annotations = (json.loads(raw).get("metadata") or {}).get("annotations") or {}
    have = str(annotations.get(DIGEST_ANNOTATION) or "")
    return Served(name, CURRENT if have == wanted else OUTDATED, have, wanted)


async def apply(api: KubeApi, manifest: dict[str, Any]) -> None:
    """Server-side apply of one CRD as this version ships it, taking over the fields
    Helm manages (force: Helm's install is where they came from)."""
    name = manifest["metadata"]["name"]
    await api.patch(
        f"{CRD_PATH}/{name}?fieldManager={FIELD_MANAGER}&force=true",
        manifest,
        content_type="application/apply-patch+yaml",
    )
