"""Run the real kured (github.com/kubereboot/kured v1.13.1, built by testenv/kured)
for one fake node, confined so that it cannot reboot, signal or enter anything of
the machine the tests run on.

kured is made to reboot the machine it runs on. What v1.13.1 does (cmd/kured/main.go):

- every command it runs, the sentinel check (`test -f <--reboot-sentinel>`) and the
  reboot (`--reboot-command`, `/bin/systemctl reboot` by default), goes through
  `buildHostCommand(1, ...)`: `/usr/bin/nsenter -m/proc/1/ns/mnt -- <command>`, into
  the mount namespace of whatever `/proc/1` is (in its pod, with hostPID, the host's
  init). v1.13.1 has no other reboot method: no `--reboot-method`, no signal to PID 1
  (later versions added `--reboot-method=signal`; this one cannot be asked for it);
- it talks to the API server only through `rest.InClusterConfig()`: the
  service-account files under /var/run/secrets/kubernetes.io/serviceaccount and
  $KUBERNETES_SERVICE_HOST/_PORT;
- it takes every flag also from a `KURED_<FLAG>` variable when the flag is not
  given (viper), the node from $KURED_NODE_ID.

So here it runs only under `unshare --pid --fork --kill-child --mount --propagation
private --mount-proc`: its own PID namespace, whose PID 1 is the jail script and
then kured itself (the script execs it), with a procfs of that namespace mounted on
/proc in its own mount namespace. `/proc/1/ns/mnt` there is that PID 1's mount
namespace, the private one kured already runs in: nsenter enters nothing of the
machine's. The jail script checks exactly that before it starts kured (it is PID 1;
`/proc/1`'s mount and PID namespaces are its own, and not the test's) and refuses
otherwise; `confinement_problem` checks that the machine can do it at all. A
machine that cannot fails the test with the reason: kured never runs unconfined.
Its reboot command is the test's harmless script, which only appends a line to a
file (`KuredProcess.reboots`, with the namespaces it ran in, which the test checks
are not its own); the test then "reboots" the node itself (`power_off`, the agent's
`reboot`). Its environment is emptied (`env -i`) but for the node and the API
server, so no `KURED_*` variable of the caller's changes a flag. The
service-account files are copied onto a tmpfs mounted over /run (/var/run) inside
the private mount namespace only; its source name is unique, so the test can check
it never shows in its own mount table.

kured v1.13.1 serves /metrics on :8080, a port it does not let be changed: one kured
at a time, and the port must be free (`confinement_problem` says when it is not).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client, codecs
from lightkube.models.authentication_v1 import TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ServiceAccount

from gpuheal import values
from gpuheal.sim.binaries import KuredBuild, default_kured
from gpuheal.sim.process import Component

UNSHARE_FLAGS = (
    "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private", "--mount-proc",
)  # fmt: skip
NSENTER = Path("/usr/bin/nsenter")  # the path kured v1.13.1 runs its commands through
METRICS_PORT = 8080  # kured v1.13.1's /metrics, fixed
LOCK_ANNOTATION = "weave.works/kured-node-lock"  # its default --lock-annotation
DS_NAME = "kured"  # its default --ds-name, and the name its RBAC's Role allows to update
SERVICE_ACCOUNT = "kured"  # the ServiceAccount of its manifests

# What each jail script (this one, and sim/hostsystemd.py's) checks before it starts
# what it confines, once it has defined refuse() and read $test_mnt and $test_pid: it
# is PID 1 of a PID namespace of its own, in a mount namespace that is not the test's;
# it leaves $mnt and $pid set to its own, for the rest of the script.
CONFINEMENT_CHECK = r"""# confined as it must be? (gpuheal/sim/kured.py's CONFINEMENT_CHECK)
[ "$$" = 1 ] || refuse "this shell is PID $$, not PID 1 of a PID namespace of its own"
mnt=$(readlink /proc/self/ns/mnt)
pid=$(readlink /proc/self/ns/pid)
[ "$mnt" != "$test_mnt" ] || refuse "it runs in the test's own mount namespace ($mnt)"
[ "$pid" != "$test_pid" ] || refuse "it runs in the test's own PID namespace ($pid)"
# What it starts runs its commands through nsenter -m/proc/1/ns/mnt: /proc must be this
# PID namespace's, its 1 this shell (what it starts, once exec'd), in this mount namespace.
[ "$(readlink /proc/1/ns/pid)" = "$pid" ] || refuse "/proc/1 is not this PID namespace's init"
[ "$(readlink /proc/1/ns/mnt)" = "$mnt" ] || refuse "/proc/1 is not in this mount namespace"
"""

# PID 1 of kured's PID namespace, in its own mount namespace; execs kured.
JAIL = (
    r"""#!/bin/sh
