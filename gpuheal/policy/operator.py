"""gpu-operator's driver upgrade controller, as its labels tell it (k8s-operator-libs
pkg/upgrade): with ClusterPolicy `spec.driver.upgradePolicy.autoUpgrade` (or an
NVIDIADriver's `spec.upgradePolicy.autoUpgrade`) on, gpu-operator cordons, drains
and upgrades the GPU nodes itself, one state label a node:

upgrade-required -> cordon-required -> wait-for-jobs-required ->
pod-deletion-required -> drain-required -> pod-restart-required ->
validation-required -> uncordon-required -> upgrade-done (or upgrade-failed;
node-maintenance-required and post-maintenance-required with an external
maintenance operator).

gpuheal leaves such a node alone until the label says done: its gate does not
return it (a node mid-upgrade has no driver to vouch for, and one whose upgrade
failed has a broken one) and a gpuheal roll-out does not take it. A pool whose
upgrades gpu-operator manages is not rolled out by gpuheal at all.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuheal.model import DRIVER_UPGRADE_ENABLED, DRIVER_UPGRADE_SKIP, DRIVER_UPGRADE_STATE

UPGRADE_DONE = "upgrade-done"
UPGRADE_FAILED = "upgrade-failed"
# What a person sets to let gpuheal roll the driver out instead.
AUTO_UPGRADE_SETTING = (
    "ClusterPolicy spec.driver.upgradePolicy.autoUpgrade (or the NVIDIADriver's "
    "spec.upgradePolicy.autoUpgrade)"
)


def driver_upgrade(labels: Mapping[str, str]) -> str | None:
    """gpu-operator's upgrade state of a node whose upgrade is not done (NVIDIA's own
    rule, isIncompleteDriverUpgradeState: any state but "" and upgrade-done); None
    when there is none, it is done, or the node is opted out (`.skip=true`)."""
    state = labels.get(DRIVER_UPGRADE_STATE, "")
    if not state or state == UPGRADE_DONE or labels.get(DRIVER_UPGRADE_SKIP) == "true":
        return None
    return state


def upgrades_managed(labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """Does gpu-operator upgrade this node's driver itself? Its annotation says so
    (on every GPU node while autoUpgrade is on, since gpu-operator v23.3), or an
    upgrade of it is under way now."""
    if labels.get(DRIVER_UPGRADE_SKIP) == "true":
        return False
    return annotations.get(DRIVER_UPGRADE_ENABLED) == "true" or driver_upgrade(labels) is not None
