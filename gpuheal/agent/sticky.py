"""Faults that arrive as events (Xids, kernel lines) and stay until this boot ends
(or `xidHoldSeconds` passes), persisted with the boot id beside the kernel log's
cursor: the event happens once, the verdict is made every round."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from gpuheal.agent.findings import ProbeFinding
from gpuheal.agent.statefile import load_state
from gpuheal.model import Severity


class StickyItem(msgspec.Struct):
    at: float  # time.time() when first seen
    reason: str
    severity: Severity
    message: str
    devices: list[str] = []
    immediate: bool = False

    def __post_init__(self) -> None:
        if not math.isfinite(self.at):
            raise ValueError(f"at must be a finite time, got {self.at}")


class StickyFile(msgspec.Struct):
    """The sticky faults' file, exactly as `StickyEvents` writes it."""

    boot_id: str
    items: dict[str, StickyItem] = {}


class StickyEvents:
    """Faults that arrive as events (Xids, kernel lines) and stay until this boot
    ends (or `hold_s` passes): a GPU that threw Xid 79 is broken until reset.
    Persisted with the boot id, so an agent restart keeps them without re-reading
    old kernel lines."""

    def __init__(
        self,
        path: Path,
        boot_id: str,
        hold_s: float | None,
        counted: Callable[[], None] = lambda: None,
    ) -> None:
        self.path = path
        self.boot_id = boot_id
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._items: dict[str, tuple[float, ProbeFinding]] = {}
        saved = load_state(path, StickyFile, counted)  # a broken file: set aside, counted
        if saved is not None and saved.boot_id == boot_id:
            self._items = {
                key: (
                    item.at,
                    ProbeFinding(
                        item.reason,
                        item.severity,
                        item.message,
                        tuple(item.devices),
                        item.immediate,
                    ),
                )
                for key, item in saved.items.items()
            }

    def _save(self) -> None:
        items = {
            key: StickyItem(at, f.reason, f.severity, f.message, list(f.devices), f.immediate)
            for key, (at, f) in self._items.items()
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(StickyFile(self.boot_id, items)))
        tmp.replace(self.path)

    def add(self, finding: ProbeFinding) -> None:
        key = f"{finding.reason}/{','.join(finding.devices)}"
        with self._lock:
            if key not in self._items:
                self._items[key] = (time.time(), finding)
                self._save()

    def clear_devices(self, devices: tuple[str, ...]) -> None:
        """The GPUs were reset: the events they threw are over (a reset is the remedy
        the catalogue names for them, as a reboot is for all)."""
        with self._lock:
            gone = [k for k, (_, f) in self._items.items() if set(f.devices) & set(devices)]
            for key in gone:
                del self._items[key]
            if gone:
                self._save()

    def current(self) -> tuple[ProbeFinding, ...]:
        with self._lock:
            if self.hold_s is not None:
                now = time.time()
                expired = [k for k, (at, _) in self._items.items() if now - at >= self.hold_s]
                for key in expired:
                    del self._items[key]
                if expired:
                    self._save()
            return tuple(f for _, f in self._items.values())
