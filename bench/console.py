"""Benchmark: the console's fleet page at --nodes GPU nodes, rendered from a
synthetic copy of the controller's caches (tests/console_fleet.py: pools, one
GPU pod per node, faults in every list), without a server: the time from the
caches to the HTML, which is what each page load and each live update costs the
controller's event loop. Target: under 300 ms at 5,000 nodes.

    .venv/bin/python bench/console.py --nodes 1000 5000 --runs 20
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common import emit, percentiles_ms

# The synthetic fleet is the unit tests' (tests/ is not installed): the checkout's root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuheal.api.console import render
from gpuheal.api.console.auth import Role, issue
from tests.console_fleet import cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[5000])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    _, session = issue(Role.ACT, "bench", b"k" * 32, time.time())
    result: dict[str, object] = {"runs": args.runs}
    lines = []
    for nodes in args.nodes:
        caches = cluster(nodes)
        render.fleet_page(caches, session)  # templates compiled once, as in the server
        page, fragment = [], []
        for _ in range(args.runs):
            start = time.perf_counter()
            html = render.fleet_page(caches, session)
            page.append(time.perf_counter() - start)
            start = time.perf_counter()
            render.fleet_page(caches, session, fragment=True)
            fragment.append(time.perf_counter() - start)
        result[str(nodes)] = {
            "page_ms": percentiles_ms(page),
            "fragment_ms": percentiles_ms(fragment),
            "bytes": len(html.encode()),
        }
        lines.append(
            f"{nodes} nodes: page p50 {percentiles_ms(page)['p50']} ms, "
            f"max {percentiles_ms(page)['max']} ms, {len(html) // 1024} KiB"
        )
    emit("console", result, "\n".join(lines))


if __name__ == "__main__":
    main()
