"""A Secret volume as the kubelet writes it (its AtomicWriter), for tests and the demo.

    <dir>/..2026_12_01_02_30_12.123456789/token   the content, one directory per version
    <dir>/..data -> ..2026_12_01_02_30_12.123456789
    <dir>/token -> ..data/token

An update writes a new version directory, points a new symlink at it and renames
that over `..data` (one atomic step), then removes the old directory: a reader
sees the old content or the new, never a mix, and the path it opened stays.
"""

from __future__ import annotations

import datetime as dt
import itertools
import shutil
from collections.abc import Mapping
from pathlib import Path

_DATA = "..data"
_versions = itertools.count()


class SecretVolume:
    def __init__(self, root: Path, files: Mapping[str, str]) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._write(files)
        for name in files:
            (root / name).symlink_to(f"{_DATA}/{name}")

    def path(self, name: str) -> Path:
        return self.root / name

    def update(self, files: Mapping[str, str]) -> None:
        """Swap in new content as the kubelet does after the Secret changed."""
        old = (self.root / _DATA).readlink()
        self._write(files)
        shutil.rmtree(self.root / old)

    def _write(self, files: Mapping[str, str]) -> None:
        now = dt.datetime.now(dt.UTC)
        version = f"..{now:%Y_%m_%d_%H_%M_%S}.{next(_versions):09d}"
        (self.root / version).mkdir()
        for name, content in files.items():
            (self.root / version / name).write_text(content)
        staged = self.root / f"{_DATA}_tmp"
        staged.symlink_to(version)
        staged.rename(self.root / _DATA)  # rename(2): replaces the old link atomically
