"""nvidia-smi fallback for hosts where NVML cannot be loaded by the agent."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from gpuheal.agent.findings import ProbeFinding, ProbeResult
from gpuheal.model import Severity

PROBE = "smi"
_BAD_VALUES = ("n/a", "unable to determine", "unknown error", "[gpu is lost]")


def parse_smi(output: str, expected: int | None) -> list[ProbeFinding]:
    """Findings from `nvidia-smi --query-gpu=index,uuid --format=csv,noheader` output."""
    rows = [line.strip() for line in output.splitlines() if line.strip()]
    if not rows:
        return [ProbeFinding("GpuMissing", Severity.P0, "nvidia-smi listed no GPU")]
    found = []
    seen = 0
    for row in rows:
        fields = [f.strip() for f in row.split(",")]
        lowered = row.lower()
        if len(fields) < 2 or any(bad in lowered for bad in _BAD_VALUES):
            found.append(ProbeFinding("GpuLost", Severity.P0, f"nvidia-smi: {row[:200]}"))
            continue
        seen += 1
    if expected is not None and seen < expected:
        found.append(
            ProbeFinding("GpuMissing", Severity.P0, f"{expected} GPUs expected, {seen} visible")
        )
    return found


def run_smi(command: Sequence[str], expected: int | None, timeout_s: float) -> ProbeResult:
    argv = [*command, "--query-gpu=index,uuid", "--format=csv,noheader"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return ProbeResult(PROBE, level=True, ran=False, error=f"{command[0]} not found")
    except subprocess.TimeoutExpired:
        return ProbeResult(
            PROBE, level=True, ran=False, error=f"{command[0]} timed out after {timeout_s:g}s"
        )
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip()[:200]
        finding = ProbeFinding(
            "SmiFailed", Severity.P0, f"nvidia-smi failed ({done.returncode}): {detail}"
        )
        return ProbeResult(PROBE, level=True, ran=True, findings=(finding,))
    return ProbeResult(
        PROBE, level=True, ran=True, findings=tuple(parse_smi(done.stdout, expected))
    )
