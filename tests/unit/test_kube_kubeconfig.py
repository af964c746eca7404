"""Reading kubeconfigs as kubectl does: search order, contexts, relative paths,
and a plain message for each way a kubeconfig can be unusable."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal.cli import main
from gpuheal.kube.credentials import (
    CredentialError,
    ExecPlugin,
    FileToken,
    credentials_for,
    tls_context,
)
from gpuheal.kube.kubeconfig import (
    Exec,
    KubeconfigError,
    NoKubeconfigError,
    Token,
    TokenFile,
    load_rest_config,
)
from gpuheal.sim.kubeconfig import write_kubeconfig
from gpuheal.sim.pki import create_pki, issue_client_cert

SERVER = "https://ABCDEF0123456789.gr7.us-west-2.eks.amazonaws.com"


def write(path: Path, users: dict[str, Any], **extra: Any) -> Path:
    """A kubeconfig with one cluster and one context per user (named after it)."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "prod", "cluster": {"server": SERVER}}],
        "users": [{"name": name, "user": user} for name, user in users.items()],
        "contexts": [
            {"name": name, "context": {"cluster": "prod", "user": name}} for name in users
        ],
        **extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


def nowhere(tmp_path: Path) -> dict[str, Any]:
    """Search settings under which nothing exists: no $KUBECONFIG, an empty home,
    no service-account mount."""
    return {"environ": {}, "home": tmp_path / "home", "service_account_dir": tmp_path / "sa"}


def test_nothing_found_says_so_plainly(tmp_path: Path) -> None:
    with pytest.raises(NoKubeconfigError) as err:
        load_rest_config(None, **nowhere(tmp_path))
    message = str(err.value)
    assert message.startswith("no kubeconfig found")
    assert "$KUBECONFIG" in message and ".kube/config" in message and "cluster" in message
    assert "Errno" not in message and "serviceaccount/token" not in message


def test_in_cluster_needs_both_the_environment_and_the_mounted_token(tmp_path: Path) -> None:
    mounted = tmp_path / "sa"
    mounted.mkdir()
    (mounted / "token").write_text("t0ken")
    env = {"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}
    config = load_rest_config(None, environ=env, home=tmp_path, service_account_dir=mounted)
    assert config.server == "https://[fd00:10:96::1]:443"
    assert config.auth == TokenFile(mounted / "token")
    assert config.ca_pem is None  # no ca.crt mounted: the system's trust store
    with pytest.raises(NoKubeconfigError):
        load_rest_config(None, environ={}, home=tmp_path, service_account_dir=mounted)


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["audit"],
        ["doctor", "ip-10-0-12-34.us-west-2.compute.internal"],
        ["gate", "ip-10-0-12-34.us-west-2.compute.internal"],
        ["maintenance", "start", "ip-10-0-12-34.us-west-2.compute.internal", "--reason", "bios"],
        ["maintenance", "finish", "ip-10-0-12-34.us-west-2.compute.internal"],
        ["approve", "gpufault-ip-10-0-12-34-xid79"],
        ["controller"],
        ["agent", "--node", "ip-10-0-12-34.us-west-2.compute.internal"],
    ],
)
def test_every_command_says_plainly_that_there_is_no_kubeconfig(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    code = main(command)
    err = capsys.readouterr().err
    assert code == 2
    assert "no kubeconfig found" in err
    assert "Errno" not in err and "Traceback" not in err


def test_the_explicit_file_wins_and_must_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    explicit = write(
        tmp_path / "explicit", {"alice": {"token": "a"}}, **{"current-context": "alice"}
    )
    env = write(tmp_path / "env", {"bob": {"token": "b"}}, **{"current-context": "bob"})
    settings = nowhere(tmp_path) | {"environ": {"KUBECONFIG": str(env)}}
    assert load_rest_config(explicit, **settings).auth == Token("a")
    assert load_rest_config(None, **settings).auth == Token("b")
    with pytest.raises(KubeconfigError, match="does not exist"):
        load_rest_config(tmp_path / "missing", **settings)


def test_kubeconfig_files_merge_first_definition_wins(tmp_path: Path) -> None:
    first = write(tmp_path / "a", {"alice": {"token": "a1"}})
    second = write(tmp_path / "b", {"alice": {"token": "a2"}, "bob": {"token": "b"}}, **{
        "current-context": "bob"
    })  # fmt: skip
    listed = f"{tmp_path / 'missing'}:{first}:{second}"  # missing files are skipped
    settings = nowhere(tmp_path) | {"environ": {"KUBECONFIG": listed}}
    config = load_rest_config(None, **settings)
    assert config.context == "bob"  # the first current-context set
    assert load_rest_config(None, "alice", **settings).auth == Token("a1")


def test_home_kubeconfig_and_context_selection(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write(home / ".kube" / "config", {"alice": {"token": "a"}, "bob": {"token": "b"}}, **{
        "current-context": "alice"
    })  # fmt: skip
    settings = nowhere(tmp_path)
    assert load_rest_config(None, **settings).auth == Token("a")
    assert load_rest_config(None, "bob", **settings).auth == Token("b")


def test_a_missing_context_names_the_ones_there_are(tmp_path: Path) -> None:
    path = write(tmp_path / "config", {"alice": {"token": "a"}})
    with pytest.raises(KubeconfigError, match="current-context is not set; pass --context"):
        load_rest_config(path)
    with pytest.raises(KubeconfigError, match=r"context 'carol' not found \(contexts: alice\)"):
        load_rest_config(path, "carol")


def test_a_context_naming_an_undefined_user_or_cluster(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "prod", "cluster": {"server": SERVER}}],
                "contexts": [
                    {"name": "no-user", "context": {"cluster": "prod", "user": "ghost"}},
                    {"name": "no-cluster", "context": {"cluster": "gone"}},
                    {"name": "anonymous", "context": {"cluster": "prod"}},
                ],
            }
        )
    )
    with pytest.raises(KubeconfigError, match="user 'ghost', which is not defined"):
        load_rest_config(path, "no-user")
    with pytest.raises(KubeconfigError, match="cluster 'gone', which is not defined"):
        load_rest_config(path, "no-cluster")
    assert load_rest_config(path, "anonymous").auth is None


