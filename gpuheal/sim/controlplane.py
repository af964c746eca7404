"""A real local Kubernetes control plane: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and kwok, as child processes on free loopback ports.

Used by the tests, the benchmarks and the demo. Nothing here is a fake: the
processes are the upstream binaries built by testenv/build.sh.

    with ControlPlane() as cp:
        client = cp.client()
        ...
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import signal
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from lightkube import Client

from gpuheal.sim.binaries import Binaries, default_binaries
from gpuheal.sim.client import sync_client
from gpuheal.sim.kubeconfig import write_kubeconfig
from gpuheal.sim.pki import CertPair, Pki, create_pki, issue_client_cert
from gpuheal.sim.process import (
    Component,
    ControlPlaneError,
    free_port,
    http_json,
    http_ok,
    stop_all,
)
from gpuheal.sim.stages import write_stages

log = logging.getLogger(__name__)

# Annotation that hands a Node to kwok; nodes without it are left alone.
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_VALUE = "fake"

ETCD = "etcd"
KUBE_APISERVER = "kube-apiserver"
KUBE_SCHEDULER = "kube-scheduler"
KUBE_CONTROLLER_MANAGER = "kube-controller-manager"
DEVICE_TAINT_RULES_GATE = "DRADeviceTaintRules"
DEVICE_TAINT_RULES_API = "resource.k8s.io/v1beta2"
KWOK = "kwok"

ADMIN = "gpuheal-admin"


@dataclass(frozen=True)
class Identity:
    """A user of the static token file. Groups decide what RBAC gives it."""

    user: str
    groups: tuple[str, ...] = ()


# One identity per upstream component and per gpuheal component, so tests can
# bind exactly the RBAC a component gets in production and prove it suffices.
# gpuheal's own identities get nothing by default: a test binds what it needs.
IDENTITIES: tuple[Identity, ...] = (
    Identity(ADMIN, ("system:masters",)),
    Identity("system:kube-controller-manager"),
    Identity("system:kube-scheduler"),
    Identity("kwok-controller", ("system:masters",)),
    Identity("gpuheal-controller"),
    Identity("gpuheal-agent"),
    Identity("gpuheal-operator"),
    # node-problem-detector (gpuheal.sim.npd): what a test binds the built-in
    # system:node-problem-detector ClusterRole to.
    Identity("node-problem-detector"),
)


@dataclass(frozen=True)
class ControlPlaneConfig:
    """What to run. The apiserver and etcd always run; the rest is per test."""

    scheduler: bool = True
    controller_manager: bool = True
    kwok: bool = True
    feature_gates: Mapping[str, bool] = field(
        default_factory=lambda: {"ResourceHealthStatus": True}
    )
    # DeviceTaintRule (KEP-5055), as Kubernetes 1.36 offers it: beta but off, so the
    # gate on every component and its API (resource.k8s.io/v1beta2) in the API
    # server's runtime-config. Off: device taints in ResourceSlices only (beta, on).
    device_taint_rules: bool = False
    # Extra command-line flags per component name, appended last so they win.
    extra_args: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # Users whose requests the apiserver writes to its audit log (JSON lines, Metadata
    # level): who did what to which object, from the server's side. Empty: no log.
    audit_users: Sequence[str] = ()
    start_timeout_s: float = 90.0
    stop_grace_s: float = 10.0
    workdir: Path | None = None
    keep_workdir: bool = False
    binaries: Binaries = field(default_factory=default_binaries)


class ControlPlane:
    """Start, hold and stop one local control plane."""

    def __init__(self, config: ControlPlaneConfig | None = None) -> None:
        self.config = config or ControlPlaneConfig()
        self._own_workdir = self.config.workdir is None
        self.workdir = self.config.workdir or Path(tempfile.mkdtemp(prefix="gpuheal-sim-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tokens = {i.user: secrets.token_urlsafe(32) for i in IDENTITIES}
        self.components: dict[str, Component] = {}
        self.api_port = 0
        self.etcd_url = ""
        self._pki: Pki | None = None
        self._kubeconfigs: dict[str, Path] = {}
        self.started_in_s: float | None = None

    # -- public surface -------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca_cert(self) -> Path:
        return self._require_pki().ca.cert

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (system:masters)."""
        return self.kubeconfig_for(ADMIN)

    def kubeconfig_for(self, user: str) -> Path:
        """A kubeconfig authenticating as one of IDENTITIES."""
        if user not in self._kubeconfigs:
            if user not in self.tokens:
                known = ", ".join(sorted(self.tokens))
                raise KeyError(f"unknown identity {user!r}; known: {known}")
            safe = user.replace(":", "_")
            self._kubeconfigs[user] = write_kubeconfig(
                self.workdir / f"kubeconfig-{safe}.yaml",
                server=self.server,
                ca_cert=self.ca_cert,
                user=user,
                token=self.tokens[user],
            )
        return self._kubeconfigs[user]

    def client_certificate(self, user: str, groups: tuple[str, ...] = ()) -> CertPair:
        """A client certificate (PEM files) the API server authenticates as `user`."""
        return issue_client_cert(self._require_pki(), self.workdir / "clients", user, groups)

    def client(self, user: str = ADMIN) -> Client:
        return sync_client(self.kubeconfig_for(user))

    @property
    def version(self) -> str:
        """The API server's Kubernetes version as /version says it ("v1.36.3")."""
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        found = http_json(f"{self.server}/version", ssl_context=ctx, token=self.tokens[ADMIN])
        return str(found["gitVersion"])

    @property
    def pids(self) -> dict[str, int]:
        return {name: c.pid for name, c in self.components.items() if c.pid is not None}

    def log_path(self, component: str) -> Path:
        return self.workdir / f"{component}.log"

    @property
    def audit_log(self) -> Path:
        """The apiserver's audit log (see ControlPlaneConfig.audit_users)."""
        return self.workdir / "audit.jsonl"

    def stop_apiserver(self) -> None:
        """An API outage: kube-apiserver stops; etcd and everything else keep running."""
        stop_all([self.components[KUBE_APISERVER]], self.config.stop_grace_s)

    def start_apiserver(self) -> None:
        """Start it again on the same port and flags: etcd kept the data, so clients
        see the end of an outage, not a new cluster."""
        apiserver = self.components[KUBE_APISERVER]
        apiserver.start()
        apiserver.wait_ready(self._apiserver_ready, time.monotonic() + self.config.start_timeout_s)

    def stall_apiserver(self, stalled_s: float) -> None:
        """A slow API server, not a dead one: SIGSTOP, then SIGCONT after `stalled_s`.
        Connections stay open and requests hang instead of failing fast, as under
        an overloaded apiserver or etcd."""
        apiserver = self.components[KUBE_APISERVER]
        apiserver.signal(signal.SIGSTOP)
        try:
            time.sleep(stalled_s)
        finally:
            apiserver.signal(signal.SIGCONT)

    def restart_apiserver(self, down_s: float = 0.0) -> None:
        self.stop_apiserver()
        time.sleep(down_s)
        self.start_apiserver()

    def start(self) -> Self:
        started = time.monotonic()
        deadline = started + self.config.start_timeout_s
        try:
            self._pki = create_pki(self.workdir / "pki")
            self._start_etcd(deadline)
            self._start_apiserver(deadline)
            waiting: list[tuple[Component, Callable[[], bool]]] = []
            if self.config.controller_manager:
                waiting.append(self._launch_kube_component(KUBE_CONTROLLER_MANAGER))
            if self.config.scheduler:
                waiting.append(self._launch_kube_component(KUBE_SCHEDULER))
            if self.config.kwok:
                waiting.append(self._launch_kwok())
            for component, probe in waiting:
                component.wait_ready(probe, deadline)
        except BaseException:
            # Keep the workdir: the error names log files inside it.
            self._stop_processes()
            raise
        self.started_in_s = time.monotonic() - started
        log.info(
            "control plane ready",
            extra={"server": self.server, "seconds": round(self.started_in_s, 2)},
        )
        return self

    def stop(self) -> None:
        self._stop_processes()
        if self._own_workdir and not self.config.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- components -----------------------------------------------------

    def _require_pki(self) -> Pki:
        if self._pki is None:
            raise ControlPlaneError("control plane not started")
        return self._pki

    def _flags(self, name: str, base: Sequence[str]) -> list[str]:
        return [*base, *self.config.extra_args.get(name, ())]

    def _feature_gates(self) -> list[str]:
        chosen = dict(self.config.feature_gates)
        if self.config.device_taint_rules:
            chosen[DEVICE_TAINT_RULES_GATE] = True
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in chosen.items())
        return [f"--feature-gates={gates}"] if gates else []

    def _runtime_config(self) -> list[str]:
        if not self.config.device_taint_rules:
            return []
        return [f"--runtime-config={DEVICE_TAINT_RULES_API}=true"]

    def _launch(self, name: str, argv: Sequence[str]) -> Component:
        component = Component(name, self._flags(name, argv), self.log_path(name))
        self.components[name] = component
        component.start()
        return component

    def _start_etcd(self, deadline: float) -> None:
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        etcd = self._launch(
            ETCD,
            [
                str(self.config.binaries.etcd),
                "--name=gpuheal-sim",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=gpuheal-sim={peer}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        etcd.wait_ready(lambda: http_ok(f"{self.etcd_url}/health"), deadline)

    def _start_apiserver(self, deadline: float) -> None:
        pki = self._require_pki()
        self.api_port = free_port()
        token_file = self.workdir / "tokens.csv"
        token_file.touch(mode=0o600)
        token_file.write_text(
            "".join(
                f'{self.tokens[i.user]},{i.user},{i.user},"{",".join(i.groups)}"\n'
                for i in IDENTITIES
            )
        )
        apiserver = self._launch(
            KUBE_APISERVER,
            [
                str(self.config.binaries.kube_apiserver),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving.cert}",
                f"--tls-private-key-file={pki.serving.key}",
                f"--client-ca-file={pki.ca.cert}",
                f"--token-auth-file={token_file}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.service_account.cert}",
                f"--service-account-signing-key-file={pki.service_account.key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                # The "kubernetes" Service endpoint may not be a loopback address.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                *self._audit_flags(),
                *self._feature_gates(),
                *self._runtime_config(),
            ],
        )
        apiserver.wait_ready(self._apiserver_ready, deadline)

    def _apiserver_ready(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self._require_pki().ca.cert))
        return http_ok(f"{self.server}/readyz", ssl_context=ctx, token=self.tokens[ADMIN])

    def _audit_flags(self) -> list[str]:
        if not self.config.audit_users:
            return []
        policy = self.workdir / "audit-policy.yaml"
        # JSON is YAML: no serializer needed for a three-rule policy.
        policy.write_text(
            json.dumps(
                {
                    "apiVersion": "audit.k8s.io/v1",
                    "kind": "Policy",
                    "omitStages": ["RequestReceived"],
                    "rules": [
                        # Node patches with their bodies: which of a node's keys a
                        # write touched (the disruption guard's, the taint's).
                        {
                            "level": "Request",
                            "users": list(self.config.audit_users),
                            "verbs": ["patch"],
                            "resources": [{"group": "", "resources": ["nodes"]}],
                        },
                        {"level": "Metadata", "users": list(self.config.audit_users)},
                        {"level": "None"},
                    ],
                }
            )
        )
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ]

    def _launch_kube_component(self, name: str) -> tuple[Component, Callable[[], bool]]:
        pki = self._require_pki()
        port = free_port()
        user = f"system:{name}"
        argv = [
            str(
                self.config.binaries.kube_controller_manager
                if name == KUBE_CONTROLLER_MANAGER
                else self.config.binaries.kube_scheduler
            ),
            f"--kubeconfig={self.kubeconfig_for(user)}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={pki.serving.cert}",
            f"--tls-private-key-file={pki.serving.key}",
            # One instance per control plane: no election, no 15 s lease wait.
            "--leader-elect=false",
            *self._feature_gates(),
        ]
        if name == KUBE_CONTROLLER_MANAGER:
            argv += [
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.service_account.key}",
                f"--root-ca-file={pki.ca.cert}",
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
            ]
        component = self._launch(name, argv)
        ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
        return component, lambda: http_ok(f"https://127.0.0.1:{port}/healthz", ssl_context=ctx)

    def _launch_kwok(self) -> tuple[Component, Callable[[], bool]]:
        port = free_port()
        binaries = self.config.binaries
        component = self._launch(
            KWOK,
            [
                str(binaries.kwok),
                f"--kubeconfig={self.kubeconfig_for('kwok-controller')}",
                f"--config={binaries.kwok_stages}",
                # Our validation Jobs' containers (sim/stages.py).
                f"--config={write_stages(self.workdir)}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}={FAKE_NODE_VALUE}",
                "--node-lease-duration-seconds=40",
                # Pod IPs are only written into status (no traffic); room for 40k pods.
                "--cidr=10.128.0.1/16",
                f"--server-address=127.0.0.1:{port}",
            ],
        )
        return component, lambda: http_ok(f"http://127.0.0.1:{port}/healthz")

    def _stop_processes(self) -> None:
        # Clients first, so none of them logs a storm of errors against a dying apiserver.
        order = [KWOK, KUBE_SCHEDULER, KUBE_CONTROLLER_MANAGER, KUBE_APISERVER, ETCD]
        clients = [self.components[n] for n in order[:3] if n in self.components]
        stop_all(clients, self.config.stop_grace_s)
        for name in order[3:]:
            if name in self.components:
                stop_all([self.components[name]], self.config.stop_grace_s)