# PID 1 of kured's own PID namespace, in its own mount namespace (gpuheal/sim/kured.py
# starts it under unshare). Refuses to start kured unless it is confined so; then puts
# the service-account files on a tmpfs and execs kured, which becomes PID 1.
# usage: jail.sh TEST_MNT_NS TEST_PID_NS SA_DIR TMPFS_SOURCE WORKDIR KURED [ARGS...]
set -eu
test_mnt=$1 test_pid=$2 sa=$3 source=$4 workdir=$5
shift 5
refuse() { echo "kured jail: refusing to start kured: $*" >&2; exit 70; }
"""
    + CONFINEMENT_CHECK
    + r"""run=$(readlink -f /var/run)
mount -t tmpfs -o size=1m,mode=0755 "$source" "$run"
grep -qF " - tmpfs $source " /proc/self/mountinfo || refuse "no tmpfs $source on $run"
dir=/var/run/secrets/kubernetes.io/serviceaccount
mkdir -p "$dir"
cp "$sa/token" "$sa/ca.crt" "$sa/namespace" "$dir/"
chmod 0400 "$dir/token"
[ -d "$workdir" ] || refuse "$workdir is hidden under the tmpfs on $run"
echo "kured jail: PID 1 of $pid in $mnt (the test: $test_pid, $test_mnt);" \
  "service-account files on tmpfs $source at $dir" >&2
exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin KURED_NODE_ID="$KURED_NODE_ID" \
  KUBERNETES_SERVICE_HOST="$KUBERNETES_SERVICE_HOST" \
  KUBERNETES_SERVICE_PORT="$KUBERNETES_SERVICE_PORT" "$@"
"""
)

# kured's --reboot-command here: no reboot, one line saying kured asked, and from where.
_REBOOT = """#!/bin/sh
# kured's --reboot-command in the tests (gpuheal/sim/kured.py): reboots nothing. It
# appends one line (when, and the mount and PID namespaces it ran in) to the file the
# test reads; the test then reboots the fake node itself.
echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $(readlink /proc/self/ns/mnt) $(readlink /proc/self/ns/pid)" \
  >> {reboots}
"""


class ConfinementError(RuntimeError):
    """kured cannot be confined on this machine: it is not started at all."""


def own_namespaces() -> tuple[str, str]:
    """This process's mount and PID namespaces, as /proc names them (mnt:[N], pid:[N])."""
    ns = Path("/proc/self/ns")
    return str((ns / "mnt").readlink()), str((ns / "pid").readlink())


def confinement_problem() -> str | None:
    """Why kured cannot run confined on this machine, or None when it can."""
    if os.geteuid() != 0:
        return (
            "kured runs only in PID and mount namespaces of its own, which takes root "
            f"(unshare --pid --mount); this process runs as uid {os.geteuid()}"
        )
    unshare = shutil.which("unshare")
    if unshare is None:
        return "no unshare (util-linux) on PATH: kured runs only in namespaces of its own"
    if not NSENTER.is_file():
        return f"kured v1.13.1 runs its commands through {NSENTER}, which is missing"
    return namespaces_problem(unshare) or _port_problem()