def test_relative_paths_resolve_against_the_kubeconfigs_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = create_pki(tmp_path / "certs")
    client = issue_client_cert(pki, tmp_path / "certs", "ops-alice")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "token").write_text("t0ken")
    path = tmp_path / "kube" / "config"
    path.parent.mkdir()
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {
                        "name": "prod",
                        "cluster": {"server": SERVER, "certificate-authority": "../certs/ca.crt"},
                    }
                ],
                "users": [
                    {
                        "name": "alice",
                        "user": {
                            "client-certificate": "../certs/client-ops-alice.crt",
                            "client-key": "../certs/client-ops-alice.key",
                            "tokenFile": "../secrets/token",
                        },
                    },
                    {
                        "name": "plugin",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1",
                                "command": "./bin/get-token",
                            }
                        },
                    },
                    {
                        "name": "on-path",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": "aws",
                                "args": ["eks", "get-token", "--cluster-name", "prod"],
                                "env": [{"name": "AWS_PROFILE", "value": "gpu"}],
                            }
                        },
                    },
                ],
                "contexts": [
                    {"name": n, "context": {"cluster": "prod", "user": n}}
                    for n in ("alice", "plugin", "on-path")
                ],
            }
        )
    )
    monkeypatch.chdir(tmp_path / "secrets")  # not where the paths are relative to
    alice = load_rest_config(path, "alice")
    assert alice.ca_pem == pki.ca.cert.read_bytes()
    assert alice.client_cert is not None
    assert alice.client_cert.cert_pem == client.cert.read_bytes()
    assert alice.auth == TokenFile(tmp_path / "secrets" / "token")
    tls_context(alice)  # the CA and the certificate load
    plugin = load_rest_config(path, "plugin").auth
    assert isinstance(plugin, Exec)
    assert plugin.command == str(tmp_path / "kube" / "bin" / "get-token")
    aws = load_rest_config(path, "on-path").auth
    assert isinstance(aws, Exec) and aws.command == "aws"  # searched on $PATH
    assert aws.args == ("eks", "get-token", "--cluster-name", "prod")
    assert aws.env == (("AWS_PROFILE", "gpu"),)


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ({"client-certificate-data": "bm90IGJhc2U2NA=!", "client-key-data": "a2V5"},
         "user 'u': client-certificate-data is not valid base64"),
        ({"client-certificate-data": "Y2VydA=="}, "client-key is missing"),
        ({"client-certificate": "/nonexistent/cert.pem", "client-key": "/nonexistent/key.pem"},
         "cannot read client-certificate /nonexistent/cert.pem"),
        ({"token": "a", "username": "admin", "password": "x"}, "not both"),
        ({"auth-provider": {"name": "gcp"}}, "auth-provider 'gcp' is not supported"),
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}},
         "exec apiVersion 'client.authentication.k8s.io/v1alpha1' is not supported"),
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1"}}, "exec has no command"),
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "login",
                   "interactiveMode": "Always"}}, "requires an interactive terminal"),
    ],
)  # fmt: skip
def test_an_unusable_user_is_named_with_its_field(
    tmp_path: Path, user: dict[str, Any], message: str
) -> None:
    path = write(tmp_path / "config", {"u": user}, **{"current-context": "u"})
    with pytest.raises(KubeconfigError) as err:
        load_rest_config(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_bad_pem_fails_at_start_with_the_kubeconfig_named(tmp_path: Path) -> None:
    not_pem = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nnope\n").decode()
    path = write(
        tmp_path / "config",
        {"u": {"client-certificate-data": not_pem, "client-key-data": not_pem}},
        **{"current-context": "u"},
    )
    with pytest.raises(KubeconfigError, match="client certificate or key cannot be loaded"):
        tls_context(load_rest_config(path))
    document = yaml.safe_load(path.read_text())
    document["clusters"][0]["cluster"]["certificate-authority-data"] = not_pem
    document["users"][0]["user"] = {"token": "t"}
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(KubeconfigError, match="certificate authority is not a PEM CA"):
        tls_context(load_rest_config(path))


def test_not_yaml_or_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("clusters: [\n")
    with pytest.raises(KubeconfigError, match="not valid YAML"):
        load_rest_config(path)
    path.write_text("- a list\n")
    with pytest.raises(KubeconfigError, match="not a kubeconfig"):
        load_rest_config(path)


def test_the_sim_kubeconfig_reads_back(tmp_path: Path) -> None:
    pki = create_pki(tmp_path)
    path = write_kubeconfig(
        tmp_path / "kc.yaml",
        server="https://127.0.0.1:6443",
        ca_cert=pki.ca.cert,
        user="gpuheal-agent",
        token="s3cr3t",
    )
    config = load_rest_config(path)
    assert config.server == "https://127.0.0.1:6443"
    assert config.ca_pem == pki.ca.cert.read_bytes()
    assert config.auth == Token("s3cr3t")


def test_a_missing_plugin_shows_its_install_hint(tmp_path: Path) -> None:
    path = write(
        tmp_path / "config",
        {
            "u": {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "command": "gpuheal-test-no-such-plugin",
                    "installHint": "Install it with: brew install no-such-plugin",
                }
            }
        },
        **{"current-context": "u"},
    )
    config = load_rest_config(path)
    assert isinstance(config.auth, Exec)
    with pytest.raises(CredentialError) as err:
        asyncio.run(ExecPlugin(config.auth, config).current())
    assert "'gpuheal-test-no-such-plugin' not found" in str(err.value)
    assert "brew install no-such-plugin" in str(err.value)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("not json", "not JSON"),
        (json.dumps({"kind": "Status"}), "did not print an ExecCredential"),
        (json.dumps({"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1"}),
         "has no status"),
        (json.dumps({"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1beta1",
                     "status": {"token": "s3cr3t-token"}}), "answered apiVersion"),
        (json.dumps({"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1",
                     "status": {}}), "neither a token nor a client certificate"),
        (json.dumps({"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1",
                     "status": {"token": "s3cr3t-token", "expirationTimestamp": "tomorrow"}}),
         "is not RFC 3339"),
    ],
)  # fmt: skip
def test_a_plugins_bad_answer_is_named_without_the_token(
    tmp_path: Path, answer: str, message: str
) -> None:
    plugin = tmp_path / "plugin"
    plugin.write_text(f"#!{sys.executable}\nprint({answer!r})\n")
    plugin.chmod(0o755)
    spec = Exec("client.authentication.k8s.io/v1", str(plugin))
    config = load_rest_config(write(tmp_path / "c", {"u": {"token": "t"}}), "u")
    with pytest.raises(CredentialError) as err:
        asyncio.run(ExecPlugin(spec, config).current())
    assert message in str(err.value)
    assert "s3cr3t-token" not in str(err.value)


