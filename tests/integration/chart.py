"""The Helm chart on the real control plane, for the tests that run gpuheal's
programs and people with the chart's identities: render it, apply it, mint
tokens for its ServiceAccounts with TokenRequest, and talk as them."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from lightkube import ApiError, Client, codecs
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.core_v1 import Namespace, Node, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from gpuheal.sim import ControlPlane
from gpuheal.sim.client import sync_client
from gpuheal.sim.kubeconfig import write_kubeconfig
from gpuheal.sim.workloads import create_namespace
from tests.helpers import unique

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpuheal"


def helm_template(
    control_plane: ControlPlane, release: str, namespace: str, *values: Path,
    sets: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`helm template` with the real helm for the control plane's Kubernetes version:
    values files, then `--set KEY=VALUE`s."""
    argv = [str(control_plane.config.binaries.helm), "template", release, str(CHART),
            "--namespace", namespace, "--include-crds",
            "--kube-version", control_plane.version]  # fmt: skip
    for path in values:
        argv += ["-f", str(path)]
    for key, value in (sets or {}).items():
        argv += ["--set", f"{key}={value}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def render(
    control_plane: ControlPlane, release: str, namespace: str, *values: Path,
    sets: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    done = helm_template(control_plane, release, namespace, *values, sets=sets)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    objects: list[dict[str, Any]]
    tests: list[dict[str, Any]]  # `helm test`'s hooks: rendered, not installed

    def find(self, kind: str, name: str) -> dict[str, Any]:
        return next(o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name)


def is_test_hook(obj: dict[str, Any]) -> bool:
    """Created by `helm test`, not by `helm install`."""
    return (obj["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"


@contextmanager
def installed(
    kube: Client,
    control_plane: ControlPlane,
    sets: Mapping[str, str] | None = None,
    namespace_labels: Mapping[str, str] | None = None,
) -> Iterator[Release]:
    """The chart under a fresh release name and namespace, every object applied
    with server-side apply (kwok plays the workloads' pods: no image is pulled;
    tests run the programs themselves as processes with the chart's tokens)."""
    name, namespace = unique("gh"), unique("gpuheal-system")
    # With its default ServiceAccount, for the canaries; labels: Pod Security's, say.
    create_namespace(kube, namespace, namespace_labels)
    rendered = render(control_plane, name, namespace, sets=sets)
    tests = [o for o in rendered if is_test_hook(o)]
    applied = []
    try:
        for obj in (o for o in rendered if not is_test_hook(o)):
            kube.apply(codecs.from_dict(obj), field_manager="helm-test", force=True)
            applied.append(obj)
        yield Release(name, namespace, applied, tests)
    finally:
        for obj in applied:
            if obj["kind"].startswith(("ClusterRole", "ValidatingAdmissionPolicy")):
                kube.delete(type(codecs.from_dict(obj)), obj["metadata"]["name"])
        kube.delete(Namespace, namespace)


def token_for(kube: Client, namespace: str, account: str, bound_node: str | None = None) -> str:
    """A token TokenRequest issues for the ServiceAccount; bound to a Node, it
    carries the node's name (authentication.kubernetes.io/node-name), as a token
    bound to a Pod on that node does."""
    spec = TokenRequestSpec(audiences=[], expirationSeconds=3600)
    if bound_node:
        node = kube.get(Node, bound_node)
        spec.boundObjectRef = BoundObjectReference(
            apiVersion="v1",
            kind="Node",
            name=bound_node,
            uid=node.metadata.uid if node.metadata else None,
        )
    issued = kube.create(
        ServiceAccount.Token(metadata=ObjectMeta(), spec=spec), account, namespace=namespace
    )
    assert issued.status is not None and issued.status.token
    return str(issued.status.token)


def as_token(
    control_plane: ControlPlane, tmp_path: Path, token: str, name: str
) -> tuple[Path, Client]:
    kubeconfig = write_kubeconfig(
        tmp_path / f"{name}.kubeconfig", server=control_plane.server, ca_cert=control_plane.ca_cert,
        user=name, token=token,
    )  # fmt: skip
    return kubeconfig, sync_client(kubeconfig)


def forbidden(call: Callable[[], Any]) -> bool:
    try:
        call()
    except ApiError as err:
        return err.status.code == 403
    return False


def bind(kube: Client, role: str, account: str, namespace: str) -> str:
    """Bind a ClusterRole to a ServiceAccount; returns the binding's name."""
    name = unique("bind")
    kube.create(
        ClusterRoleBinding(
            metadata=ObjectMeta(name=name),
            roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
            subjects=[Subject(kind="ServiceAccount", name=account, namespace=namespace)],
        )
    )
    return name


def alert_rules(control_plane: ControlPlane, group: str, for_: str = "2s") -> list[dict[str, Any]]:
    """The chart's alert rules of one group as they render with monitoring on, each
    rule's `for` made `for_` (its expression as is), for a real Prometheus."""
    full = Path(__file__).parent / "data" / "values-full.yaml"
    rendered = render(control_plane, "gh", "gpuheal-system", full)
    groups = next(o for o in rendered if o["kind"] == "PrometheusRule")["spec"]["groups"]
    return [{**r, "for": for_} for g in groups if g["name"] == group for r in g["rules"]]


def firing(prometheus_url: str) -> set[tuple[str, str]]:
    """(alertname, the reason label or "") of every alert firing now."""
    with urllib.request.urlopen(f"{prometheus_url}/api/v1/alerts", timeout=5) as response:  # noqa: S310
        alerts = json.load(response)["data"]["alerts"]
    return {
        (a["labels"]["alertname"], a["labels"].get("reason", ""))
        for a in alerts
        if a["state"] == "firing"
    }


def helm(control_plane: ControlPlane, tmp_path: Path, *argv: str) -> str:
    """The real helm against the control plane, with its own home (no user's repos)."""
    home = {
        f"HELM_{k}_HOME": str(tmp_path / "helm" / k.lower()) for k in ("CACHE", "CONFIG", "DATA")
    }
    argv = (
        str(control_plane.config.binaries.helm),
        *argv,
        "--kubeconfig",
        str(control_plane.kubeconfig),
    )
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **home}
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
