"""Where to find the API server and how to prove who we are, as kubectl finds it.

Order (kubectl's): an explicit --kubeconfig, else the files of $KUBECONFIG
(merged, first definition of a name wins), else ~/.kube/config, else the
in-cluster service account (KUBERNETES_SERVICE_HOST/PORT and the mounted
token). Then --context, else the file's current-context.

Everything is read and checked here, at start, so a broken kubeconfig fails
with a message naming the file and the field, not with an error from deep in
a TLS library at the first request. Paths in a kubeconfig are relative to the
file that names them. Credentials that change at runtime (a token file, an
exec plugin) are described here and served by kube/credentials.py.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# client-go re-reads a token file at most once a minute (and after a 401).
TOKEN_RELOAD_S = 60.0
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
IN_CLUSTER = "in-cluster service account"


class KubeconfigError(Exception):
    """A kubeconfig that cannot be used: missing, unreadable, or inconsistent."""


class NoKubeconfigError(KubeconfigError):
    """Nothing to load: no kubeconfig file anywhere kubectl looks, and not in a cluster."""


@dataclass(frozen=True)
class Token:
    token: str


@dataclass(frozen=True)
class TokenFile:
    """A bearer token re-read from a file (projected service-account tokens rotate)."""

    path: Path
    reload_s: float = TOKEN_RELOAD_S


@dataclass(frozen=True)
class Basic:
    username: str
    password: str


@dataclass(frozen=True)
class Exec:
    """An exec credential plugin (`aws eks get-token`, `gke-gcloud-auth-plugin`, ...)."""

    api_version: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    install_hint: str = ""
    provide_cluster_info: bool = False
    # client.authentication.k8s.io/exec extension of the cluster, for provideClusterInfo.
    cluster_config: Any = None


Auth = Token | TokenFile | Basic | Exec | None


@dataclass(frozen=True)
class ClientCert:
    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class RestConfig:
    """One context of a kubeconfig, resolved: what a client needs to connect."""

    server: str
    source: str  # the file (or IN_CLUSTER) it came from, for messages
    ca_pem: bytes | None = None  # None: the system's trust store
    insecure: bool = False
    tls_server_name: str | None = None
    proxy_url: str | None = None
    client_cert: ClientCert | None = None
    auth: Auth = None
    namespace: str = "default"
    context: str = ""
    disable_compression: bool = False
    extensions: Mapping[str, Any] = field(default_factory=dict)


def load_rest_config(
    kubeconfig: Path | None = None,
    context: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    token_reload_s: float = TOKEN_RELOAD_S,
) -> RestConfig:
    """kubectl's search order (see the module doc); NoKubeconfigError when there is
    nothing to load, KubeconfigError when what was found cannot be used."""
    env = os.environ if environ is None else environ
    files = _kubeconfig_files(kubeconfig, env, home)
    if files:
        merged = _merge([_read(f) for f in files])
        return _resolve(merged, context, " + ".join(str(f) for f in files), token_reload_s)
    if context:
        raise NoKubeconfigError(f"no kubeconfig found to select context {context!r} from")
    if in_cluster_possible(env, service_account_dir):
        return in_cluster(env, service_account_dir, token_reload_s)
    raise NoKubeconfigError(
        f"no kubeconfig found (looked at --kubeconfig, $KUBECONFIG, {_default_path(home)}) "
        "and not running in a cluster (no KUBERNETES_SERVICE_HOST/PORT and service-account "
        "token): pass --kubeconfig or set $KUBECONFIG"
    )


def _default_path(home: Path | None) -> Path:
    try:
        return (home or Path.home()) / ".kube" / "config"
    except RuntimeError:  # no $HOME and a user without a passwd entry (a container's)
        return Path("~/.kube/config")


def _kubeconfig_files(
    explicit: Path | None, env: Mapping[str, str], home: Path | None
) -> list[Path]:
    if explicit is not None:
        if not explicit.is_file():
            raise KubeconfigError(f"kubeconfig {explicit} does not exist")
        return [explicit]
    listed = [Path(p) for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        # As kubectl: files of $KUBECONFIG that do not exist are skipped.
        return [p for p in dict.fromkeys(listed) if p.is_file()]
    default = _default_path(home)
    return [default] if default.is_file() else []


@dataclass
class _File:
    """One kubeconfig file, its named entries with their paths made absolute."""

    path: Path
    clusters: dict[str, dict[str, Any]]
    users: dict[str, dict[str, Any]]
    contexts: dict[str, dict[str, Any]]
    current_context: str


_PATH_FIELDS = {
    "cluster": ("certificate-authority",),
    "user": ("client-certificate", "client-key", "tokenFile"),
}


def _read(path: Path) -> _File:
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise KubeconfigError(f"kubeconfig {path}: cannot read it: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise KubeconfigError(f"kubeconfig {path}: not valid YAML: {err}") from err
    if not isinstance(document, dict):
        raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig (a YAML mapping)")
    # Not resolve(): a mounted Secret's files are symlinks into a directory the
    # kubelet replaces on rotation; the path as named stays valid, the target does not.
    base = Path(os.path.abspath(path)).parent  # noqa: PTH100

    def named(key: str, inner: str) -> dict[str, dict[str, Any]]:
        entries: dict[str, dict[str, Any]] = {}
        for entry in document.get(key) or ():
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise KubeconfigError(f"kubeconfig {path}: an entry of {key} has no name")
            body = dict(entry.get(inner) or {})
            for name in _PATH_FIELDS.get(inner, ()):
                if body.get(name):
                    body[name] = os.path.normpath(base / Path(str(body[name])).expanduser())
            if inner == "user" and isinstance(body.get("exec"), dict):
                body["exec"] = {**body["exec"], "_base": str(base)}
            entries.setdefault(entry["name"], body)
        return entries

    return _File(
        path,
        named("clusters", "cluster"),
        named("users", "user"),
        named("contexts", "context"),
        str(document.get("current-context") or ""),
    )


def _merge(files: list[_File]) -> _File:
    """kubectl's merge: the first file to define a name (or the current context) wins."""
    merged = _File(files[0].path, {}, {}, {}, "")
    for f in files:
        for mine, theirs in (
            (merged.clusters, f.clusters),
            (merged.users, f.users),
            (merged.contexts, f.contexts),
        ):
            for name, body in theirs.items():
                mine.setdefault(name, body)
        merged.current_context = merged.current_context or f.current_context
    return merged


