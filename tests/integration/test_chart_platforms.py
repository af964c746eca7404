"""The chart's platform presets on the real control plane: for each platform
(`--set platform=...`) the agent DaemonSet carries what that platform needs to
hand it the NVIDIA driver, and kube-controller-manager's DaemonSet controller
creates agent pods on exactly the nodes of that platform's shape, among fake
nodes labelled as GKE (a GPU and a TPU node), EKS (a managed node group,
Karpenter), NFD and GFD label them, and a CPU node. The presets add only what
they name; the pass-through values reach the pods, and what cannot work is
refused at render time."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event, Namespace, Node, Pod, ResourceQuota
from lightkube.resources.node_v1 import RuntimeClass

from gpuheal.config import parse_config
from gpuheal.policy.nodes import gpu_node as managed
from gpuheal.sim import ControlPlane
from gpuheal.sim.nodes import GPU_RESOURCE, delete_nodes, gpu_node, wait_nodes_ready
from gpuheal.sim.workloads import create_namespace
from tests.corpus import eks_node_names
from tests.helpers import unique, wait_for
from tests.integration.chart import helm_template, installed, render

pytestmark = pytest.mark.timeout(300)

FLEET_LABEL = "gpuheal.test/fleet"
PLATFORMS = ("gpu-operator", "gke", "eks", "generic")

# The agent container's security context before the presets, and on every platform
# but gke (whose device access is its own value).
DEFAULT_CONTEXT = {
    "runAsUser": 0,
    "runAsNonRoot": False,
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"], "add": ["SYSLOG"]},
    "readOnlyRootFilesystem": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def fleet_nodes(fleet: str) -> dict[str, dict[str, Any]]:
    """One node of each shape, by role: its manifest, labelled as the platform labels
    it (the labels GKE, EKS, Karpenter, NFD and GFD write; no GFD label but on the
    GFD node). Each carries the fleet's label and a NoSchedule taint of its own so
    that other tests' pods stay off (the agent tolerates every taint)."""
    mng, karpenter, cpu = (
        n.replace(".us-west-2.compute.internal", ".ec2.internal")
        for n in eks_node_names(3, region="us-west-2")
    )
    hexid = uuid.uuid4().hex
    shapes: dict[str, tuple[str, dict[str, str]]] = {
        "gke": (
            f"gke-prod-gpu-pool-{hexid[:8]}-{hexid[8:12]}",
            {
                "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
                "cloud.google.com/gke-gpu-driver-version": "default",
                "cloud.google.com/gke-nodepool": "gpu-pool",
                "cloud.google.com/gke-os-distribution": "cos",
                "cloud.google.com/gke-container-runtime": "containerd",
                "cloud.google.com/machine-family": "a3",
                "node.kubernetes.io/instance-type": "a3-highgpu-8g",
                "topology.kubernetes.io/region": "us-central1",
                "topology.kubernetes.io/zone": "us-central1-a",
            },
        ),
        # An EKS managed node group on the AL2023 NVIDIA AMI: no GPU label at all.
        "eks-node-group": (
            mng,
            {
                "eks.amazonaws.com/nodegroup": "gpu-p5",
                "eks.amazonaws.com/nodegroup-image": "ami-0c5f4d3b2a1e9f876",
                "eks.amazonaws.com/capacityType": "ON_DEMAND",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/region": "us-east-1",
                "topology.kubernetes.io/zone": "us-east-1a",
            },
        ),
        # Karpenter's node of an instance type newer than eks.instanceTypes lists.
        "eks-karpenter": (
            karpenter,
            {
                "karpenter.sh/nodepool": "gpu",
                "karpenter.sh/capacity-type": "on-demand",
                "karpenter.k8s.aws/instance-family": "p6-b200",
                "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
                "karpenter.k8s.aws/instance-gpu-name": "b200",
                "karpenter.k8s.aws/instance-gpu-count": "8",
                "node.kubernetes.io/instance-type": "p6-b200.48xlarge",
                "topology.kubernetes.io/zone": "us-east-1b",
            },
        ),
        # On-prem with NFD only (no GPU feature discovery).
        "nfd": (
            f"gpu-{hexid[12:20]}.rack-b07.dc-fra1.example.com",
            {
                "feature.node.kubernetes.io/pci-10de.present": "true",
                "feature.node.kubernetes.io/kernel-version.major": "6",
            },
        ),
        # The GPU Operator's node: NFD's label and GFD's.
        "gfd": (
            f"dgx-h100-a07-{hexid[20:28]}",
            {
                "feature.node.kubernetes.io/pci-10de.present": "true",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
            },
        ),
        # GKE's TPU node: GKE's accelerator label for TPUs is another key.
        "gke-tpu": (
            f"gke-prod-tpu-pool-{hexid[28:32]}{hexid[:4]}-{hexid[4:8]}",
            {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                "cloud.google.com/gke-tpu-topology": "2x4",
                "cloud.google.com/gke-nodepool": "tpu-pool",
                "node.kubernetes.io/instance-type": "ct5lp-hightpu-4t",
                "topology.kubernetes.io/zone": "us-central1-a",
            },
        ),
        "cpu": (
            cpu,
            {
                "eks.amazonaws.com/nodegroup": "system",
                "node.kubernetes.io/instance-type": "m7i.4xlarge",
                "topology.kubernetes.io/zone": "us-east-1a",
            },
        ),
    }
    taint = {"key": FLEET_LABEL, "value": fleet, "effect": "NoSchedule"}
    nodes = {}
    for role, (name, labels) in shapes.items():
        manifest = gpu_node(name, taints=[taint])
        base = {
            k: v
            for k, v in manifest["metadata"]["labels"].items()
            if k.startswith("kubernetes.io/")
        }
        manifest["metadata"]["labels"] = {**base, **labels, FLEET_LABEL: fleet}
        if role == "gke":  # GKE taints its GPU nodes
            manifest["spec"]["taints"].append(
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
            )
        if role in ("cpu", "gke-tpu"):
            resources = manifest["status"]["capacity"]  # allocatable: the same dict
            del resources[GPU_RESOURCE]
            if role == "gke-tpu":
                resources["google.com/tpu"] = "4"
        nodes[role] = manifest
    return nodes


