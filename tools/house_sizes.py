"""The house's size limits (issue 45's acceptance): no module in gpuheal/ over 700
lines, no class over 300, no function over 60 (argparse tables aside). What is
over them today is listed in OVER with its size, to be cut down: a listed one may
shrink, never grow, and nothing new may join it (tests/unit/test_house_sizes.py).

    python tools/house_sizes.py           # what is over, and by how much
    python tools/house_sizes.py --check   # exit 1 if something new is over, or grew
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMITS = {"module": 700, "class": 300, "function": 60}

# Over a limit today, with its size in lines then: "kind path[:name]" -> lines.
OVER: dict[str, int] = {
    "module gpuheal/config/__init__.py": 806,
    "module gpuheal/policy/devices.py": 771,
    "class gpuheal/controller/dcgm_source.py:DcgmSource": 482,
    "class gpuheal/controller/reconciler.py:Reconciler": 399,
    "class gpuheal/agent/app.py:Agent": 396,
    "class gpuheal/agent/repair.py:Repairer": 343,
    "class gpuheal/sim/controlplane.py:ControlPlane": 330,
    "class gpuheal/kube/informer.py:Informer": 303,
    "function gpuheal/ops/movement.py:pending_causes": 86,
    "function gpuheal/sim/demo.py:_scenario": 85,
    "function gpuheal/ops/visibility.py:_gpu_counts": 82,
    "function gpuheal/sim/pki.py:create_pki": 79,
    "function gpuheal/ops/doctor.py:gather": 78,
    "function gpuheal/ops/visibility.py:_taints": 75,
    "function gpuheal/sources/alertmanager.py:interpret": 75,
    "function gpuheal/ops/status.py:views": 72,
    "function gpuheal/ops/visibility.py:_device_plugin": 72,
    "function gpuheal/sim/monitoring.py:__init__": 72,
    "function gpuheal/sources/dcgm.py:queries": 72,
    "function gpuheal/ops/rollout.py:start": 71,
    "function gpuheal/sim/demo.py:run_demo": 69,
    "function gpuheal/policy/validation.py:job_manifest": 67,
    "function gpuheal/kube/informer.py:__init__": 64,
    "function gpuheal/api/server.py:post_process": 63,
    "function gpuheal/ops/maintenance.py:take_out": 61,
    "function gpuheal/sim/agent.py:__init__": 61,
}

# Packages split to the limits: nothing in them may be listed in OVER.
SPLIT = ("gpuheal/policy/plan/",)

# The command-line's argparse tables: one long declaration each, read top to bottom.
ARGPARSE_TABLES = frozenset({"gpuheal/cli.py"})


def sizes(root: Path = ROOT) -> dict[str, int]:
    """Every module, class and function of gpuheal/ over its limit: key -> lines."""
    over: dict[str, int] = {}
    for path in sorted((root / "gpuheal").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        text = path.read_text()
        lines = text.count("\n")
        if lines > LIMITS["module"]:
            over[f"module {name}"] = lines
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                kind = "class"
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                kind = "function"
            else:
                continue
            if kind == "function" and name in ARGPARSE_TABLES:
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LIMITS[kind]:
                key = f"{kind} {name}:{node.name}"
                over[key] = max(length, over.get(key, 0))
    return over


def problems(over: dict[str, int]) -> list[str]:
    """What breaks the ratchet: new offenders, grown ones, listed ones now under."""
    said = [f"new, over its limit ({n} lines): {k}" for k, n in over.items() if k not in OVER]
    said += [
        f"grown from {OVER[k]} to {n} lines: {k}" for k, n in over.items() if n > OVER.get(k, n)
    ]
    said += [f"now under its limit, take it off OVER: {k}" for k in OVER if k not in over]
    said += [f"in a split package: {k}" for k in OVER if any(p in k for p in SPLIT)]
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the ratchet breaks")
    args = parser.parse_args(argv)
    over = sizes()
    if args.check:
        found = problems(over)
        for line in found:
            print(line)
        return 1 if found else 0
    for key, lines in sorted(over.items(), key=lambda kv: -kv[1]):
        kind = key.split(" ", 1)[0]
        print(f"{lines:5d} (limit {LIMITS[kind]}) {key}")
    print(f"{len(over)} over the limits; {len(OVER)} listed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
