"""Every way a kubeconfig can say who we are, against the real API server: a token
file, client certificates (files and -data), exec credential plugins (tokens and
certificates, expiry, a 401), and the in-cluster service account with its token
rotating mid-run. Who the server took us for comes from a SelfSubjectReview."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from lightkube import Client

from gpuheal.kube.api import ApiError, KubeApi, node_path
from gpuheal.kube.client import operator_api
from gpuheal.kube.credentials import FileToken
from gpuheal.kube.kubeconfig import RestConfig, load_rest_config
from gpuheal.sim import ControlPlane
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes
from tests.helpers import unique

pytestmark = pytest.mark.timeout(120)

AGENT, OPERATOR = "gpuheal-agent", "gpuheal-operator"  # static identities of gpuheal.sim


class _UserInfo(msgspec.Struct):
    username: str


class _ReviewStatus(msgspec.Struct):
    userInfo: _UserInfo  # noqa: N815


class _Review(msgspec.Struct):
    status: _ReviewStatus


async def whoami(api: KubeApi) -> str:
    """The user the API server authenticated this request as."""
    raw = await api.create(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    return msgspec.json.decode(raw, type=_Review).status.userInfo.username


def kubeconfig(path: Path, cp: ControlPlane, user: dict[str, Any], **cluster: Any) -> Path:
    """A kubeconfig for the session's API server with `user` as its credentials."""
    ca = base64.b64encode(cp.ca_cert.read_bytes()).decode()
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sim",
                "cluster": {"server": cp.server, "certificate-authority-data": ca, **cluster},
            }
        ],
        "users": [{"name": "me", "user": user}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "me"}}],
        "current-context": "sim",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


def identity_of(config: Path | RestConfig) -> str:
    async def ask() -> str:
        api = KubeApi(config) if isinstance(config, RestConfig) else KubeApi.from_kubeconfig(config)
        try:
            return await whoami(api)
        finally:
            await api.close()

    return asyncio.run(ask())


def test_a_token_file_relative_to_the_kubeconfig(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "token").write_text(control_plane.tokens[AGENT] + "\n")
    path = kubeconfig(
        tmp_path / "kube" / "config", control_plane, {"tokenFile": "../secrets/token"}
    )
    assert identity_of(path) == AGENT


