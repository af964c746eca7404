"""`gpuheal demo` as a person runs it: the installed console script."""

from __future__ import annotations

import os
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


def test_demo_heals_a_faulty_gpu_node_end_to_end() -> None:
    result = subprocess.run(
        [_gpuheal(), "demo", "--nodes", "4", "--replicas", "5", "--gpus-per-pod", "2"],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "4 fake GPU nodes Ready" in out
    assert "5 pods x 2 GPU scheduled and Running" in out
    assert "4/4 nodes Ready, 32 GPUs, 10 allocated (31%), 5/5 GPU pods running" in out
    assert "agent: GPUHealthy=False XidCritical79 on GPU-" in out
    assert "controller: quarantined (taint gpuheal.io/gpu-fault=<fault id>:NoSchedule)" in out
    assert "all 5 replicas Running again, none on" in out
    assert ": 1 (handled exactly once)" in out
    assert "agent: GPUHealthy=True, fault cleared" in out
    assert "returned to the pool" in out
    assert out.rstrip().endswith("control plane stopped")


def test_demo_without_binaries_says_how_to_build_them(tmp_path: Path) -> None:
    env = dict(os.environ, GPUHEAL_TESTENV_DIR=str(tmp_path / "nothing-here"))
    result = subprocess.run(
        [_gpuheal(), "demo"], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert result.returncode == 1
    assert "etcd: binary" in result.stderr
    assert "make testenv" in result.stderr
    assert "Traceback" not in result.stderr
