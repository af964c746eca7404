"""A pushed source's port (gpuheal/controller/signals.py::SignalPort) over plain
callables: for tests and benchmarks that hear what a source submits, resolves and
when it settles, without a controller behind it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuheal.model import FaultSignal


def _taken(_signal: FaultSignal) -> bool:
    return True


def _none_held(_node: str, _fault_id: str) -> int:
    return 0


def _every_node(_node: str) -> bool:
    return True


def _nothing() -> None:
    return None


@dataclass
class Port:
    submit: Callable[[FaultSignal], bool] = _taken
    resolve: Callable[[str, str], int] = _none_held
    managed: Callable[[str], bool] = _every_node
    settled: Callable[[], None] = _nothing
