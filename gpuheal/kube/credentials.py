"""Credentials at runtime: what each request carries, and renewing it after a 401.

A static token, basic auth or a client certificate never change. A token file
is re-read at most every `reload_s` (the kubelet rotates projected
service-account tokens), and at once after a 401. An exec plugin's
ExecCredential is kept until its expirationTimestamp, and the plugin re-run
after a 401. Renewals are single-flight: many requests refused at once run
the plugin once. Tokens never reach a log line or an error message.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpuheal.kube.kubeconfig import (
    Basic,
    ClientCert,
    Exec,
    KubeconfigError,
    RestConfig,
    Token,
    TokenFile,
)

log = logging.getLogger(__name__)

EXEC_TIMEOUT_S = 60.0


class CredentialError(Exception):
    """No credential to send: the exec plugin failed, the token file is unreadable."""


@dataclass(frozen=True)
class Credential:
    """What one request carries."""

    authorization: str | None = None  # the Authorization header's value
    ssl: ssl.SSLContext | None = None  # a client certificate of its own (exec); None: the base


class Credentials(Protocol):
    async def current(self) -> Credential: ...

    async def renew(self, refused: Credential) -> bool:
        """After a 401 with `refused`: True when there is a different credential to retry with."""
        ...


def tls_context(config: RestConfig, client_cert: ClientCert | None = None) -> ssl.SSLContext:
    """Trust the cluster's CA (or the system's), and present a client certificate."""
    try:
        context = ssl.create_default_context(
            cadata=config.ca_pem.decode("ascii") if config.ca_pem else None
        )
    except (ssl.SSLError, ValueError) as err:
        raise KubeconfigError(
            f"kubeconfig {config.source}: the certificate authority is not a PEM CA: {err}"
        ) from err
    if config.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert = client_cert or config.client_cert
    if cert is not None:
        _load_client_cert(context, cert, config.source)
    return context


def _load_client_cert(context: ssl.SSLContext, cert: ClientCert, source: str) -> None:
    # ssl loads certificates from files only: a private directory, gone at once.
    with tempfile.TemporaryDirectory(prefix="gpuheal-tls-") as directory:
        cert_file, key_file = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        cert_file.write_bytes(cert.cert_pem)
        key_file.touch(mode=0o600)
        key_file.write_bytes(cert.key_pem)
        try:
            context.load_cert_chain(cert_file, key_file)
        except ssl.SSLError as err:
            raise KubeconfigError(
                f"kubeconfig {source}: the client certificate or key cannot be loaded "
                f"({err.reason or err}); both must be PEM and belong together"
            ) from err


class Static:
    """A credential that never changes (token, basic auth, certificate, or none)."""

    def __init__(self, credential: Credential) -> None:
        self._credential = credential

    async def current(self) -> Credential:
        return self._credential

    async def renew(self, refused: Credential) -> bool:
        return False


class FileToken:
    """A bearer token read from a file, re-read at most every `reload_s`, and after a 401."""

    def __init__(
        self, path: Path, reload_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.reload_s = reload_s
        self.clock = clock
        self.reads = 0
        self._credential: Credential | None = None
        self._read_at = 0.0

    async def current(self) -> Credential:
        if self._credential is None or self.clock() - self._read_at >= self.reload_s:
            return self._reload()
        return self._credential

    async def renew(self, refused: Credential) -> bool:
        if self._credential == refused:
            self._reload()
        return self._credential != refused

    def _reload(self) -> Credential:
        self._read_at = self.clock()
        try:
            # A few bytes from a local file: cheaper than a thread hop.
            token = self.path.read_text().strip()
        except OSError as err:
            if self._credential is not None:
                # As client-go: keep the last token; the file may be mid-rotation.
                log.warning(
                    "cannot re-read the token file, keeping the last token",
                    extra={"path": str(self.path), "error": err.strerror},
                )
                return self._credential
            raise CredentialError(f"cannot read token file {self.path}: {err.strerror}") from err
        self.reads += 1
        self._credential = Credential(f"Bearer {token}")
        return self._credential


@dataclass(frozen=True)
class _Issued:
    credential: Credential
    expires: float | None  # epoch seconds; None: until refused


class ExecPlugin:
    """An exec credential plugin, run when there is no valid credential (single-flight)."""

    def __init__(
        self,
        spec: Exec,
        config: RestConfig,
        clock: Callable[[], float] = time.time,
        timeout_s: float = EXEC_TIMEOUT_S,
    ) -> None:
        self.spec = spec
        self.config = config
        self.clock = clock
        self.timeout_s = timeout_s
        self.runs = 0
        self._issued: _Issued | None = None
        self._lock = asyncio.Lock()

    def _valid(self) -> _Issued | None:
        issued = self._issued
        if issued is None or (issued.expires is not None and self.clock() >= issued.expires):
            return None
        return issued

    async def current(self) -> Credential:
        issued = self._valid()
        if issued is None:
            async with self._lock:
                issued = self._valid() or await self._run()
        return issued.credential

    async def renew(self, refused: Credential) -> bool:
        async with self._lock:
            issued = self._issued
            if issued is None or issued.credential == refused:
                issued = await self._run()
        return issued.credential != refused

    async def _run(self) -> _Issued:
        spec = self.spec
        name = Path(spec.command).name
        env = {**os.environ, **dict(spec.env), "KUBERNETES_EXEC_INFO": json.dumps(self._info())}
        self.runs += 1
        try:
            process = await asyncio.create_subprocess_exec(
                spec.command,
                *spec.args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                env=env,  # stderr: ours, as kubectl passes the plugin's through
            )
        except FileNotFoundError as err:
            hint = f" {spec.install_hint.strip()}" if spec.install_hint else ""
            raise CredentialError(
                f"exec credential plugin {spec.command!r} not found (not on $PATH "
                f"or no such file).{hint}"
            ) from err
        except PermissionError as err:
            raise CredentialError(
                f"exec credential plugin {spec.command!r}: not executable"
            ) from err
        try:
            out, _ = await asyncio.wait_for(process.communicate(), self.timeout_s)
        except TimeoutError as err:
            process.kill()
            await process.wait()
            raise CredentialError(
                f"exec credential plugin {name} gave no credential within {self.timeout_s:g} s"
            ) from err
        if process.returncode != 0:
            raise CredentialError(
                f"exec credential plugin {name} failed with exit code {process.returncode}"
            )
        self._issued = self._parse(out, name)
        return self._issued

    def _info(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"interactive": False}
        if self.spec.provide_cluster_info:
            config = self.config
            cluster: dict[str, Any] = {"server": config.server}
            if config.ca_pem:
                cluster["certificate-authority-data"] = base64.b64encode(config.ca_pem).decode()
            if config.insecure:
                cluster["insecure-skip-tls-verify"] = True
            if config.tls_server_name:
                cluster["tls-server-name"] = config.tls_server_name
            if config.proxy_url:
                cluster["proxy-url"] = config.proxy_url
            if self.spec.cluster_config is not None:
                cluster["config"] = self.spec.cluster_config
            spec["cluster"] = cluster
        return {"apiVersion": self.spec.api_version, "kind": "ExecCredential", "spec": spec}

    def _parse(self, out: bytes, name: str) -> _Issued:
        def bad(why: str) -> CredentialError:
            return CredentialError(f"exec credential plugin {name}: {why}")

        try:
            answer = json.loads(out)
        except ValueError as err:
            raise bad("did not print an ExecCredential (not JSON)") from err
        if not isinstance(answer, dict) or answer.get("kind") != "ExecCredential":
            raise bad("did not print an ExecCredential")
        if answer.get("apiVersion") != self.spec.api_version:
            raise bad(
                f"answered apiVersion {answer.get('apiVersion')!r}, "
                f"configured {self.spec.api_version!r}"
            )
        status = answer.get("status")
        if not isinstance(status, dict):
            raise bad("the ExecCredential has no status")
        token = status.get("token") or None
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if bool(cert) != bool(key):
            raise bad("clientCertificateData and clientKeyData come together")
        if not token and not cert:
            raise bad("the ExecCredential holds neither a token nor a client certificate")
        context = None
        if cert and key:
            try:
                context = tls_context(
                    self.config, ClientCert(str(cert).encode(), str(key).encode())
                )
            except KubeconfigError as err:
                raise bad("its client certificate cannot be loaded") from err
        expires = None
        if stamp := status.get("expirationTimestamp"):
            try:
                expires = dt.datetime.fromisoformat(str(stamp)).timestamp()
            except ValueError as err:
                raise bad(f"expirationTimestamp {stamp!r} is not RFC 3339") from err
        authorization = f"Bearer {token}" if token else None
        return _Issued(Credential(authorization, context), expires)


def credentials_for(config: RestConfig) -> Credentials:
    auth = config.auth
    if isinstance(auth, TokenFile):
        return FileToken(auth.path, auth.reload_s)
    if isinstance(auth, Exec):
        return ExecPlugin(auth, config)
    if isinstance(auth, Token):
        return Static(Credential(f"Bearer {auth.token}"))
    if isinstance(auth, Basic):
        pair = base64.b64encode(f"{auth.username}:{auth.password}".encode()).decode()
        return Static(Credential(f"Basic {pair}"))
    return Static(Credential())
