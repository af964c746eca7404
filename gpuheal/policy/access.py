"""What the agent can reach on its node (`gpuheal.io/agent-access`): NVML (loaded or
not, from which library, the driver's and NVML's versions), the GPUs NVML sees
against the GPUs the node offers, and the kernel log. Pure: the agent finds the
facts (agent/app.py), `gpuheal doctor` and `gpuheal status` read them back.

A piece the agent cannot reach is a problem with a reason, the one its GPUHealthy
condition carries while no fault is reported, never a fault: an agent that cannot
see is a misconfigured agent (the chart's `platform`, the runtime class, the driver
mount; docs/deploy.md), and draining every node of a pool for it would turn a
configuration mistake into an outage.

The value is `name=value` pairs joined by ";", e.g.
`nvml=ok;gpus=8/8;kmsg=ok;driver=550.54.15;nvml-version=12.550.54.15;library=/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15`
`gpus` is seen/expected (`8/?`: the node says nothing to expect).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# NVML's state: loaded, turned off in the agent's config, or why it did not load
# (the NVML error codes nvmlInit answers with: LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED,
# NO_PERMISSION; anything else is `error`). `pending`: not tried yet.
NVML_OK = "ok"
NVML_OFF = "off"
NVML_PENDING = "pending"
NVML_NO_LIBRARY = "library-not-found"
NVML_NO_DRIVER = "driver-not-loaded"
NVML_NO_PERMISSION = "no-permission"
NVML_ERROR = "error"
NVML_STATES = (
    NVML_OK,
    NVML_OFF,
    NVML_PENDING,
    NVML_NO_LIBRARY,
    NVML_NO_DRIVER,
    NVML_NO_PERMISSION,
    NVML_ERROR,
)

# The kernel log's: read, turned off, not opened yet, or it cannot be opened or read.
KMSG_OK = "ok"
KMSG_OFF = "off"
KMSG_PENDING = "pending"
KMSG_UNREADABLE = "unreadable"
KMSG_STATES = (KMSG_OK, KMSG_OFF, KMSG_PENDING, KMSG_UNREADABLE)

# The GPUHealthy condition's reasons for what the agent cannot reach.
NVML_LIBRARY_NOT_FOUND = "NvmlLibraryNotFound"
NVML_DRIVER_NOT_LOADED = "NvmlDriverNotLoaded"
NVML_NO_PERMISSION_REASON = "NvmlNoPermission"
NVML_UNAVAILABLE = "NvmlUnavailable"
NO_GPUS_VISIBLE = "NoGpusVisible"
KERNEL_LOG_UNREADABLE = "KernelLogUnreadable"
REASONS = (
    NVML_LIBRARY_NOT_FOUND,
    NVML_DRIVER_NOT_LOADED,
    NVML_NO_PERMISSION_REASON,
    NVML_UNAVAILABLE,
    NO_GPUS_VISIBLE,
    KERNEL_LOG_UNREADABLE,
)

_NVML_REASON = {
    NVML_NO_LIBRARY: NVML_LIBRARY_NOT_FOUND,
    NVML_NO_DRIVER: NVML_DRIVER_NOT_LOADED,
    NVML_NO_PERMISSION: NVML_NO_PERMISSION_REASON,
    NVML_ERROR: NVML_UNAVAILABLE,
}
_NVML_WHY = {
    NVML_NO_LIBRARY: (
        "libnvidia-ml.so.1 is not in the agent's container: the NVIDIA runtime did not "
        "mount the driver (gpu-operator with CDI: runtimeClassName nvidia; GKE: the host's "
        "/home/kubernetes/bin/nvidia mounted, LD_LIBRARY_PATH set; the chart's `platform`)"
    ),
    NVML_NO_DRIVER: (
        "NVML found no driver: the NVIDIA kernel module is not loaded, or the container "
        "was not handed /dev/nvidiactl"
    ),
    NVML_NO_PERMISSION: "NVML may not open the GPU devices (the container's device access)",
    NVML_ERROR: "NVML did not initialise",
}

# A library path as the agent writes it: no separators of this format, bounded.
MAX_TEXT = 256
_UNSAFE = re.compile(r"[;=\s]")
_VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,64}")
_GPUS = re.compile(r"(?P<seen>\d{1,4}|\?)/(?P<expected>\d{1,4}|\?)")


@dataclass(frozen=True)
class Access:
    nvml: str = NVML_PENDING
    kernel_log: str = KMSG_PENDING
    gpus: int | None = None  # NVML's device count; None: NVML not loaded
    expected: int | None = None  # the GPUs the node offers; None: nothing to expect
    driver: str = ""
    nvml_version: str = ""
    library: str = ""  # the libnvidia-ml file loaded
    # Why NVML or the kernel log could not be reached, as the error said it (not in the
    # annotation: the condition's message and the log carry it).
    nvml_error: str = ""
    kernel_log_error: str = ""


@dataclass(frozen=True)
class Problem:
    reason: str  # one of REASONS
    message: str


def nvml_state(code: int | None) -> str:
    """NVML's state after nvmlInit answered `code` (None: it succeeded)."""
    # The codes of nvml.h: NVML_ERROR_NO_PERMISSION 4, _DRIVER_NOT_LOADED 9,
    # _LIBRARY_NOT_FOUND 12.
    return {None: NVML_OK, 4: NVML_NO_PERMISSION, 9: NVML_NO_DRIVER, 12: NVML_NO_LIBRARY}.get(
        code, NVML_ERROR
    )


