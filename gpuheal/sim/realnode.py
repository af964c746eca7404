"""A real node of the local cluster: the upstream kubelet over Debian's containerd, runc
and CNI plugins, confined to namespaces of its own, beside the kwok nodes.

    with RealNode(control_plane) as node:
        node.name          # Ready, with pods that really run

What runs where. One process tree in new PID, mount and network namespaces
(`unshare --pid --mount --net`): containerd, the kubelet, and every container they
start. The machine is left as it was:
- network: the node's own namespace, with its address on a veth pair of its own and the pod
  bridge (CNI's bridge plugin) inside it; nothing is added to the machine's network.
  The kubelet reaches the API server through a relay: a socket file in the node's
  directory, served outside by a relay to the API server's loopback port, and listened
  for inside on 127.0.0.1:6443 (the kubelet's) and 10.96.0.1:443 (the `kubernetes`
  Service's address, which in-cluster clients dial; no kube-proxy runs).
- files: /var/lib/kubelet, /var/lib/cni, /var/log/pods, /var/log/containers and
  /run/netns are bind mounts of the node's directory inside its mount namespace (the
  kubelet and CNI write there whatever their configuration says); the mount points
  missing on the machine are made at start and removed at stop.
- the kernel: the kubelet sets vm.overcommit_memory, kernel.panic and
  kernel.panic_on_oops on start unless they already hold its values, and those are not
  per namespace: the node runs with protectKernelDefaults and sees files holding its
  values over those /proc/sys entries, so it never writes the machine's.
- cgroups (v1 here): the pods live under a cgroup root of the node's own inside the
  test's memory cgroup, removed at stop.
Stopping kills the namespace's first process, which ends every process in it; the
mounts go with the mount namespace.

The machine's requirements (root, cgroup v1 or v2, unshare, iproute2, socat,
containerd, runc, CNI plugins) are checked first and named when missing: `make node`
installs them, testenv/node/build.sh builds the kubelet and the images.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.core_v1 import Node
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from gpuheal.sim.binaries import NodeBuild, default_node_build
from gpuheal.sim.controlplane import ControlPlane
from gpuheal.sim.kubeconfig import write_cert_kubeconfig
from gpuheal.sim.nodecgroup import CgroupRoot
from gpuheal.sim.process import Component, ControlPlaneError, log_tail

log = logging.getLogger(__name__)

SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service: the first address of the API server's range
POD_SUBNET = "10.88.0.0/24"
# What the kubelet's container manager would write (pkg/kubelet/cm: setupKernelTunables).
KERNEL_DEFAULTS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
# Paths the kubelet, CNI and containerd write whatever they are told: bound per node.
# /var/lib/gpuheal is the agent's state (its hostPath), /etc/containerd the runtime's
# configuration the agent reads (the node's own, not the machine's).
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/run/netns",
    "/var/lib/gpuheal",
    "/etc/containerd",
)
DEBIAN_TOOLS = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "socat": "socat",
    "unshare": "util-linux",
    "ip": "iproute2",
    "nsenter": "util-linux",
}
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins


class RealNodeError(ControlPlaneError):
    """The node could not start, or this machine cannot run one (the message says why)."""


@dataclass(frozen=True)
class RealNodeConfig:
    """One real node. The name is EKS's, as real fleets have them; its address is the
    one the name spells, on the node's own network."""

    name: str = "ip-172-31-88-10.us-west-2.compute.internal"
    address: str = "172.31.88.10"
    labels: dict[str, str] = field(default_factory=dict)
    # Only the pods that tolerate it land here (the tests' DaemonSets stay off it).
    taints: tuple[str, ...] = ("gpuheal.test/real-node=true:NoSchedule",)
    feature_gates: dict[str, bool] = field(default_factory=lambda: {"ResourceHealthStatus": True})
    max_pods: int = 16
    # OCI archives imported besides the build's own (the chart's image).
    extra_images: tuple[Path, ...] = ()
    start_timeout_s: float = 90.0
    build: NodeBuild = field(default_factory=default_node_build)


def missing_requirements(config: RealNodeConfig) -> list[str]:
    """What this machine lacks to run a real node, each with what provides it."""
    build = config.build
    missing = [
        f"{tool} (Debian's {package}; `make node`)"
        for tool, package in DEBIAN_TOOLS.items()
        if shutil.which(tool) is None
    ]
    if not (CNI_BIN_DIR / "bridge").is_file():
        missing.append(f"{CNI_BIN_DIR}/bridge (Debian's containernetworking-plugins; `make node`)")
    missing.extend(build.missing())
    missing.extend(
        f"{p} (`make image`: deploy/docker/build.sh)"
        for p in config.extra_images
        if not p.is_file()
    )
    if os.geteuid() != 0:
        missing.append("root (namespaces, mounts and cgroups of its own)")
    return missing


