"""`gpuheal demo` as a person runs it: the installed console script."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)


def _gpuheal() -> str:
    # The console script installed beside this interpreter (the venv), else on PATH.
    beside = Path(sys.executable).parent / "gpuheal"
    path = str(beside) if beside.is_file() else shutil.which("gpuheal")
    assert path, "the gpuheal console script is not installed (pip install -e .)"
    return path


def test_demo_runs_the_whole_product_unattended_and_leaves_nothing_behind() -> None:
    before = set(_gpuheal_processes())
    result = subprocess.run(
        [
            _gpuheal(),
            "demo",
            "--nodes",
            "8",
            "--replicas",
            "8",
            "--gpus-per-pod",
            "2",
            "--dra",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "8 fake GPU nodes Ready" in out
    assert "8 agents (fake NVML, 8 GPUs each) started" in out
    for change in (
        "(XidCritical79)",
        "-> quarantined (EccUncorrectable)",
        "fault cleared: recovering -> healthy",
    ):
        assert change in out, change
    summary = out[out.index("== Summary") :]
    assert summary.count("  1\n") == 4  # one GPUFault record for each of the 4 faults
    assert "4 faults, each handled exactly once" in summary
    # GPU pods moved, per fault, are the evictions that happened: they add up to the
    # controller's count of evictions (8 pods spread over 8 nodes: each of the 4
    # faulty nodes had one, the alert storm's included, though it was drained before
    # the demo looked).
    rows = summary.splitlines()[2:6]
    moved = [int(row.split()[-2]) for row in rows]
    (evicted,) = re.findall(r"; (\d+) GPU pods evicted;", summary)
    assert sum(moved) == int(evicted) and all(m >= 1 for m in moved), (rows, evicted)
    assert "1 node(s) recovered" in summary
    # The operator's maintenance round trip, carried out by the demo's controller.
    for step in ("maintenance start", "maintenance finish"):
        (said,) = [line for line in out.splitlines() if line.startswith(f"$ gpuheal {step}")]
        assert said.endswith("# exit 0"), said
    # --dra 1: one DRA-only node, and its bad card fenced alone.
    assert "1 DRA-only GPU nodes" in out
    fenced = re.search(
        r"^DRA: dra-node-000's gpu-\d fenced alone by DeviceTaintRule gpuheal-\S+ in [\d.]+s, "
        r"dra-node-000-serve-0 evicted in [\d.]+s; the node keeps its 7 other cards "
        r"\(node taints: none\)$",
        out,
        re.MULTILINE,
    )
    assert fenced, out[-2000:]
    assert out.rstrip().endswith("control plane stopped")
    assert set(_gpuheal_processes()) - before == set()


def _gpuheal_processes() -> list[str]:
    """Command lines of running gpuheal agent/controller processes."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gpuheal.cli" in argv and (b"agent" in argv or b"controller" in argv):
            found.append(b" ".join(argv).decode(errors="replace"))
    return found


def test_demo_without_binaries_says_how_to_build_them(tmp_path: Path) -> None:
    env = dict(os.environ, GPUHEAL_TESTENV_DIR=str(tmp_path / "nothing-here"))
    result = subprocess.run(
        [_gpuheal(), "demo"], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert result.returncode == 1
    assert "etcd: binary" in result.stderr
    assert "make testenv" in result.stderr
    assert "Traceback" not in result.stderr