@pytest.fixture(scope="module")
def fleet(kube: Client) -> Iterator[tuple[str, dict[str, dict[str, Any]]]]:
    """The fleet's label value and its nodes by role, Ready under kwok; deleted after."""
    # Not bare hex: `--set` reads "94385109" or "12e45678" as a number, and a
    # nodeSelector value must be a string.
    name = unique("fleet")
    nodes = fleet_nodes(name)
    created = []
    try:
        for manifest in nodes.values():
            kube.create(codecs.from_dict(manifest))
            created.append(manifest["metadata"]["name"])
        wait_nodes_ready(kube, created)
        yield name, nodes
    finally:
        delete_nodes(kube, created)


@pytest.fixture(scope="module")
def nvidia_runtime_class(kube: Client) -> Iterator[None]:
    """The RuntimeClass the GPU Operator creates (name and handler nvidia): without
    it the API server refuses pods that name it. Removed after, if made here."""
    made = False
    try:
        kube.create(RuntimeClass(metadata=ObjectMeta(name="nvidia"), handler="nvidia"))
        made = True
    except ApiError as err:
        if err.status.code != 409:
            raise
    yield
    if made:
        kube.delete(RuntimeClass, "nvidia")


def agent_pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def controller_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (config,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-controller")
    ]
    loaded: dict[str, Any] = yaml.safe_load(config["data"]["config.yaml"])
    return loaded


def test_without_the_gpu_operators_runtime_class_the_agent_is_refused_loudly(
    kube: Client,
    control_plane: ControlPlane,
    crds: None,
    fleet: tuple[str, dict[str, dict[str, Any]]],
) -> None:
    """The default platform on a cluster without the RuntimeClass `nvidia`: no agent
    runs without a driver; the DaemonSet says why in a FailedCreate Event. (Before
    the placement test, which creates the RuntimeClass for the rest of the module.)"""
    try:
        kube.get(RuntimeClass, "nvidia")
        pytest.skip("a RuntimeClass nvidia exists on this control plane")
    except ApiError as err:
        if err.status.code != 404:
            raise
    fleet_name, _ = fleet
    with installed(kube, control_plane, sets=fleet_sets("gpu-operator", fleet_name)) as chart:

        def refused() -> list[str]:
            events = kube.list(
                Event,
                namespace=chart.namespace,
                fields={"involvedObject.name": f"{chart.name}-agent"},
            )
            return [str(e.message) for e in events if e.reason == "FailedCreate"]

        (message, *_) = wait_for("the DaemonSet's FailedCreate Event", refused, timeout_s=60)
        assert 'RuntimeClass "nvidia" not found' in message, message
        assert not list(kube.list(Pod, namespace=chart.namespace))