class RealNode:
    """Start, hold and stop one real node of a local control plane."""

    def __init__(self, control_plane: ControlPlane, config: RealNodeConfig | None = None) -> None:
        self.control_plane = control_plane
        self.config = config or RealNodeConfig()
        self.name = self.config.name
        # Short (socket paths must fit in 108 bytes), and made at start, not here: a node
        # never started leaves nothing.
        self.workdir = Path(tempfile.gettempdir()) / f"gpuheal-node-{secrets.token_hex(4)}"
        self.cgroup = CgroupRoot.beside_this_process(self.workdir.name)
        self._made: list[Path] = []
        self._relay: Component | None = None
        self._node: Component | None = None
        self._registered_once = False

    # -- public surface -------------------------------------------------

    @property
    def first_pid(self) -> int | None:
        """The node's first process as the machine sees it: `unshare`'s child, PID 1 of
        the node's PID namespace (None before start)."""
        if self._node is None or self._node.pid is None:
            return None
        children = Path(f"/proc/{self._node.pid}/task/{self._node.pid}/children")
        found = children.read_text().split() if children.exists() else []
        return int(found[0]) if found else None

    @property
    def pid_namespace(self) -> int | None:
        """The inode of the node's PID namespace (None when it is not running)."""
        pid = self.first_pid
        try:
            return Path(f"/proc/{pid}/ns/pid").stat().st_ino if pid else None
        except OSError:
            return None

    def in_network(self, argv: list[str]) -> list[str]:
        """`argv` run in the node's network namespace (and only that): where its pods'
        addresses answer, for a scraper or a probe started from the machine."""
        pid = self.first_pid
        if pid is None:
            raise RealNodeError(f"real node {self.name} is not running")
        return [shutil.which("nsenter") or "nsenter", f"--net=/proc/{pid}/ns/net", *argv]

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "run" / "containerd.sock"

    def host_path(self, path: str) -> Path:
        """Where the node's `path` (one of HOST_PATHS) lies as seen from the machine."""
        return self.workdir / "host" / path.strip("/").replace("/", "_")

    def pod_logs(self, namespace: str, pod: str) -> str:
        """Every container log of the pods whose names start with `pod`, as the kubelet
        keeps them (/var/log/pods)."""
        root = self.host_path("/var/log/pods")
        texts = [
            f.read_text(errors="replace") for f in sorted(root.glob(f"{namespace}_{pod}*/*/*.log"))
        ]
        return "".join(texts)

    def log_path(self, component: str) -> Path:
        """The node's logs: `kubelet`, `containerd`, `node` (its first process)."""
        return self.workdir / f"{component}.log"

    def start(self) -> Self:
        missing = missing_requirements(self.config)
        if missing:
            raise RealNodeError(
                "this machine cannot run a real node; missing: " + "; ".join(missing)
            )
        try:
            self._prepare()
            self._start_relay()
            self._start_node()
        except BaseException as err:
            report = self.failure_report()
            self.stop()
            if isinstance(err, Exception):
                raise RealNodeError(f"{err}\n{report}") from err
            raise
        return self

    def stop(self) -> None:
        """Kill the node's namespace, then remove what it left: its mount points, its
        cgroups and its directory."""
        namespace = self.pid_namespace
        if self._node is not None:
            self._node.signal(signal.SIGKILL)
            self._node.wait_stopped(10)
        if namespace is not None:
            _wait_empty(namespace, timeout_s=15)
        if self._relay is not None:
            self._relay.signal(signal.SIGKILL)
            self._relay.wait_stopped(5)
        if self._registered_once:
            _forget_node(self.control_plane, self.name)
        self.cgroup.remove()
        for path in reversed(self._made):
            try:
                path.rmdir()
            except OSError as err:
                log.warning("real node %s: could not remove %s: %s", self.name, path, err)
        self._made.clear()
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

    # -- start-up ----------------------------------------------------------

    def _prepare(self) -> None:
        self.workdir.mkdir(mode=0o700)
        for path in HOST_PATHS:
            self.host_path(path).mkdir(parents=True, exist_ok=True)
            self._made.extend(_make_missing(Path(path)))
        (self.workdir / "run").mkdir()
        runtime = self.workdir / "bin" / "nvidia-container-runtime"
        runtime.parent.mkdir()
        runc = shutil.which("runc") or "runc"
        runtime.write_text(f'#!/bin/sh\n# runc by the NVIDIA runtime\'s name\nexec {runc} "$@"\n')
        runtime.chmod(0o755)
        (self.workdir / "cni").mkdir()
        sysctl = self.workdir / "sysctl"
        sysctl.mkdir()
        for key, value in KERNEL_DEFAULTS.items():
            (sysctl / key.replace("/", "_")).write_text(value + "\n")
        self.cgroup.create()
        self._write_credentials()
        self._write_configs()

    def _write_credentials(self) -> None:
        cp = self.control_plane
        user = f"system:node:{self.name}"
        cert = cp.client_certificate(user, ("system:nodes",))
        write_cert_kubeconfig(
            self.workdir / "kubelet.kubeconfig",
            server="https://127.0.0.1:6443",
            ca_cert=cp.ca_cert,
            user=user,
            cert=cert.cert,
            key=cert.key,
        )
        shutil.copy(cp.ca_cert, self.workdir / "ca.crt")
        _bind_node_role(cp, user, self.name)

    def _write_configs(self) -> None:
        containerd = containerd_config(self.workdir, self.config.build.pause_image)
        (self.workdir / "containerd.toml").write_text(containerd)
        (self.host_path("/etc/containerd") / "config.toml").write_text(containerd)
        (self.workdir / "registries" / "_default").mkdir(parents=True)
        (self.workdir / "registries" / "_default" / "hosts.toml").write_text(registries_config())
        (self.workdir / "cni" / "10-bridge.conflist").write_text(json.dumps(cni_config()))
        (self.workdir / "kubelet.yaml").write_text(
            json.dumps(kubelet_config(self.workdir, self.config, self.cgroup.path))
        )
        (self.workdir / "node.sh").write_text(NODE_SCRIPT)

    def _start_relay(self) -> None:
        socket = self.workdir / "apiserver.sock"
        self._relay = Component(
            "relay",
            [
                shutil.which("socat") or "socat",
                f"UNIX-LISTEN:{socket},fork,mode=600",
                f"TCP:127.0.0.1:{self.control_plane.api_port}",
            ],
            self.log_path("relay"),
        )
        self._relay.start()
        self._relay.wait_ready(socket.exists, time.monotonic() + 10)

    def _start_node(self) -> None:
        build = self.config.build
        env = {
            "NODE_DIR": str(self.workdir),
            "NODE_ADDRESS": self.config.address,
            "SERVICE_IP": SERVICE_IP,
            "KUBELET": str(build.kubelet),
            "NODE_NAME": self.name,
            "NODE_LABELS": ",".join(f"{k}={v}" for k, v in sorted(self.config.labels.items())),
            "NODE_TAINTS": ",".join(self.config.taints),
            "NODE_IMAGES": " ".join(str(p) for p in [*build.images, *self.config.extra_images]),
            "HOST_PATHS": " ".join(HOST_PATHS),
            "KERNEL_DEFAULTS": " ".join(KERNEL_DEFAULTS),
        }
        self._node = Component(
            "node",
            [
                shutil.which("unshare") or "unshare",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                "--mount-proc",
                "--mount",
                "--propagation=private",
                "--net",
                "bash",
                str(self.workdir / "node.sh"),
            ],
            self.log_path("node"),
            env=env,
        )
        self._node.start()
        self._node.wait_ready(self._registered, time.monotonic() + self.config.start_timeout_s)

    def _registered(self) -> bool:

        try:
            node = self.control_plane.client().get(Node, self.name)
        except ApiError:
            return False
        self._registered_once = True
        conditions = node.status.conditions if node.status else None
        return any(c.type == "Ready" and c.status == "True" for c in conditions or [])

    def failure_report(self) -> str:
        """The last lines of each log of the node, for a test's failure message."""
        return "\n".join(
            f"--- {name} ---\n{log_tail(self.log_path(name))}"
            for name in ("node", "containerd", "kubelet", "relay")
        )