def _resolve(config: _File, context: str | None, source: str, token_reload_s: float) -> RestConfig:
    name = context or config.current_context
    if not name:
        raise KubeconfigError(f"kubeconfig {source}: current-context is not set; pass --context")
    if name not in config.contexts:
        known = ", ".join(sorted(config.contexts)) or "none"
        raise KubeconfigError(
            f"kubeconfig {source}: context {name!r} not found (contexts: {known})"
        )
    ctx = config.contexts[name]
    cluster_name = str(ctx.get("cluster") or "")
    if cluster_name not in config.clusters:
        raise KubeconfigError(
            f"kubeconfig {source}: context {name!r} names cluster {cluster_name!r}, "
            "which is not defined"
        )
    cluster = config.clusters[cluster_name]
    user_name = str(ctx.get("user") or "")
    if user_name and user_name not in config.users:
        raise KubeconfigError(
            f"kubeconfig {source}: context {name!r} names user {user_name!r}, which is not defined"
        )
    user = config.users.get(user_name, {})
    where = f"kubeconfig {source}"
    server = str(cluster.get("server") or "")
    if not server:
        raise KubeconfigError(f"{where}: cluster {cluster_name!r} has no server")
    extensions = {
        str(e.get("name")): e.get("extension")
        for e in cluster.get("extensions") or ()
        if isinstance(e, dict)
    }
    return RestConfig(
        server=server.rstrip("/"),
        source=source,
        ca_pem=_pem(cluster, "certificate-authority", f"{where}: cluster {cluster_name!r}"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name") or None,
        proxy_url=cluster.get("proxy-url") or None,
        client_cert=_client_cert(user, f"{where}: user {user_name!r}"),
        auth=_auth(user, f"{where}: user {user_name!r}", token_reload_s, extensions),
        namespace=str(ctx.get("namespace") or "default"),
        context=name,
        disable_compression=bool(cluster.get("disable-compression")),
        extensions=extensions,
    )


def _pem(entry: Mapping[str, Any], name: str, where: str) -> bytes | None:
    """The PEM bytes of `name`-data (base64) or of the file `name`."""
    data = entry.get(f"{name}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except binascii.Error as err:
            raise KubeconfigError(f"{where}: {name}-data is not valid base64") from err
    path = entry.get(name)
    if path:
        try:
            return Path(str(path)).read_bytes()
        except OSError as err:
            raise KubeconfigError(f"{where}: cannot read {name} {path}: {err.strerror}") from err
    return None


def _client_cert(user: Mapping[str, Any], where: str) -> ClientCert | None:
    cert = _pem(user, "client-certificate", where)
    key = _pem(user, "client-key", where)
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        missing = "client-certificate" if cert is None else "client-key"
        raise KubeconfigError(f"{where}: {missing} is missing (a client certificate needs both)")
    return ClientCert(cert, key)


def _auth(
    user: Mapping[str, Any],
    where: str,
    token_reload_s: float,
    extensions: Mapping[str, Any],
) -> Auth:
    if user.get("auth-provider"):
        provider = (user["auth-provider"] or {}).get("name", "?")
        raise KubeconfigError(
            f"{where}: auth-provider {provider!r} is not supported; "
            "use its exec credential plugin (e.g. gke-gcloud-auth-plugin, kubelogin)"
        )
    token, token_file = user.get("token"), user.get("tokenFile")
    if (token or token_file) and user.get("username"):
        raise KubeconfigError(f"{where}: username/password or a token may be set, not both")
    # As client-go: the file's content, re-read as it rotates, wins over `token`;
    # a token, when given, wins over an exec plugin.
    if token_file:
        return TokenFile(Path(str(token_file)), token_reload_s)
    if token:
        return Token(str(token))
    if isinstance(user.get("exec"), dict):
        return _exec(user["exec"], where, extensions)
    if user.get("username"):
        return Basic(str(user["username"]), str(user.get("password") or ""))
    return None


def _exec(spec: Mapping[str, Any], where: str, extensions: Mapping[str, Any]) -> Exec:
    api_version = str(spec.get("apiVersion") or "")
    if api_version not in EXEC_API_VERSIONS:
        raise KubeconfigError(
            f"{where}: exec apiVersion {api_version!r} is not supported "
            f"(supported: {', '.join(EXEC_API_VERSIONS)})"
        )
    command = str(spec.get("command") or "")
    if not command:
        raise KubeconfigError(f"{where}: exec has no command")
    if spec.get("interactiveMode") == "Always":
        raise KubeconfigError(
            f"{where}: exec plugin {command!r} requires an interactive terminal "
            "(interactiveMode: Always); gpuheal runs it without one"
        )
    # As kubectl: a relative command with a directory part is relative to the kubeconfig.
    if os.sep in command and not Path(command).is_absolute():
        command = os.path.normpath(Path(spec["_base"]) / command)
    env = tuple(
        (str(e.get("name")), str(e.get("value") or ""))
        for e in spec.get("env") or ()
        if isinstance(e, dict) and e.get("name")
    )
    return Exec(
        api_version=api_version,
        command=command,
        args=tuple(str(a) for a in spec.get("args") or ()),
        env=env,
        install_hint=str(spec.get("installHint") or ""),
        provide_cluster_info=bool(spec.get("provideClusterInfo")),
        cluster_config=extensions.get("client.authentication.k8s.io/exec"),
    )


def in_cluster_possible(env: Mapping[str, str], service_account_dir: Path) -> bool:
    """client-go's test: the service's address in the environment and a mounted token."""
    return bool(
        env.get("KUBERNETES_SERVICE_HOST")
        and env.get("KUBERNETES_SERVICE_PORT")
        and (service_account_dir / "token").is_file()
    )


def in_cluster(
    env: Mapping[str, str],
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    token_reload_s: float = TOKEN_RELOAD_S,
) -> RestConfig:
    """The pod's service account: the token is re-read as the kubelet rotates it."""
    host, port = env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    ca = service_account_dir / "ca.crt"
    namespace = service_account_dir / "namespace"
    return RestConfig(
        server=f"https://{host}:{port}",
        source=IN_CLUSTER,
        ca_pem=ca.read_bytes() if ca.is_file() else None,
        auth=TokenFile(service_account_dir / "token", token_reload_s),
        namespace=namespace.read_text().strip() if namespace.is_file() else "default",
    )
