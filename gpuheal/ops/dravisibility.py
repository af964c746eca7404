"""Doctor's second question on a DRA node: does the scheduler see its GPUs, and can
a bad one be fenced alone?

A DRA node offers no GPU count: its driver publishes a device per GPU in a
ResourceSlice, and the scheduler gives a claim only devices no taint keeps it off
(the driver's own, gpuheal's DeviceTaintRules). So the count is the published GPUs,
the usable ones those untainted, each tainted one named with why; and the fence is
whichever version of resource.k8s.io serves DeviceTaintRules, if any.
"""

from __future__ import annotations

from gpuheal.config import Config
from gpuheal.kube.details import Node
from gpuheal.model import DraDevice
from gpuheal.ops.cluster import labels_of
from gpuheal.ops.findings import BAD, INFO, OK, WARN, Facts, Finding, listed, plural
from gpuheal.ops.scheduling import node_capacity
from gpuheal.policy import dra
from gpuheal.policy.pools import expected_gpus, pool_config, pool_of

# What serves DeviceTaintRules, for the sentence that says none does.
FENCE_NEEDS = (
    "Kubernetes 1.37 serves them at resource.k8s.io/v1; 1.36 at v1beta2 with "
    "--runtime-config=resource.k8s.io/v1beta2=true and the DRADeviceTaintRules feature gate"
)


def dra_node(node: Node, facts: Facts, config: Config) -> bool:
    """The node's GPUs are DRA devices (its driver publishes them; no count is offered)."""
    return bool(facts.dra.devices) and not sum(node_capacity(node, config).values())


def question_dra(node: Node, facts: Facts, config: Config) -> list[Finding]:
    return [_count(node, facts, config), _fence(facts, config)]


def _count(node: Node, facts: Facts, config: Config) -> Finding:
    devices = facts.dra.devices
    total, usable = dra.gpu_count(devices), dra.usable_count(devices)
    drivers = ", ".join(sorted({d.key.driver for d in devices}))
    labels = labels_of(node)
    expected = expected_gpus(labels, config)
    if pool_config(pool_of(labels, config), config).gpus_per_node is not None:
        source = f"gpusPerNode of pool {pool_of(labels, config)}"
    else:
        source = f"label {config.pools.expected_gpus_label}"
    published = f"The DRA driver ({drivers}) publishes {plural(total, 'GPU')}"
    tainted = [d for d in devices if d.fencing]
    if expected is not None and total < expected:
        return Finding(
            BAD,
            "gpus-missing",
            f"{published} but the node should have {expected} ({source}): "
            f"{expected - total} missing; a GPU may have fallen off the bus "
            "(`nvidia-smi`, `dmesg | grep -i xid` on the host), or the driver's plugin "
            "does not see it (its pod's log).",
        )
    if tainted:
        return Finding(
            WARN,
            "gpus-tainted",
            f"{published}; {usable} usable: taints keep new claims off "
            f"{listed(_tainted(d) for d in tainted)}.",
        )
    as_expected = f", as expected ({source})" if expected is not None else ""
    return Finding(OK, "gpus-visible", f"{published}, all usable{as_expected}.")


def _tainted(device: DraDevice) -> str:
    return f"{device.key.device} ({', '.join(device.fencing)})"


def _fence(facts: Facts, config: Config) -> Finding:
    version, effect = facts.dra.fence_api, config.device_health.fence
    if version is None:
        return Finding(
            INFO, "device-fence", "Which device fence the cluster serves is unknown (see above)."
        )
    if effect == "off":
        return Finding(
            INFO,
            "device-fence",
            "deviceHealth.fence is off: a bad card is marked, not fenced (the node is "
            "quarantined when its faults escalate).",
        )
    if not version:
        return Finding(
            WARN,
            "no-device-fence",
            "No DeviceTaintRule API is served: a bad card of this node cannot be fenced "
            f"alone, so gpuheal quarantines the whole node instead. {FENCE_NEEDS}.",
        )
    return Finding(
        OK,
        "device-fence",
        "A bad card here is fenced alone: a DeviceTaintRule "
        f"(resource.k8s.io/{version}, {effect}), its pods moved through the Eviction API.",
    )