def test_client_certificate_files_and_data(control_plane: ControlPlane, tmp_path: Path) -> None:
    pair = control_plane.client_certificate("ops-alice", ("gpuheal-ops",))
    files = kubeconfig(
        tmp_path / "files.yaml",
        control_plane,
        {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
    )
    data = kubeconfig(
        tmp_path / "data.yaml",
        control_plane,
        {
            "client-certificate-data": base64.b64encode(pair.cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(pair.key.read_bytes()).decode(),
        },
    )
    assert identity_of(files) == "ops-alice"
    assert identity_of(data) == "ops-alice"


def test_the_ca_file_is_checked_and_insecure_skips_it(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    token = {"token": control_plane.tokens[AGENT]}
    other_ca = control_plane.client_certificate("not-a-ca").cert  # any other certificate
    path = kubeconfig(tmp_path / "wrong-ca.yaml", control_plane, token)
    document = yaml.safe_load(path.read_text())
    cluster = document["clusters"][0]["cluster"]
    del cluster["certificate-authority-data"]
    cluster["certificate-authority"] = str(other_ca)
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(Exception, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        identity_of(path)
    del cluster["certificate-authority"]
    cluster["insecure-skip-tls-verify"] = True
    path.write_text(yaml.safe_dump(document))
    assert identity_of(path) == AGENT


# An exec credential plugin: counts its runs, answers with the token (or the client
# certificate) of files the test controls, valid for $EXPIRES_S seconds if set.
PLUGIN = """\
import datetime, json, os, pathlib, sys
here = pathlib.Path(os.environ["PLUGIN_DIR"])
runs = here / "runs"
with runs.open("a") as f:
    f.write("run\\n")
n = len(runs.read_text().splitlines())
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
status = {}
if (here / "cert.pem").exists():
    status["clientCertificateData"] = (here / "cert.pem").read_text()
    status["clientKeyData"] = (here / "key.pem").read_text()
else:
    bad = n <= int(os.environ.get("BAD_RUNS", "0"))
    status["token"] = "not-a-token" if bad else (here / "token").read_text().strip()
if os.environ.get("EXPIRES_S"):
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(
        seconds=float(os.environ["EXPIRES_S"]))
    status["expirationTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
print(json.dumps({"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}))
"""


def exec_kubeconfig(
    tmp_path: Path,
    cp: ControlPlane,
    api_version: str = "client.authentication.k8s.io/v1",
    **env: str,
) -> Path:
    plugin = tmp_path / "bin" / "get-token"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.write_text(f"#!{sys.executable}\n{PLUGIN}")
    plugin.chmod(0o755)
    return kubeconfig(
        tmp_path / "kubeconfig",
        cp,
        {
            "exec": {
                "apiVersion": api_version,
                "command": "./bin/get-token",  # relative to the kubeconfig's directory
                "env": [
                    {"name": k, "value": v} for k, v in {"PLUGIN_DIR": str(tmp_path), **env}.items()
                ],
                "interactiveMode": "Never",
            }
        },
    )


def runs(tmp_path: Path) -> int:
    path = tmp_path / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_an_exec_plugin_runs_again_only_when_its_credential_expires(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(control_plane.tokens[AGENT])
    path = exec_kubeconfig(tmp_path, control_plane, EXPIRES_S="3")

    async def scenario() -> None:
        api = KubeApi.from_kubeconfig(path)
        try:
            for _ in range(5):
                assert await whoami(api) == AGENT
            assert runs(tmp_path) == 1  # cached, not run per request
            (tmp_path / "token").write_text(control_plane.tokens[OPERATOR])
            await asyncio.sleep(3.2)  # past its expirationTimestamp
            assert await whoami(api) == OPERATOR
            assert await whoami(api) == OPERATOR
            assert runs(tmp_path) == 2
        finally:
            await api.close()

    asyncio.run(scenario())


def test_an_exec_plugin_is_run_again_once_after_a_401(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(control_plane.tokens[AGENT])
    # v1beta1 too; its first answer is a token the server refuses, and it has no expiry.
    path = exec_kubeconfig(
        tmp_path, control_plane, "client.authentication.k8s.io/v1beta1", BAD_RUNS="1"
    )

    async def scenario() -> None:
        api = KubeApi.from_kubeconfig(path)
        try:
            assert await whoami(api) == AGENT  # 401, the plugin again, the retry served
            assert runs(tmp_path) == 2
            assert await whoami(api) == AGENT
            assert runs(tmp_path) == 2
            assert api.requests == 3
        finally:
            await api.close()

    asyncio.run(scenario())


def test_a_plugin_that_keeps_failing_is_not_retried_forever(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text("never-valid")
    path = exec_kubeconfig(tmp_path, control_plane)

    async def scenario() -> None:
        api = KubeApi.from_kubeconfig(path)
        try:
            with pytest.raises(ApiError) as refused:
                await whoami(api)
            assert refused.value.code == 401
            assert runs(tmp_path) == 2  # the first answer, and once more after the 401
        finally:
            await api.close()

    asyncio.run(scenario())


def test_an_exec_plugin_may_answer_with_a_client_certificate(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    pair = control_plane.client_certificate("exec-bob")
    (tmp_path / "cert.pem").write_bytes(pair.cert.read_bytes())
    (tmp_path / "key.pem").write_bytes(pair.key.read_bytes())
    path = exec_kubeconfig(tmp_path, control_plane)
    assert identity_of(path) == "exec-bob"
    assert runs(tmp_path) == 1


@pytest.fixture
def service_account_dir(control_plane: ControlPlane, tmp_path: Path) -> Path:
    """What the kubelet mounts in a pod: token, ca.crt, namespace."""
    mounted = tmp_path / "serviceaccount"
    mounted.mkdir()
    (mounted / "ca.crt").write_bytes(control_plane.ca_cert.read_bytes())
    (mounted / "namespace").write_text("gpuheal-system")
    return mounted


def in_cluster_env(cp: ControlPlane) -> dict[str, str]:
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(cp.api_port)}


def rotate(mounted: Path, token: str) -> None:
    """As the kubelet does: the new token replaces the old in one rename."""
    fresh = mounted / ".token.new"
    fresh.write_text(token)
    fresh.replace(mounted / "token")


def test_in_cluster_the_rotated_token_is_sent_after_the_reload_interval(
    control_plane: ControlPlane, service_account_dir: Path, tmp_path: Path
) -> None:
    rotate(service_account_dir, control_plane.tokens[AGENT])
    config = load_rest_config(
        None,
        environ=in_cluster_env(control_plane),
        home=tmp_path,
        service_account_dir=service_account_dir,
        token_reload_s=1.0,
    )
    assert config.namespace == "gpuheal-system"

    async def scenario() -> None:
        api = KubeApi(config)
        try:
            assert await whoami(api) == AGENT
            rotate(service_account_dir, control_plane.tokens[OPERATOR])
            assert await whoami(api) == AGENT  # not re-read on every request
            await asyncio.sleep(1.1)
            assert await whoami(api) == OPERATOR  # the rotated token, mid-run
        finally:
            await api.close()

    asyncio.run(scenario())


async def bound_token(api: KubeApi, namespace: str) -> tuple[str, str, str]:
    """A service-account token bound to a Secret: deleting the Secret revokes it.
    Returns (token, the service account's name, the Secret's name)."""
    account, secret = unique("sa"), unique("bound")
    base = f"/api/v1/namespaces/{namespace}"
    await api.create(f"{base}/serviceaccounts", {"metadata": {"name": account}})
    created = json.loads(await api.create(f"{base}/secrets", {"metadata": {"name": secret}}))
    review = await api.create(
        f"{base}/serviceaccounts/{account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 600,
                "boundObjectRef": {
                    "kind": "Secret",
                    "apiVersion": "v1",
                    "name": secret,
                    "uid": created["metadata"]["uid"],
                },
            },
        },
    )
    return json.loads(review)["status"]["token"], account, secret


def refused(cp: ControlPlane, token: str) -> bool:
    """Whether the API server now answers this token with 401."""
    request = urllib.request.Request(  # noqa: S310 -- the session's loopback API server
        f"{cp.server}/version", headers={"Authorization": f"Bearer {token}"}
    )
    context = ssl.create_default_context(cafile=str(cp.ca_cert))
    try:
        urllib.request.urlopen(request, context=context, timeout=5).close()  # noqa: S310
    except urllib.error.HTTPError as err:
        return err.code == 401
    return False


def test_in_cluster_a_401_rereads_the_token_at_once(
    control_plane: ControlPlane, namespace: str, service_account_dir: Path, tmp_path: Path
) -> None:
    async def scenario() -> None:
        admin = KubeApi.from_kubeconfig(control_plane.kubeconfig)
        token, account, secret = await bound_token(admin, namespace)
        rotate(service_account_dir, token)
        config = load_rest_config(
            None,
            environ=in_cluster_env(control_plane),
            home=tmp_path,
            service_account_dir=service_account_dir,  # the default interval: a minute
        )
        api = KubeApi(config)
        try:
            assert await whoami(api) == f"system:serviceaccount:{namespace}:{account}"
            rotate(service_account_dir, control_plane.tokens[OPERATOR])
            # The old token revoked: its Secret is gone.
            await admin.delete(f"/api/v1/namespaces/{namespace}/secrets/{secret}")
            while not await asyncio.to_thread(refused, control_plane, token):
                await asyncio.sleep(0.1)
            requests = api.requests
            assert await whoami(api) == OPERATOR  # 401, re-read, retried: one call
            assert api.requests == requests + 2
            assert isinstance(api.credentials, FileToken)
            assert api.credentials.reads == 2
        finally:
            await api.close()
            await admin.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_proxy_variables_are_ignored_unless_asked_for(
    control_plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = kubeconfig(
        tmp_path / "kubeconfig", control_plane, {"token": control_plane.tokens[AGENT]}
    )
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert identity_of(path) == AGENT  # the controller's client: no proxy

    async def through_the_proxy() -> None:
        api = operator_api(path, None)  # an operator's shell: its proxy is used
        try:
            await whoami(api)
        finally:
            await api.close()

    with pytest.raises(OSError, match=r"127\.0\.0\.1:9"):
        asyncio.run(through_the_proxy())


def test_a_watch_event_of_200_kb_arrives_whole(control_plane: ControlPlane, kube: Client) -> None:
    (name,) = create_gpu_nodes(kube, [unique("big")])
    note = "x" * 200_000  # annotations may hold 256 KiB: more than one read

    async def scenario() -> dict[str, Any]:
        api = KubeApi.from_kubeconfig(control_plane.kubeconfig)
        try:
            listed = json.loads(await api.get(node_path(name)))
            params = {
                "fieldSelector": f"metadata.name={name}",
                "resourceVersion": listed["metadata"]["resourceVersion"],
            }
            stream = api.watch(node_path(), params, read_timeout_s=30)
            await api.patch(node_path(name), {"metadata": {"annotations": {"big": note}}})
            async for line in stream:
                event: dict[str, Any] = json.loads(line)
                if "big" in event["object"]["metadata"].get("annotations", {}):
                    await stream.aclose()
                    return event
            raise AssertionError("the watch ended without the event")
        finally:
            await api.close()

    try:
        event = asyncio.run(scenario())
    finally:
        delete_nodes(kube, [name])
    assert event["type"] == "MODIFIED"
    assert event["object"]["metadata"]["annotations"]["big"] == note


def test_the_plugin_is_told_about_the_cluster_when_it_asks(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    seen = tmp_path / "info.json"
    plugin = tmp_path / "info-plugin"
    plugin.write_text(
        f"#!{sys.executable}\nimport json, os, pathlib\n"
        "info = os.environ['KUBERNETES_EXEC_INFO']\n"
        f"pathlib.Path({str(seen)!r}).write_text(info)\n"
        "print(json.dumps({'apiVersion': json.loads(info)['apiVersion'], 'kind': 'ExecCredential',"
        f" 'status': {{'token': {control_plane.tokens[AGENT]!r}}}}}))\n"
    )
    plugin.chmod(0o755)
    path = kubeconfig(
        tmp_path / "kubeconfig",
        control_plane,
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": str(plugin),
                "provideClusterInfo": True,
                "interactiveMode": "Never",
            }
        },
    )
    assert identity_of(load_rest_config(path)) == AGENT
    info = json.loads(seen.read_text())
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == control_plane.server
    ca = base64.b64decode(info["spec"]["cluster"]["certificate-authority-data"])
    assert ca == control_plane.ca_cert.read_bytes()
    assert os.environ.get("KUBERNETES_EXEC_INFO") is None  # not leaked into ours


def test_tls_server_name_is_the_name_the_certificate_is_checked_against(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    token = {"token": control_plane.tokens[AGENT]}
    in_san = kubeconfig(
        tmp_path / "in-san.yaml", control_plane, token, **{"tls-server-name": "kubernetes.default"}
    )
    assert identity_of(in_san) == AGENT
    elsewhere = kubeconfig(
        tmp_path / "elsewhere.yaml",
        control_plane,
        token,
        **{"tls-server-name": "api.other-cluster.example.com"},
    )
    with pytest.raises(Exception, match=r"(?i)hostname|certificate verify failed"):
        identity_of(elsewhere)


def test_a_request_timeout_fires_when_it_says_not_at_the_next_whole_second() -> None:
    # A server that accepts and never answers (a stopped API server does the same).
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    config = RestConfig(f"http://127.0.0.1:{silent.getsockname()[1]}", "test")

    async def timed_out_after() -> float:
        api = KubeApi(config, timeout_s=5.0)
        loop = asyncio.get_running_loop()
        # Just past a whole second of the loop's clock: a deadline rounded up to
        # the next whole second would come almost a second late.
        await asyncio.sleep(1.05 - loop.time() % 1.0)
        started = loop.time()
        try:
            with pytest.raises(TimeoutError):
                await api.get(node_path())
            return loop.time() - started
        finally:
            await api.close()

    try:
        assert asyncio.run(timed_out_after()) < 5.5
    finally:
        silent.close()
