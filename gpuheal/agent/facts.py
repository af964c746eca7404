"""Facts the agent reports on its Node besides its verdict, for the health gate,
`gpuheal status` and `gpuheal audit`: driver and CUDA versions, error counters
since the agent started, the compute processes on the GPUs with the pod
each belongs to, and the node's start-order facts (agent/environment.py).

The counters start at zero when the agent starts (COUNTERS_SINCE says when):
a reboot restarts the agent, so a gate comparing counters against a baseline
taken before the reboot must look at COUNTERS_SINCE first.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from gpuheal.clock import iso
from gpuheal.model import (
    AGENT_ACCESS,
    COUNTERS_SINCE,
    CUDA_VERSION,
    DRIVER_VERSION,
    ECC_ERRORS,
    GPU_PROCESSES,
    LAST_GPU_ERROR,
    MIG_LAYOUT,
    NODE_ENVIRONMENT,
    VBIOS_VERSION,
    XID_ERRORS,
)

log = logging.getLogger(__name__)

FACT_KEYS = (
    DRIVER_VERSION,
    CUDA_VERSION,
    VBIOS_VERSION,
    XID_ERRORS,
    ECC_ERRORS,
    COUNTERS_SINCE,
    LAST_GPU_ERROR,
    GPU_PROCESSES,
    MIG_LAYOUT,
    NODE_ENVIRONMENT,
    AGENT_ACCESS,
)

# The kubelet names a pod's cgroup after its UID. cgroupfs driver:
#   /kubepods/burstable/pod1b2c3d4e-...-0123456789ab/<container id>
#   /kubepods/pod<uid>/<container id>                      (Guaranteed QoS)
# systemd driver (the UID's dashes become underscores):
#   /kubepods.slice/kubepods-besteffort.slice/
#       kubepods-besteffort-pod1b2c3d4e_..._0123456789ab.slice/cri-containerd-<id>.scope
#   /kubepods.slice/kubepods-pod<uid>.slice/...            (Guaranteed QoS)
# Static pods' UIDs are 32 hex digits without separators.
_POD_UID = re.compile(
    r"(?:^|[/-])pod("
    r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32}"
    r")(?:\.slice)?(?:/|$)"
)


def vbios_text(versions: Iterable[str]) -> str:
    """The node's VBIOS fact: the one version its GPUs run, or the ones they disagree
    on, sorted and comma-separated; "" when none could be read."""
    return ",".join(sorted({v for v in versions if v}))


def cuda_text(version: int) -> str:
    """NVML's CUDA driver version (12040) as people write it ("12.4")."""
    return f"{version // 1000}.{version % 1000 // 10}"


def pod_uid(cgroup: str) -> str:
    """The UID of the pod a process belongs to, from the text of /proc/<pid>/cgroup
    (cgroup v1: one line per hierarchy; v2: the single "0::" line); "" when it is
    in no pod. Lines that are not "id:controllers:path" are skipped."""
    for line in cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or "kubepods" not in parts[2]:
            continue
        match = _POD_UID.search(parts[2].lower())
        if match:
            return match.group(1).replace("_", "-")
    return ""


UNKNOWN_POD = "?"


def pod_of_pid(proc_root: Path, pid: int) -> str:
    """The pod UID of a process, "" when it is in no pod, "?" when its cgroup
    cannot be read (it exited, or procRoot is not the host's /proc: without
    hostPID or the host's /proc mounted, NVML's host PIDs are not visible)."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(errors="replace")
    except OSError:
        return UNKNOWN_POD
    return pod_uid(text)


def gpu_processes(pids: Iterable[int], proc_root: Path, cap: int) -> str:
    """The GPU_PROCESSES value: "pid@podUID,..." sorted by pid ("pid@" outside any
    pod, "pid@?" unknown), at most `cap` entries (an annotation must stay small:
    the rest are left out and logged)."""
    unique = sorted(set(pids))
    if len(unique) > cap:
        log.warning(
            "too many GPU processes to report",
            extra={"processes": len(unique), "reported": cap},
        )
        unique = unique[:cap]
    return ",".join(f"{pid}@{pod_of_pid(proc_root, pid)}" for pid in unique)


class Counters:
    """Xid events and uncorrectable ECC errors since the agent started.

    Xids arrive on the NVML event thread and the kernel-log thread; the ECC
    total is read by the NVML probe each round (the driver's volatile count,
    which a driver reload or reboot resets).
    """

    def __init__(self, started: dt.datetime) -> None:
        self.since = iso(started, "seconds")
        self._lock = threading.Lock()
        self.xids = 0
        self.ecc: int | None = None
        self.last_error = ""

    def xid(self, at: dt.datetime) -> None:
        with self._lock:
            self.xids += 1
            self.last_error = iso(at, "seconds")

    def ecc_total(self, total: int, at: dt.datetime) -> None:
        """The round's uncorrectable total; an increase is a new error (first seen now)."""
        with self._lock:
            if total > (self.ecc or 0):
                self.last_error = iso(at, "seconds")
            self.ecc = total

    def facts(self) -> dict[str, str]:
        with self._lock:
            out = {XID_ERRORS: str(self.xids), COUNTERS_SINCE: self.since}
            if self.ecc is not None:
                out[ECC_ERRORS] = str(self.ecc)
            if self.last_error:
                out[LAST_GPU_ERROR] = self.last_error
            return out


def changed_facts(written: Mapping[str, str], facts: Mapping[str, str]) -> dict[str, str]:
    """The facts whose value differs from what the Node already says."""
    return {key: value for key, value in facts.items() if written.get(key) != value}