def problems(access: Access) -> tuple[Problem, ...]:
    """What the agent cannot reach, the worst first (NVML, then the GPUs, then the
    kernel log: without NVML nothing vouches for the GPUs; without the kernel log,
    Xids still arrive through NVML's events)."""
    found = []
    reason = _NVML_REASON.get(access.nvml)
    if reason is not None:
        said = f": {access.nvml_error}" if access.nvml_error else ""
        found.append(Problem(reason, f"{_NVML_WHY[access.nvml]}{said}"))
    elif access.nvml == NVML_OK and access.gpus == 0 and access.expected:
        found.append(
            Problem(
                NO_GPUS_VISIBLE,
                f"NVML sees no GPU, the node offers {access.expected}: the container was not "
                "handed the GPU devices (NVIDIA_VISIBLE_DEVICES, the runtime class)",
            )
        )
    if access.kernel_log == KMSG_UNREADABLE:
        said = f" ({access.kernel_log_error})" if access.kernel_log_error else ""
        events = "Xids come from NVML's events only" if access.nvml == NVML_OK else "no Xids"
        found.append(
            Problem(
                KERNEL_LOG_UNREADABLE,
                f"the kernel log cannot be read{said}: {events}; runc and crun hand no "
                "unprivileged container /dev/kmsg (agent.kernelLog in the chart)",
            )
        )
    return tuple(found)


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)[:MAX_TEXT]


def encode(access: Access) -> str:
    seen = "?" if access.gpus is None else str(access.gpus)
    expected = "?" if access.expected is None else str(access.expected)
    parts = [f"nvml={access.nvml}", f"gpus={seen}/{expected}", f"kmsg={access.kernel_log}"]
    for name, value in (
        ("driver", access.driver),
        ("nvml-version", access.nvml_version),
        ("library", access.library),
    ):
        if value:
            parts.append(f"{name}={_safe(value)}")
    return ";".join(parts)


def decode(text: str) -> Access | None:
    """The annotation's value, or None when it is not one the agent writes."""
    fields: dict[str, str] = {}
    for part in text.split(";"):
        name, sep, value = part.partition("=")
        if not sep or name in fields:
            return None
        fields[name] = value
    gpus = _GPUS.fullmatch(fields.get("gpus", ""))
    nvml, kmsg = fields.get("nvml", ""), fields.get("kmsg", "")
    if gpus is None or nvml not in NVML_STATES or kmsg not in KMSG_STATES:
        return None
    versions = [fields.get(k, "") for k in ("driver", "nvml-version")]
    if any(v and not _VERSION.fullmatch(v) for v in versions):
        return None
    return Access(
        nvml=nvml,
        kernel_log=kmsg,
        gpus=None if gpus["seen"] == "?" else int(gpus["seen"]),
        expected=None if gpus["expected"] == "?" else int(gpus["expected"]),
        driver=versions[0],
        nvml_version=versions[1],
        library=fields.get("library", "")[:MAX_TEXT],
    )


def describe(access: Access) -> str:
    """One line of what the agent reaches, for people (doctor, status)."""
    if access.nvml == NVML_OK:
        versions = ", ".join(
            v
            for v in (
                f"driver {access.driver}" if access.driver else "",
                f"NVML {access.nvml_version}" if access.nvml_version else "",
                access.library,
            )
            if v
        )
        nvml = f"NVML loaded ({versions})" if versions else "NVML loaded"
        expected = f" of {access.expected} offered" if access.expected is not None else ""
        nvml += f", {access.gpus} GPUs seen{expected}"
    else:
        nvml = f"NVML {access.nvml}"
    return f"{nvml}; kernel log {access.kernel_log}"
