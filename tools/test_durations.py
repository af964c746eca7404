"""Where `make test`'s time goes: per file and per tier, from the JUnit report pytest
writes on every run (pyproject.toml: --junit-xml=.cache/test-report.xml).

    python tools/test_durations.py [REPORT] [--top N]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / ".cache" / "test-report.xml"


def per_file(report: Path) -> dict[str, float]:
    """Seconds per test file (set-up, call and tear-down, as pytest times each case)."""
    spent: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314
        module = case.get("classname", "").split("::")[0]
        path = module.replace(".", "/")
        path = path if path.endswith(".py") else f"{path}.py"
        spent[path] += float(case.get("time", "0"))
    return dict(spent)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    if not args.report.exists():
        print(f"no report at {args.report}: run the tests first", file=sys.stderr)
        return 1
    files = per_file(args.report)
    tiers: dict[str, float] = defaultdict(float)
    for path, seconds in files.items():
        tiers["/".join(path.split("/")[:2])] += seconds
    total = sum(files.values())
    print(f"{total:8.1f} s in {len(files)} files")
    for tier, seconds in sorted(tiers.items(), key=lambda t: -t[1]):
        print(f"{seconds:8.1f} s  {tier}")
    print()
    for path, seconds in sorted(files.items(), key=lambda f: -f[1])[: args.top]:
        print(f"{seconds:8.1f} s  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
