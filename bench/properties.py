"""Benchmark of a correctness claim: the controller's exactly-once property test
(tests/unit/test_controller_properties.py: one record, one taint and one eviction
per pod per fault, never past the breaker, a tainted node always answered by one
open record), run far longer than the unit tier runs it.

Two runs, either or both:

- --seeds A-B: the property as the unit tier runs it (its examples per seed,
  `--examples-per-seed`, 300 by default) for every seed from A to B, as
  `pytest --hypothesis-seed=N` would; the seeds that fail are listed;
- --examples N: one long randomized run of N examples (a random seed, recorded).

Results in bench/results/properties.json: per run the seeds or seed, the examples,
the failures (the falsifying example hypothesis printed, cut to 4 KiB) and the time.
The runs go in --jobs processes (each seed is independent).

    .venv/bin/python bench/properties.py --seeds 1-1000 --examples 20000 --jobs 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from common import emit

# The property lives with the unit tests (tests/ is not installed): the checkout's root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import given, seed, settings

from tests.unit import test_controller_properties as prop

FAILURE_CHARS = 4096


def run_once(at_seed: int, examples: int) -> dict[str, Any]:
    """One hypothesis run of the property: its seed, examples, time, and the failure."""
    test = seed(at_seed)(
        settings(max_examples=examples, deadline=None, database=None, print_blob=False)(
            given(prop.STEPS, prop.TURNS)(prop.check)
        )
    )
    said = io.StringIO()
    started = time.perf_counter()
    failure = ""
    with contextlib.redirect_stdout(said):
        try:
            test()
        except BaseException:  # an assertion or a crash: both are failures
            failure = (said.getvalue() + traceback.format_exc())[-FAILURE_CHARS:]
    return {
        "seed": at_seed,
        "examples": examples,
        "seconds": round(time.perf_counter() - started, 2),
        "failure": failure,
    }


def seed_range(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=seed_range, help="A-B: every seed from A to B")
    parser.add_argument("--examples-per-seed", type=int, default=300)
    parser.add_argument("--examples", type=int, help="one long run of N examples")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    result: dict[str, Any] = {}
    lines = []
    with ProcessPoolExecutor(args.jobs) as pool:
        long_run = None
        if args.examples:
            long_run = pool.submit(run_once, random.SystemRandom().randrange(2**32), args.examples)
        if args.seeds:
            started = time.perf_counter()
            per_seed = list(
                pool.map(run_once, args.seeds, [args.examples_per_seed] * len(args.seeds))
            )
            failed = [r for r in per_seed if r["failure"]]
            result["seeds"] = {
                "from": args.seeds.start,
                "to": args.seeds.stop - 1,
                "examples_per_seed": args.examples_per_seed,
                "failed_seeds": [r["seed"] for r in failed],
                "failures": failed[:5],
                "seconds": round(time.perf_counter() - started, 1),
            }
            lines.append(
                f"seeds {args.seeds.start}-{args.seeds.stop - 1} x {args.examples_per_seed} "
                f"examples: {len(failed)} failed {[r['seed'] for r in failed][:20]}"
            )
        if long_run is not None:
            run = long_run.result()
            result["long_run"] = run | {"failed": bool(run["failure"])}
            lines.append(
                f"one run of {run['examples']} examples (seed {run['seed']}): "
                f"{'FAILED' if run['failure'] else '0 failures'} in {run['seconds']} s"
            )
    emit("properties", result, "\n".join(lines))
    failed = result.get("long_run", {}).get("failed") or result.get("seeds", {}).get("failed_seeds")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
