"""The device fence: one DeviceTaintRule (KEP-5055) per device fault, keeping that
one GPU out of new allocations while the rest of its node keeps working.

The rule names exactly one device (driver, pool, device: DeviceTaintRule selects by
nothing else since Kubernetes 1.35) and carries gpuheal's taint key, with the fault
id as its value where that fits a label value. Its name is derived from the fault's
GPUFault record, so creating it is idempotent: a controller killed at any step and
started again finds the one rule, never makes a second (AlreadyExists is success).

Every value that comes from outside (node and pool names up to 253 characters, fault
ids of any length and characters, reasons people write) is made valid here, by
construction; tests/integration/test_dra.py proves it against the real API server.

Effects: `NoSchedule` by default. kube-scheduler leaves the device out of new
allocations; the pods already on it stay and gpuheal moves them through the Eviction
API, so PodDisruptionBudgets and checkpoints hold. `NoExecute` is a site's choice:
kube-controller-manager then deletes the pods on the device itself, and no budget
holds (tests/integration/test_dra.py shows it).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuheal import values
from gpuheal.clock import iso
from gpuheal.model import TAINT_KEY, DeviceKey, fault_record_name

# Kubernetes 1.36: beta, served only where resource.k8s.io/v1beta2 is turned on;
# 1.37 serves it at resource.k8s.io/v1. Newest first: the one written where both are.
RULE_GROUP = "resource.k8s.io"
RULE_VERSIONS = ("v1", "v1beta2")
RULE_PREFIX = "gpuheal-"
EFFECTS = ("NoSchedule", "NoExecute")
# What selects gpuheal's rules, and only those: the controller's admission policy
# and its cleanup read these, never the name alone.
FENCE_LABEL = "gpuheal.io/fence"
FENCE_LABEL_VALUE = "device"
RECORD_LABEL = "gpuheal.io/record"
# The full identity, where the label and the taint value may hold only a digest.
FAULT_ID_ANNOTATION = "gpuheal.io/fault-id"
REASON_ANNOTATION = "gpuheal.io/reason"
EXPIRES_ANNOTATION = "gpuheal.io/expires-at"
DEVICE_ANNOTATION = "gpuheal.io/device"
# The node the device is on: the selector names a pool, which only NVIDIA's driver
# names after its node; the controller finds a node's rules by this.
NODE_ANNOTATION = "gpuheal.io/node"
REASON_MAX = 1024


# A released device's probation (deviceHealth.probationSeconds): a NoSchedule taint
# of its own key, which workloads fit for a card just back (batch tiers) tolerate.
PROBATION_KEY = "gpuheal.io/probation"
PROBATION_PREFIX = f"{RULE_PREFIX}probation-"


def record_of(rule: str, key: str = TAINT_KEY) -> str:
    """The record a rule is for, from its name and taint key (the names' inverse)."""
    prefix = PROBATION_PREFIX if key == PROBATION_KEY else RULE_PREFIX
    return rule.removeprefix(prefix)


def probation_name(record: str) -> str:
    """The probation rule of a released device record (at most 231 characters)."""
    return f"{PROBATION_PREFIX}{record}"


# A device Unknown past deviceHealth.unknownToleranceSeconds: suspect, not a fault, and
# kept out of new allocations (gpuheal's taint, its value `suspect`).
SUSPECT_PREFIX = f"{RULE_PREFIX}suspect-"
SUSPECT_VALUE = "suspect"
# Which rule a FenceDevice makes: a fault's fence, a released card's probation, or a
# suspect card's restriction.
FENCE, PROBATION, SUSPECT = "fence", "probation", "suspect"


def suspect_name(node: str, device_id: str) -> str:
    """The suspect rule of one device of a node (at most 229 characters)."""
    return f"{SUSPECT_PREFIX}{fault_record_name(node, SUSPECT_VALUE, device_id)}"


def rule_name(record: str) -> str:
    """The rule of a device fault record: the record's name (model.fault_record_name,
    a DNS-1123 subdomain of at most 213 characters, its digest last) behind the prefix."""
    return f"{RULE_PREFIX}{record}"


def device_taint_rule(
    *,
    node: str,
    record: str,
    fault_id: str,
    reason: str,
    device: DeviceKey,
    effect: str = "NoSchedule",
    expires: dt.datetime | None = None,
    version: str = "v1beta2",
    kind: str = FENCE,
) -> dict[str, Any]:
    """The DeviceTaintRule that fences `device` for the fault `record` holds; or, by
    `kind`, keeps it to tolerating workloads until `expires` after its release
    (PROBATION), or out of new allocations while it is suspect (SUSPECT: `record` is
    then the rule's name)."""
    if effect not in EFFECTS:
        raise ValueError(f"a device fence's effect is one of {EFFECTS}, not {effect!r}")
    annotations = {
        FAULT_ID_ANNOTATION: values.text(fault_id),
        REASON_ANNOTATION: values.text(reason, REASON_MAX),
        DEVICE_ANNOTATION: f"{device.driver}/{device.pool}/{device.device}",
        NODE_ANNOTATION: node,
    }
    if expires is not None:
        annotations[EXPIRES_ANNOTATION] = iso(expires, "seconds")
    return {
        "apiVersion": f"{RULE_GROUP}/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": {FENCE: rule_name(record), PROBATION: probation_name(record)}.get(kind, record),
            "labels": {
                FENCE_LABEL: FENCE_LABEL_VALUE,
                RECORD_LABEL: values.label_value(record),
                "app.kubernetes.io/managed-by": "gpuheal",
            },
            "annotations": annotations,
        },
        "spec": {
            "deviceSelector": {
                "driver": device.driver,
                "pool": device.pool,
                "device": device.device,
            },
            "taint": {
                "key": PROBATION_KEY if kind == PROBATION else TAINT_KEY,
                "value": SUSPECT_VALUE if kind == SUSPECT else values.taint_value(fault_id),
                "effect": effect if kind == FENCE else "NoSchedule",
            },
        },
    }