def namespaces_problem(unshare: str) -> str | None:
    """Whether unshare gives a PID namespace whose /proc/1 is its own init, in a mount
    namespace of its own (what the jail script checks again before kured starts)."""
    flags = " ".join(UNSHARE_FLAGS)
    probe = 'echo "$$ $(readlink /proc/1/ns/mnt) $(readlink /proc/1/ns/pid)"'
    try:
        done = subprocess.run(
            [unshare, *UNSHARE_FLAGS, "--", "/bin/sh", "-c", probe],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unshare {flags} did not run: {err}"
    if done.returncode != 0:
        return f"unshare {flags} failed: {done.stderr.strip()[:300]}"
    mnt, pid = own_namespaces()
    said = done.stdout.split()
    if len(said) != 3 or said[0] != "1" or said[1] == mnt or said[2] == pid:
        return (
            f"unshare {flags} did not give a PID namespace whose /proc/1 is its own "
            f"init in a mount namespace of its own: {done.stdout.strip()!r}"
        )
    return None


def _port_problem() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's listeners
        try:
            sock.bind(("0.0.0.0", METRICS_PORT))  # noqa: S104 -- kured's own bind
        except OSError as err:
            return f"kured v1.13.1 serves /metrics on :{METRICS_PORT}, fixed; it is taken: {err}"
    return None


def manifests(
    namespace: str, node_selector: Mapping[str, str], build: KuredBuild | None = None
) -> list[dict[str, Any]]:
    """kured's own manifests (kured-rbac.yaml, kured-ds.yaml, as released) moved from
    kube-system to `namespace`: its ServiceAccount, its RBAC (the cluster-scoped
    ClusterRole and binding named after the namespace, so tests do not share them) and
    the DaemonSet its lock lives on, whose pods (kwok's) run on `node_selector`'s
    nodes only."""
    build = (build or default_kured()).require()
    cluster_name = f"kured-{namespace}"
    docs = [
        doc
        for path in (build.rbac, build.daemonset)
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    for doc in docs:
        meta = doc["metadata"]
        if doc["kind"].startswith("Cluster"):
            meta["name"] = cluster_name
        else:
            meta["namespace"] = namespace
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] = cluster_name
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
        if doc["kind"] == "DaemonSet":
            if meta["name"] != DS_NAME:  # its Role may update only this one
                raise ValueError(f"kured's DaemonSet is {meta['name']}, not {DS_NAME}")
            doc["spec"]["template"]["spec"]["nodeSelector"] = dict(node_selector)
    return docs


@contextlib.contextmanager
def installed(
    kube: Client,
    namespace: str,
    node_selector: Mapping[str, str],
    build: KuredBuild | None = None,
) -> Iterator[str]:
    """kured's manifests (`manifests`) applied in `namespace`; yields a token that
    TokenRequest issued for its ServiceAccount. The cluster-scoped objects are deleted
    after; the rest goes with the namespace."""
    docs = manifests(namespace, node_selector, build)
    created: list[Any] = []
    try:
        for doc in docs:
            created.append(kube.create(codecs.from_dict(doc)))
        spec = TokenRequestSpec(audiences=[], expirationSeconds=3600)
        issued = kube.create(
            ServiceAccount.Token(metadata=ObjectMeta(), spec=spec),
            SERVICE_ACCOUNT,
            namespace=namespace,
        )
        if issued.status is None or not issued.status.token:
            raise RuntimeError(f"TokenRequest for {namespace}/{SERVICE_ACCOUNT}: no token")
        yield str(issued.status.token)
    finally:
        for obj in created:
            if obj.kind.startswith("Cluster"):
                with contextlib.suppress(Exception):
                    kube.delete(type(obj), obj.metadata.name)


@dataclass(frozen=True)
class Reboot:
    """One run of kured's reboot command: when, and the namespaces it ran in."""

    time: str
    mnt: str
    pid: str


class KuredProcess:
    """kured for one node: `start` (confined, or not at all), `power_off` (the node
    goes down: kured is SIGKILLed with its namespace), `reboots`, `log`."""

    def __init__(
        self,
        workdir: Path,
        *,
        node: str,
        namespace: str,
        server: str,
        ca_cert: Path,
        token: str,
        sentinel: Path,
        period_s: int = 1,
        drain_timeout_s: int = 60,
        build: KuredBuild | None = None,
    ) -> None:
        """`namespace`: where its DaemonSet (the lock) and ServiceAccount are; `token`:
        that ServiceAccount's; `sentinel`: the file it reboots for (--reboot-sentinel)."""
        self.build = (build or default_kured()).require()
        self.node = node
        self.period_s = period_s
        self.dir = workdir / f"kured-{values.label_value(node)}"
        self.dir.mkdir(parents=True, exist_ok=True)
        sa = self.dir / "serviceaccount"
        sa.mkdir(mode=0o700, exist_ok=True)
        (sa / "token").write_text(token)
        (sa / "token").chmod(0o600)
        (sa / "ca.crt").write_bytes(ca_cert.read_bytes())
        (sa / "namespace").write_text(namespace)
        self.reboots_path = self.dir / "reboots"
        self.reboot_command = self.dir / "reboot.sh"
        self.reboot_command.write_text(_REBOOT.format(reboots=shlex.quote(str(self.reboots_path))))
        self.reboot_command.chmod(0o755)
        jail = self.dir / "jail.sh"
        jail.write_text(JAIL)
        jail.chmod(0o755)
        # Its source names this tmpfs in mount tables: the test's must never show it.
        self.tmpfs_source = f"gpuheal-kured-{uuid.uuid4().hex[:12]}"
        api = urllib.parse.urlsplit(server)
        if api.hostname is None or api.port is None:
            raise ValueError(f"not an https://HOST:PORT address: {server}")
        self.environment = {
            "KURED_NODE_ID": node,
            "KUBERNETES_SERVICE_HOST": api.hostname,
            "KUBERNETES_SERVICE_PORT": str(api.port),
        }
        self.kured_args = [
            str(self.build.binary),
            f"--ds-namespace={namespace}",
            f"--ds-name={DS_NAME}",
            f"--period={period_s}s",
            f"--reboot-sentinel={sentinel}",
            f"--reboot-command={shlex.quote(str(self.reboot_command))}",
            f"--drain-timeout={drain_timeout_s}s",
            "--log-format=text",
        ]
        self.log_path = self.dir / "kured.log"
        self._component: Component | None = None
        self._jail_pid: int | None = None
        self._log_offset = 0

    def start(self, timeout_s: float = 30) -> KuredProcess:
        """Start kured in its namespaces; wait until it has read its flags. Raises
        ConfinementError (and starts nothing) where it cannot be confined."""
        problem = confinement_problem()
        if problem is not None:
            raise ConfinementError(problem)
        unshare = shutil.which("unshare") or "unshare"  # confinement_problem found it
        mnt, pid = own_namespaces()
        argv = [
            unshare, *UNSHARE_FLAGS, "--", "/bin/sh", str(self.dir / "jail.sh"),
            mnt, pid, str(self.dir / "serviceaccount"), self.tmpfs_source, str(self.dir),
            *self.kured_args,
        ]  # fmt: skip
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._component = Component(
            f"kured-{values.label_value(self.node)}", argv, self.log_path, self.environment
        )
        self._component.start()
        # Its flags read and printed, the loops about to start ("Reboot check command:").
        self._component.wait_ready(
            lambda: "Reboot check command:" in self.log_since_start(),
            time.monotonic() + timeout_s,
        )
        self._jail_pid = self._child_of(self._component.pid)
        return self

    @staticmethod
    def _child_of(pid: int | None) -> int | None:
        """The jail's PID as this machine sees it: unshare's one child."""
        if pid is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            return int(children[0]) if children else None
        return None

    def power_off(self, timeout_s: float = 10) -> None:
        """The node goes down: SIGKILL unshare and the jail (one process group, our
        child's), and with its PID 1 the whole namespace; wait until it is gone."""
        component, self._component = self._component, None
        if component is None:
            return
        component.signal(signal.SIGKILL)
        component.wait_stopped(timeout_s)
        deadline = time.monotonic() + timeout_s
        while self._jail_pid is not None and _alive(self._jail_pid):
            if time.monotonic() >= deadline:
                raise RuntimeError(f"kured's namespace (pid {self._jail_pid}) outlived its kill")
            time.sleep(0.05)
        self._jail_pid = None

    stop = power_off

    def running(self) -> bool:
        return self._component is not None and self._component.exit_code() is None

    def reboots(self) -> list[Reboot]:
        """Every run of the reboot command, oldest first."""
        if not self.reboots_path.exists():
            return []
        lines = self.reboots_path.read_text().splitlines()
        return [Reboot(*line.split()) for line in lines if len(line.split()) == 3]

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_since_start(self) -> str:
        """The log of the last start only."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