def fleet_sets(platform: str, fleet_name: str) -> dict[str, str]:
    """Only this fleet's nodes (other tests' GFD-labelled nodes stay out); no
    controller pods (kwok would place them on other tests' nodes)."""
    key = "agent.nodeSelector." + FLEET_LABEL.replace(".", "\\.")
    return {"platform": platform, key: fleet_name, "controller.replicas": "0"}


# Which roles get an agent, and which the controller manages, per platform.
AGENTS = {
    "gpu-operator": {"gfd"},
    "gke": {"gke"},
    "eks": {"eks-node-group", "eks-karpenter", "nfd", "gfd"},
    "generic": {"nfd", "gfd"},
}
GPU_ROLES = {"gke", "eks-node-group", "eks-karpenter", "nfd", "gfd"}
MANAGED = {"gpu-operator": {"gfd"}, "gke": GPU_ROLES, "eks": GPU_ROLES, "generic": GPU_ROLES}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_agent_runs_on_exactly_the_gpu_nodes_of_each_platform(
    kube: Client,
    control_plane: ControlPlane,
    crds: None,
    fleet: tuple[str, dict[str, dict[str, Any]]],
    nvidia_runtime_class: None,
    platform: str,
) -> None:
    fleet_name, nodes = fleet
    by_name = {n["metadata"]["name"]: role for role, n in nodes.items()}
    with installed(kube, control_plane, sets=fleet_sets(platform, fleet_name)) as chart:

        def placed() -> set[str] | None:
            pods = kube.list(
                Pod, namespace=chart.namespace, labels={"app.kubernetes.io/component": "agent"}
            )
            roles = {
                by_name.get(str(p.spec.nodeName), str(p.spec.nodeName))
                for p in pods
                if p.spec and p.spec.nodeName
            }
            return roles if roles == AGENTS[platform] else None

        wait_for(f"agent pods on {sorted(AGENTS[platform])}", placed, timeout_s=60)

        # And no more: the DaemonSet controller wants exactly those nodes, once its status
        # says so (it writes the status after it creates the pods; under load, seconds).
        def wanted() -> int | None:
            status = kube.get(DaemonSet, f"{chart.name}-agent", namespace=chart.namespace).status
            observed = status is not None and status.observedGeneration is not None
            return status.desiredNumberScheduled if status and observed else None

        assert wait_for("the DaemonSet's status", wanted, timeout_s=30) == len(AGENTS[platform])
        # The controller's nodeSelector as the controller reads it: which nodes it manages.
        config = parse_config(controller_config(chart.objects) | {"apiTokenFile": "/dev/null"})
        ours = {
            role
            for role, n in nodes.items()
            if managed(
                n["metadata"]["labels"], int(n["status"]["capacity"].get(GPU_RESOURCE, "0")), config
            )
        }
        assert ours == MANAGED[platform]
        assert AGENTS[platform] <= ours  # every node with an agent is one it manages


