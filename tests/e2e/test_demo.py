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


def test_demo_prints_the_clusters_gpu_state() -> None:
    result = subprocess.run(
        [_gpuheal(), "demo", "--nodes", "3", "--replicas", "5", "--gpus-per-pod", "4"],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "3 fake GPU nodes Ready" in out
    assert "5 pods x 4 GPU scheduled and Running" in out
    assert "3/3 nodes Ready, 24 GPUs, 20 allocated (83%), 5/5 GPU pods running" in out
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
