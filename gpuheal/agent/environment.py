"""Environment checks from the onboarding runbooks: warnings, never faults."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuheal.agent.findings import ProbeResult

PROBE = "env"


def check_environment(device_paths: Sequence[Path], driver_version_path: Path) -> ProbeResult:
    warnings = [f"{path} is missing" for path in device_paths if not path.exists()]
    try:
        if not driver_version_path.read_text().strip():
            warnings.append(f"{driver_version_path} is empty: driver version unreadable")
    except OSError as err:
        warnings.append(f"driver version unreadable at {driver_version_path}: {err.strerror}")
    return ProbeResult(PROBE, ran=True, warnings=tuple(warnings))