def test_a_failing_plugin_names_its_exit_code(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    plugin.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(3)\n")
    plugin.chmod(0o755)
    config = load_rest_config(write(tmp_path / "c", {"u": {"token": "t"}}), "u")
    spec = Exec("client.authentication.k8s.io/v1", str(plugin))
    with pytest.raises(CredentialError, match="plugin failed with exit code 3"):
        asyncio.run(ExecPlugin(spec, config).current())


def test_a_token_file_is_reread_only_after_its_interval(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    now = [0.0]
    source = FileToken(path, reload_s=60, clock=lambda: now[0])

    async def read() -> str | None:
        return (await source.current()).authorization

    assert asyncio.run(read()) == "Bearer one"
    path.write_text("two")
    now[0] = 59.0
    assert asyncio.run(read()) == "Bearer one"
    now[0] = 60.0
    assert asyncio.run(read()) == "Bearer two"
    path.unlink()  # mid-rotation: keep the last token
    now[0] = 130.0
    assert asyncio.run(read()) == "Bearer two"
    assert source.reads == 2


def test_basic_auth_is_sent_as_basic(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c",
        {"u": {"username": "admin", "password": "pa:ss"}},
        **{"current-context": "u"},
    )
    source = credentials_for(load_rest_config(path))
    credential = asyncio.run(source.current())
    assert credential.authorization == "Basic " + base64.b64encode(b"admin:pa:ss").decode()


def test_a_container_user_without_a_home_still_finds_its_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    mounted = tmp_path / "sa"
    mounted.mkdir()
    (mounted / "token").write_text("t0ken")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    config = load_rest_config(None, environ=env, service_account_dir=mounted)
    assert config.server == "https://10.96.0.1:443"
    with pytest.raises(NoKubeconfigError, match="no kubeconfig found"):
        load_rest_config(None, environ={}, service_account_dir=tmp_path / "none")
