"""The cgroup root of a real node (gpuheal/sim/realnode.py): made before the kubelet
starts (it refuses a root that does not exist), removed when the node stops.

It lies inside this process's memory cgroup, so the node's pods count against what
the machine gave the tests, and the same path is made in every other hierarchy
(cgroup v1 gives one path per hierarchy; the kubelet names one root for all).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

_CGROUP_FS = ("cgroup", "cgroup2")


def _mountpoints() -> list[Path]:
    """Each cgroup hierarchy mounted on this machine."""
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, fstype, *_ = line.split()
        if fstype in _CGROUP_FS:
            points.append(Path(where))
    return points


def _memory_path() -> str:
    """This process's memory cgroup (v1), or its one cgroup (v2)."""
    unified = "/"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
        if controllers == "":
            unified = path
    return unified


@dataclass
class CgroupRoot:
    """One cgroup path, made in every hierarchy; `remove` takes away what `create` made
    and everything the kubelet and runc made under it."""

    path: str
    made: list[Path] = field(default_factory=list)

    @classmethod
    def beside_this_process(cls, name: str) -> CgroupRoot:
        return cls(f"{_memory_path().rstrip('/')}/{name}")

    def create(self) -> None:
        relative = Path(self.path.lstrip("/"))
        for point in _mountpoints():
            for part in [*reversed(relative.parents), relative][1:]:
                directory = point / part
                if directory.exists():
                    continue
                directory.mkdir()
                self.made.append(directory)
                _inherit_cpuset(directory)

    def remove(self, timeout_s: float = 15.0) -> None:
        """Remove every cgroup under the root, innermost first, then those `create` made.
        A cgroup is busy until its last task has exited: retried until `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        relative = self.path.lstrip("/")
        while True:
            left = [p / relative for p in _mountpoints() if (p / relative).exists()]
            for root in left:
                for walked, _, _ in os.walk(root, topdown=False):
                    with contextlib.suppress(OSError):
                        Path(walked).rmdir()
            for directory in reversed(self.made):
                with contextlib.suppress(FileNotFoundError, OSError):
                    directory.rmdir()
            if not any(d.exists() for d in self.made) or time.monotonic() > deadline:
                return
            time.sleep(0.2)


def _inherit_cpuset(directory: Path) -> None:
    """cgroup v1's cpuset starts empty, and an empty one admits no task: copy the parent's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        own, parent = directory / name, directory.parent / name
        if own.exists() and parent.exists() and not own.read_text().strip():
            own.write_text(parent.read_text())