def namespace_members(inode: int) -> list[int]:
    """The processes of the PID namespace `inode`, as the machine numbers them."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "ns" / "pid").stat().st_ino == inode:
                    members.append(int(entry.name))
            except OSError:
                continue
    return members


def container_pids(container_id: str) -> list[int]:
    """The processes of one container (the ID its pod's status names after
    `containerd://`), as the machine numbers them: those in its cgroup."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if container_id in (entry / "cgroup").read_text():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return sorted(pids)


def _wait_empty(namespace: int, timeout_s: float) -> None:
    """The kernel ends a PID namespace's processes after its first one, not at once."""
    deadline = time.monotonic() + timeout_s
    while namespace_members(namespace) and time.monotonic() < deadline:
        time.sleep(0.1)


def _make_missing(path: Path) -> list[Path]:
    """Make `path` and any missing parents; return those made, outermost first."""
    made: list[Path] = []
    for parent in [*reversed(path.parents), path]:
        if not parent.exists():
            parent.mkdir()
            made.append(parent)
    return made


def _binding_name(node: str) -> str:
    return f"gpuheal-sim-node-{node}"[:253]


def _forget_node(cp: ControlPlane, node: str) -> None:
    """Delete the Node and its role binding: the cluster as it was before the node."""

    client = cp.client()
    for kind, name in ((Node, node), (ClusterRoleBinding, _binding_name(node))):
        try:
            client.delete(kind, name)
        except ApiError as err:
            if err.status.code != 404:
                log.warning("real node %s: could not delete %s: %s", node, name, err)