@pytest.mark.parametrize("platform", PLATFORMS)
def test_each_platform_hands_the_agent_the_driver_its_way(
    kube: Client, control_plane: ControlPlane, namespace: str, platform: str
) -> None:
    objects = render(control_plane, "gh", namespace, sets={"platform": platform})
    pod = agent_pod_spec(objects)
    (agent,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    keys = [[e["key"] for e in t["matchExpressions"]] for t in terms]
    agent_config = yaml.safe_load(
        next(
            o for o in objects if o["metadata"]["name"] == "gh-agent" and o["kind"] == "ConfigMap"
        )["data"]["config.yaml"]
    )
    selector = controller_config(objects)["nodeSelector"]
    assert "nodeSelector" not in pod  # selection is the affinity's alone unless you add one
    if platform == "gke":
        assert "runtimeClassName" not in pod
        assert env == {"NODE_NAME": None, "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}
        mount = mounts["/usr/local/nvidia"]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["hostPath"] == {
            "path": "/home/kubernetes/bin/nvidia",
            "type": "Directory",
        }
        assert (
            agent["securityContext"]["privileged"] is True
        )  # /dev/nvidia*, as GKE's own DaemonSets
        assert agent_config["smiCommand"] == ["/usr/local/nvidia/bin/nvidia-smi"]
        assert keys == [["cloud.google.com/gke-accelerator"]]
        assert terms[0]["matchExpressions"][0]["operator"] == "Exists"
        assert controller_config(objects)["healthGate"]["environmentIgnored"] == ["runtimehook"]
    else:
        assert env == {
            "NODE_NAME": None,
            "NVIDIA_VISIBLE_DEVICES": "all",
            "NVIDIA_DRIVER_CAPABILITIES": "utility",
        }
        assert "/usr/local/nvidia" not in mounts and "smiCommand" not in agent_config
        assert agent["securityContext"] == DEFAULT_CONTEXT
        assert pod.get("runtimeClassName") == ("nvidia" if platform == "gpu-operator" else None)
    expected_keys = {
        "gpu-operator": [["nvidia.com/gpu.present"]],
        "gke": [["cloud.google.com/gke-accelerator"]],
        "eks": [
            ["karpenter.k8s.aws/instance-gpu-manufacturer"],
            ["eks.amazonaws.com/instance-gpu-manufacturer"],
            ["k8s.amazonaws.com/accelerator"],
            ["node.kubernetes.io/instance-type"],
            ["feature.node.kubernetes.io/pci-10de.present"],
            ["nvidia.com/gpu.present"],
        ],
        "generic": [["nvidia.com/gpu.present"], ["feature.node.kubernetes.io/pci-10de.present"]],
    }
    assert keys == expected_keys[platform]
    assert selector == ({"nvidia.com/gpu.present": "true"} if platform == "gpu-operator" else {})
    # The API server takes the DaemonSet as rendered.
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    kube.create(codecs.from_dict(daemonset), dry_run=True)


def test_a_preset_adds_only_what_it_names(control_plane: ControlPlane, tmp_path: Path) -> None:
    def context(**sets: str) -> dict[str, Any]:
        pod = agent_pod_spec(render(control_plane, "gh", "ops", sets=sets))
        got: dict[str, Any] = pod["containers"][0]["securityContext"]
        return got

    def controller_context(**sets: str) -> tuple[Any, Any]:
        objects = render(control_plane, "gh", "ops", sets=sets)
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        pod = deployment["spec"]["template"]["spec"]
        return pod["securityContext"], pod["containers"][0]["securityContext"]

    # The default render's security context is what it was before the presets.
    assert context() == DEFAULT_CONTEXT
    for platform in ("gpu-operator", "eks", "generic"):
        assert context(platform=platform) == DEFAULT_CONTEXT
    # gke's device access is gke's alone, and its own value.
    assert context(platform="gke")["privileged"] is True
    assert context(platform="gke", **{"gke.privileged": "false"}) == DEFAULT_CONTEXT
    assert context(platform="eks", **{"gke.privileged": "true"}) == DEFAULT_CONTEXT
    # The controller's is the same on every platform.
    default = controller_context()
    assert default == (
        {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    )
    for platform in PLATFORMS:
        assert controller_context(platform=platform) == default
    # An override is yours, key by key: false included, the other keys kept.
    widened = context(**{"agent.securityContext.readOnlyRootFilesystem": "false"})
    assert widened == DEFAULT_CONTEXT | {"readOnlyRootFilesystem": False}
    # A value of yours wins over the preset's.
    pod = agent_pod_spec(
        render(control_plane, "gh", "ops", sets={"agent.runtimeClassName": "nvidia-cdi"})
    )
    assert pod["runtimeClassName"] == "nvidia-cdi"
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "platform": "eks",
                "agent": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {"key": "node-role/gpu", "operator": "Exists"}
                                        ]
                                    }
                                ]
                            }
                        }
                    }
                },
                "controller": {"config": {"nodeSelector": {"node-role/gpu": "true"}}},
            }
        )
    )
    objects = render(control_plane, "gh", "ops", values)
    (term,) = agent_pod_spec(objects)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term == {"matchExpressions": [{"key": "node-role/gpu", "operator": "Exists"}]}
    assert controller_config(objects)["nodeSelector"] == {"node-role/gpu": "true"}


