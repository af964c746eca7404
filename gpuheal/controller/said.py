"""What ops/ says on a terminal's stderr (warnings, a drain's blockers, a validation
Job's progress), when the leader runs ops/'s steps: each line logged with what it
is about, and the latest kept with a count, for a request's progress record."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from rich.console import Console

log = logging.getLogger(__name__)
KEPT = 20


class SaidLines:
    """A file for rich's Console."""

    def __init__(self, about: Mapping[str, Any]) -> None:
        self.about = dict(about)
        self.lines: list[str] = []
        self.count = 0  # every line said, kept or not
        self.changed = asyncio.Event()

    def say(self, line: str) -> None:
        line = line.strip()
        if not line:
            return
        log.info(line, extra=self.about)
        self.lines = [*self.lines[-(KEPT - 1) :], line]
        self.count += 1
        self.changed.set()

    def write(self, data: str) -> int:
        for line in data.splitlines():
            self.say(line)
        return len(data)

    def flush(self) -> None:
        pass

    def console(self) -> Console:
        # Wide, plain, no terminal: ops/'s progress bars stay off, lines stay whole.
        return Console(file=self, width=400, color_system=None)  # type: ignore[arg-type]
