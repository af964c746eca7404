"""The agent's state files (kernel log cursor, sticky faults): read strictly;
a file that cannot be read as written is set aside and the agent starts fresh.

A state file can be truncated by a full disk, zeroed by a filesystem repair,
or edited by hand. None of that may stop the agent: it would crash-loop on the
node, reporting nothing. So a bad file is renamed to `<file>.corrupt` (for a
person to look at), logged once, counted, and forgotten.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import msgspec

log = logging.getLogger(__name__)

T = TypeVar("T")

CORRUPT_SUFFIX = ".corrupt"


def set_aside(path: Path) -> Path:
    return path.with_name(path.name + CORRUPT_SUFFIX)


def load_state(path: Path, kind: type[T], counted: Callable[[], None]) -> T | None:
    """The file decoded as `kind`; None when there is none, or when it cannot be
    read or decoded (then it is set aside, logged and `counted`)."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as err:
        reason = err.strerror if isinstance(err, OSError) else str(err)
        problem = str(reason)[:300]
    counted()
    aside = set_aside(path)
    try:
        path.replace(aside)
    except OSError as err:
        log.warning(
            "agent state file unreadable and cannot be set aside; starting fresh",
            extra={"path": str(path), "error": problem, "rename_error": err.strerror},
        )
        return None
    log.warning(
        "agent state file unreadable, set aside; starting fresh",
        extra={"path": str(path), "kept_as": str(aside), "error": problem},
    )
    return None
