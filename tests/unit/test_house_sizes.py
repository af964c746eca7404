"""The size limits hold (tools/house_sizes.py): nothing new over them, what is
listed over them only shrinks and leaves the list once under, and the packages
already split to the limits (the fault lifecycle, gpuheal/policy/plan/) stay so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "house_sizes.py"


def test_the_size_ratchet_holds() -> None:
    done = subprocess.run(
        [sys.executable, str(TOOL), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_ratchet_names_a_function_that_grows(tmp_path: Path) -> None:
    """The check can fail: a copy of gpuheal/ with one long function in the plan."""
    package = tmp_path / "gpuheal" / "policy" / "plan"
    package.mkdir(parents=True)
    body = "".join(f"    x{i} = {i}\n" for i in range(70))
    (package / "long.py").write_text(f"def long() -> None:\n{body}")
    code = (
        "import sys, pathlib; sys.path.insert(0, sys.argv[1]); import house_sizes as h; "
        "print(h.problems(h.sizes(pathlib.Path(sys.argv[2]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(TOOL.parent), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (
        "new, over its limit (71 lines): function gpuheal/policy/plan/long.py:long" in done.stdout
    )