def _bind_node_role(cp: ControlPlane, user: str, node: str) -> None:
    """What a kubelet gets in a real cluster from the Node authorizer, as RBAC: the
    built-in system:node role, for this node's identity only."""

    binding = ClusterRoleBinding(
        metadata=ObjectMeta(name=_binding_name(node)),
        roleRef=RoleRef(
            apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name="system:node"
        ),
        subjects=[Subject(apiGroup="rbac.authorization.k8s.io", kind="User", name=user)],
    )
    cp.client().apply(binding, field_manager="gpuheal-sim")


def containerd_config(workdir: Path, pause_image: str) -> str:
    """containerd 1.6's configuration (version 2): state, sockets and CNI in the node's
    directory. restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and runc fails
    every sandbox that asks for a lower OOM score than its own."""
    return f"""version = 2
root = "{workdir}/containerd/root"
state = "{workdir}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{workdir}/run/containerd.sock"
[ttrpc]
  address = "{workdir}/run/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    # The NVIDIA container runtime's handler (the GPU Operator's RuntimeClass `nvidia`)
    # as the toolkit configures it, by its binary's name: here a runc of that name (no
    # driver to inject; the NVML stand-in comes through the pod's own mounts).
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
        BinaryName = "{workdir}/bin/nvidia-container-runtime"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{workdir}/cni"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{workdir}/registries"
"""


def registries_config() -> str:
    """Every registry's host is a closed loopback port: the node's images are imported,
    and a pod naming any other image fails its pull at once, sending nothing out."""
    return """server = "http://127.0.0.1:9"
[host."http://127.0.0.1:9"]
  capabilities = ["pull", "resolve"]
"""


def cni_config() -> dict[str, object]:
    """One bridge network for the node's pods, gateway on the node: no masquerading, no
    port maps (nothing leaves the node's namespace)."""
    return {
        "cniVersion": "0.4.0",
        "name": "pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "loopback"},
        ],
    }


def kubelet_config(workdir: Path, config: RealNodeConfig, cgroup_root: str) -> dict[str, object]:
    """The KubeletConfiguration. cgroup v1 with no systemd as PID 1: cgroupfs, and
    failCgroupV1 off (1.35+ refuses v1 by default). Eviction and image GC thresholds
    low: the node shares this machine's disk and memory with everything else."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "containerRuntimeEndpoint": f"unix://{workdir}/run/containerd.sock",
        "protectKernelDefaults": True,
        "failSwapOn": False,
        "address": config.address,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(workdir / "ca.crt")},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDomain": "cluster.local",
        "resolvConf": "",
        "maxPods": config.max_pods,
        "evictionHard": {
            "memory.available": "64Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "featureGates": config.feature_gates,
        "nodeStatusReportFrequency": "10s",
        "serializeImagePulls": False,
    }


# The node's first process, in its new namespaces. Everything it starts dies with it.
NODE_SCRIPT = r"""
set -euo pipefail
cd "$NODE_DIR"
echo "node: $NODE_NAME at $NODE_ADDRESS"
ip link set lo up
ip link add node0 type veth peer name node1
ip addr add "$NODE_ADDRESS/16" dev node0
ip link set node0 up
ip link set node1 up
ip route add default dev node0
ip addr add "$SERVICE_IP/32" dev lo
for path in $HOST_PATHS; do
  mount --bind "host/$(echo "${path#/}" | tr / _)" "$path"
done
for key in $KERNEL_DEFAULTS; do
  mount --bind "sysctl/$(echo "$key" | tr / _)" "/proc/sys/$key"
done
socat TCP-LISTEN:6443,bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:apiserver.sock &
socat TCP-LISTEN:443,bind="$SERVICE_IP",fork,reuseaddr UNIX-CONNECT:apiserver.sock &
containerd --config containerd.toml >containerd.log 2>&1 &
for _ in $(seq 100); do [[ -S run/containerd.sock ]] && break; sleep 0.1; done
for image in $NODE_IMAGES; do
  ctr --address run/containerd.sock -n k8s.io images import --all-platforms "$image"
done
"$KUBELET" --config=kubelet.yaml --kubeconfig=kubelet.kubeconfig \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_ADDRESS" \
  --node-labels="$NODE_LABELS" --register-with-taints="$NODE_TAINTS" --v=1 >kubelet.log 2>&1 &
wait -n
echo "node: a process of the node exited"
wait
"""