def test_the_pass_through_values_reach_both_pods(
    kube: Client, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    extras = {
        "runtimeClassName": "gvisor",
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.corp.example.com:3128"}],
        "extraVolumes": [{"name": "ca-bundle", "configMap": {"name": "corp-ca"}}],
        "extraVolumeMounts": [
            {"name": "ca-bundle", "mountPath": "/etc/ssl/corp", "readOnly": True}
        ],
        "podSecurityContext": {"fsGroup": 2000},
        "securityContext": {"readOnlyRootFilesystem": True},
    }
    agent_extras = extras | {
        "runtimeClassName": "nvidia-legacy",
        # Replaces the preset's variable of the same name; no duplicate.
        "extraEnv": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility,compute"}],
    }
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "imagePullSecrets": ["ghcr-pull", {"name": "ecr-pull"}],
                "controller": extras,
                "agent": agent_extras,
            }
        )
    )
    objects = render(control_plane, "gh", namespace, values)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    for workload, runtime in ((deployment, "gvisor"), (daemonset, "nvidia-legacy")):
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert pod["runtimeClassName"] == runtime
        assert pod["imagePullSecrets"] == [{"name": "ghcr-pull"}, {"name": "ecr-pull"}]
        assert pod["securityContext"]["fsGroup"] == 2000
        assert {"name": "ca-bundle", "configMap": {"name": "corp-ca"}} in pod["volumes"]
        assert {"name": "ca-bundle", "mountPath": "/etc/ssl/corp", "readOnly": True} in container[
            "volumeMounts"
        ]
        names = [e["name"] for e in container["env"]]
        assert len(names) == len(set(names))
        # The API server takes each as rendered.
        kube.create(codecs.from_dict(workload), dry_run=True)
    agent = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in agent["env"]}[
        "NVIDIA_DRIVER_CAPABILITIES"
    ] == "utility,compute"
    assert agent["securityContext"] == DEFAULT_CONTEXT  # an override of one key keeps the rest
    controller = deployment["spec"]["template"]["spec"]
    # The pod context was merged key by key: the chart's non-root stays.
    assert controller["securityContext"]["runAsNonRoot"] is True
    assert {"name": "HTTPS_PROXY", "value": "http://proxy.corp.example.com:3128"} in controller[
        "containers"
    ][0]["env"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"platform": "aks"}, 'platform: "aks" is not one of gpu-operator, gke, eks, generic'),
        (
            {"agent": {"extraVolumeMounts": [{"name": "certs", "mountPath": "/etc/certs"}]}},
            'agent.extraVolumeMounts: "certs" mounts a volume that neither the chart nor '
            "agent.extraVolumes has",
        ),
        (
            {"controller": {"extraVolumeMounts": [{"name": "certs", "mountPath": "/etc/certs"}]}},
            'controller.extraVolumeMounts: "certs" mounts a volume',
        ),
        (
            {"agent": {"extraVolumes": [{"name": "state", "emptyDir": {}}]}},
            'agent.extraVolumes: "state" is already a volume of the chart',
        ),
        (
            {
                "agent": {
                    "extraVolumes": [{"name": "x", "emptyDir": {}}],
                    "extraVolumeMounts": [{"name": "x", "mountPath": "/host/proc"}],
                }
            },
            'agent.extraVolumeMounts: "x" is mounted at /host/proc, where something is already '
            "mounted",
        ),
        (
            {
                "platform": "gke",
                "agent": {
                    "extraVolumes": [{"name": "x", "emptyDir": {}}],
                    "extraVolumeMounts": [{"name": "x", "mountPath": "/usr/local/nvidia"}],
                },
            },
            "is mounted at /usr/local/nvidia",
        ),
        (
            {"agent": {"extraVolumeMounts": [{"name": "state"}]}},
            'agent.extraVolumeMounts: "state" has no mountPath',
        ),
        (
            {"agent": {"extraEnv": [{"name": "NODE_NAME", "value": "x"}]}},
            "agent.extraEnv: NODE_NAME is the chart's",
        ),
        (
            {"controller": {"extraEnv": [{"value": "x"}]}},
            "controller.extraEnv: a variable has no name",
        ),
        ({"imagePullSecrets": [{"namespace": "x"}]}, "imagePullSecrets:"),
    ],
)
def test_what_cannot_work_fails_the_render_naming_the_value(
    control_plane: ControlPlane, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    done = helm_template(control_plane, "gh", "ops", path)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_the_fleet_nodes_leave_no_trace(
    kube: Client, fleet: tuple[str, dict[str, dict[str, Any]]]
) -> None:
    """The nodes carry their fleet's taint: no other test's pod lands on them."""
    _, nodes = fleet
    for manifest in nodes.values():
        node = kube.get(Node, manifest["metadata"]["name"])
        assert node.spec is not None and any(t.key == FLEET_LABEL for t in node.spec.taints or [])


# -- cluster policies: Pod Security, the critical classes' quota, where the controller runs


PSA = "pod-security.kubernetes.io/enforce"


def test_pod_security_the_agent_needs_privileged_and_the_controller_meets_restricted(
    kube: Client,
    control_plane: ControlPlane,
    crds: None,
    fleet: tuple[str, dict[str, dict[str, Any]]],
) -> None:
    """The agent mounts host paths and runs as host root: Pod Security's `baseline`
    refuses it, so the release namespace is `privileged` (docs/deploy.md). The
    controller's pod alone meets `restricted`."""
    fleet_name, _ = fleet
    sets = fleet_sets("generic", fleet_name)
    with installed(kube, control_plane, sets=sets, namespace_labels={PSA: "baseline"}) as chart:

        def refused() -> list[str]:
            events = kube.list(
                Event,
                namespace=chart.namespace,
                fields={"involvedObject.name": f"{chart.name}-agent"},
            )
            return [str(e.message) for e in events if e.reason == "FailedCreate"]

        (message, *_) = wait_for("the agent refused under baseline", refused, timeout_s=60)
        assert 'violates PodSecurity "baseline:latest"' in message and "hostPath" in message
        assert not list(kube.list(Pod, namespace=chart.namespace))
    with installed(kube, control_plane, sets=sets, namespace_labels={PSA: "privileged"}) as chart:
        wait_for(
            "agent pods under privileged",
            lambda: list(kube.list(Pod, namespace=chart.namespace)),
            timeout_s=60,
        )
        # The quota that lets system-*-critical pods in where it is required (GKE)
        # names both classes and counts the agents.
        quota = kube.get(ResourceQuota, f"{chart.name}-critical-pods", namespace=chart.namespace)
        assert quota.spec is not None and quota.spec.scopeSelector is not None
        (scope,) = quota.spec.scopeSelector.matchExpressions or []
        assert set(scope.values or []) == {"system-node-critical", "system-cluster-critical"}

        def counted() -> bool:
            used = kube.get(ResourceQuota, f"{chart.name}-critical-pods", namespace=chart.namespace)
            pods = len(list(kube.list(Pod, namespace=chart.namespace)))
            return used.status is not None and (used.status.used or {}).get("pods") == str(pods)

        wait_for("the agents counted by the quota", counted, timeout_s=60)
    restricted = unique("restricted")
    create_namespace(kube, restricted, {PSA: "restricted"})
    try:
        (deployment,) = [
            o for o in render(control_plane, "gh", restricted) if o["kind"] == "Deployment"
        ]
        template = deployment["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "controller", "namespace": restricted},
            # Pod Security looks at the pod, not at its (release's) ServiceAccount.
            "spec": {**template["spec"], "serviceAccountName": "default"},
        }
        kube.create(codecs.from_dict(pod), dry_run=True)  # admitted under restricted
    finally:
        kube.delete(Namespace, restricted)


def test_where_the_controller_runs_is_settable(
    control_plane: ControlPlane, kube: Client, namespace: str, tmp_path: Path
) -> None:
    def deployment(*values: Path) -> dict[str, Any]:
        objects = render(control_plane, "gh", namespace, *values)
        return next(o for o in objects if o["kind"] == "Deployment")

    spec = deployment()["spec"]["template"]["spec"]
    assert spec["tolerations"] == [] and "nodeSelector" not in spec  # never on a GPU node
    assert "podAntiAffinity" in spec["affinity"]
    zone = {"key": "topology.kubernetes.io/zone", "operator": "Exists"}
    placement = {
        "nodeSelector": {"node-role.kubernetes.io/infra": "true"},
        "tolerations": [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [zone]}]
                }
            }
        },
    }
    values = tmp_path / "placement.yaml"
    values.write_text(yaml.safe_dump({"controller": placement}))
    placed = deployment(values)
    spec = placed["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == placement["nodeSelector"]
    assert spec["tolerations"] == placement["tolerations"]
    assert spec["affinity"] == placement["affinity"]  # the user's, instead of the chart's
    # Only where it runs changes, never which nodes it manages.
    managed = controller_config(render(control_plane, "gh", namespace, values))["nodeSelector"]
    assert managed == {"nvidia.com/gpu.present": "true"}
    kube.create(codecs.from_dict(placed), dry_run=True)
