"""What NVIDIA's DRA driver's own device taints mean, as a fault source.

With its `NVMLDeviceHealthCheck` gate the driver (kubernetes-sigs/dra-driver-nvidia-gpu,
cmd/gpu-kubelet-plugin/device_health.go) taints a device in its ResourceSlice:

- `gpu.nvidia.com/xid=<code>` on an Xid critical error event: `NoSchedule`, or `None`
  for the Xids it deems non-fatal (13, 31, 43, 45, 68, 109 and any configured);
- `gpu.nvidia.com/gpu-lost` (no value, `NoSchedule`, on every device of the node) when
  NVML says the GPU is lost;
- `gpu.nvidia.com/unmonitored` (no value, `None`) for a GPU it cannot watch.

It never writes `NoExecute` and never removes a taint until it restarts. So the driver's
effect is no verdict: an Xid means what NVIDIA's catalogue says (gpuheal/xid), read the
same way as from any other source, whatever effect the driver chose.

The scope is gpuheal's (scope_of): an application or informational Xid is nothing; a
GPU that needs a reboot (Xid 79, fallen off the bus, and the like) or is lost takes
its node; an NVLink error (74, the NVLink5 errors 144-150, 155, a link's training
failure 136) takes the node too, for on an NVSwitch system the links are the fabric
every GPU's collectives cross; any other node fault (an error of the GPU's own
memory, engines or firmware, whose remedy is a GPU reset or support) stays on the
one GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuheal.model import DeviceHealth, DraDevice, PodView, Severity
from gpuheal.policy.dra import GPU_DRIVERS, slice_devices
from gpuheal.xid import Action, XidRow, classify

XID_KEY = "gpu.nvidia.com/xid"
LOST_KEY = "gpu.nvidia.com/gpu-lost"
UNMONITORED_KEY = "gpu.nvidia.com/unmonitored"
LOST_REASON = "GpuLost"
UNMONITORED_REASON = "GpuUnmonitored"


class Scope(StrEnum):
    """What a driver taint takes out of service."""

    NOTHING = "nothing"  # counted, never fenced (an application's Xid)
    DEVICE = "device"  # the one GPU
    NODE = "node"  # the node: the GPU's fault is the node's
    UNKNOWN = "unknown"  # the GPU's health is not known: suspect, never a fault


@dataclass(frozen=True)
class DriverTaint:
    """One taint the driver put on one of its devices."""

    device: DraDevice
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Meaning:
    scope: Scope
    reason: str
    severity: Severity | None  # None: no fault
    why: str


def driver_taints(
    slices: Iterable[Mapping[str, Any]], drivers: frozenset[str] = GPU_DRIVERS
) -> tuple[DriverTaint, ...]:
    """The taints the GPU drivers publish on their devices (taints of other keys, from
    other drivers, included: meaning() leaves out what is not the driver's)."""
    devices = {
        (d.key.pool, d.key.device): d
        for node in slice_devices(slices, drivers).values()
        for d in node
    }
    found: list[DriverTaint] = []
    for item in slices:
        spec = item.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name", ""))
        for device in spec.get("devices") or []:
            known = devices.get((pool, str(device.get("name", ""))))
            if known is None or known.key.driver != spec.get("driver"):
                continue
            for taint in device.get("taints") or []:
                found.append(
                    DriverTaint(
                        known,
                        str(taint.get("key", "")),
                        str(taint.get("value", "")),
                        str(taint.get("effect", "")),
                    )
                )
    return tuple(found)


def meaning(taint: DriverTaint, overrides: Mapping[int, XidRow] | None = None) -> Meaning | None:
    """What the taint means; None for a key that is not the driver's health taint."""
    if taint.key == LOST_KEY:
        return Meaning(
            Scope.NODE, LOST_REASON, Severity.P0, "NVML says the GPU is lost (off the bus)"
        )
    if taint.key == UNMONITORED_KEY:
        return Meaning(Scope.UNKNOWN, UNMONITORED_REASON, None, "the driver cannot watch the GPU")
    if taint.key != XID_KEY:
        return None
    try:
        code = int(taint.value)
    except ValueError:
        return Meaning(
            Scope.UNKNOWN, UNMONITORED_REASON, None, f"an Xid taint without a code: {taint.value!r}"
        )
    row = classify(code, overrides)
    return Meaning(
        scope_of(row), row.reason, row.severity if row.node_fault else None, row.description
    )


# What names an Xid of the NVLink fabric in its row: the reason (NvlinkError74), the
# NVIDIA workflow it follows (WORKFLOW_NVLINK5_ERR), or NVIDIA's description
# ("NVLINK: SW Defined Error", "Link Training Failed" of ALI, NVLink's link bring-up).
_FABRIC = ("NVLINK", "LINK TRAINING")


def scope_of(row: XidRow) -> Scope:
    """What an Xid takes out of service, whichever source reported it."""
    if not row.node_fault:
        return Scope.NOTHING
    said = f"{row.reason} {row.nvidia} {row.description}".upper()
    if row.action is Action.REBOOT or any(word in said for word in _FABRIC):
        return Scope.NODE
    return Scope.DEVICE


@dataclass(frozen=True)
class DriverReport:
    """What the driver's taints on one device say, as the device plan reads a
    kubelet's report: the device's health, why, and whether the node goes with it."""

    device: DraDevice
    health: DeviceHealth  # Unhealthy (a fault), or Unknown (unmonitored)
    message: str  # the taint and what it means ("gpu.nvidia.com/xid=79: ...")
    node_wide: str  # why the fault is the node's; "" when it stays on the device
    since: str  # when the driver tainted it (the API server's timeAdded), or ""
    holders: tuple[PodView, ...] = ()  # the pods holding the device


_RANK = {Scope.NODE: 3, Scope.DEVICE: 2, Scope.UNKNOWN: 1}


def reports(
    devices: Iterable[DraDevice],
    pods: Iterable[PodView] = (),
    overrides: Mapping[int, XidRow] | None = None,
) -> tuple[DriverReport, ...]:
    """One report per device the driver tainted with a meaning (its worst taint),
    with the pods holding it; an application's Xid, and taints not the driver's
    health taints (gpuheal's own fence among them), report nothing."""
    held = tuple(pods)
    found: list[DriverReport] = []
    for device in devices:
        read = [
            (m, t)
            for t in device.taints
            if (m := meaning(DriverTaint(device, t.key, t.value, t.effect), overrides)) is not None
            and m.scope is not Scope.NOTHING
        ]
        if not read:
            continue
        worst, taint = max(read, key=lambda pair: _RANK[pair[0].scope])
        shown = f"{taint.key}={taint.value}" if taint.value else taint.key
        found.append(
            DriverReport(
                device,
                DeviceHealth.UNKNOWN if worst.scope is Scope.UNKNOWN else DeviceHealth.UNHEALTHY,
                f"{shown}: {worst.why}",
                f"{shown}: {worst.why}" if worst.scope is Scope.NODE else "",
                taint.time_added,
                tuple(p for p in held if any(d.key == device.key for d in p.held)),
            )
        )
    return tuple(found)
