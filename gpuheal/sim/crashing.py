"""The crash tests' controller: `gpuheal controller` with a crashpoint, which
SIGKILLs it right after the n-th action of a kind (GPUHEAL_CRASH_AFTER=AddTaint,
or AddTaint:2). The harness's only way to one: the product reads no such setting.

    python -m gpuheal.sim.crashing --log-level INFO controller --kubeconfig K \
        --config C --identity I --listen H:P     (the crash point from the environment)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuheal.controller.executor import Crashpoint
from gpuheal.controller.run import run_from_file
from gpuheal.logs import setup_logging

CRASH_ENV = "GPUHEAL_CRASH_AFTER"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuheal.sim.crashing", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("command", choices=["controller"])
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--identity", default="")
    parser.add_argument("--listen", default="0.0.0.0:8080")
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    return run_from_file(
        args.config,
        kubeconfig=args.kubeconfig,
        identity=args.identity,
        listen=args.listen,
        crashpoint=Crashpoint(os.environ.get(CRASH_ENV)),
        program="gpuheal.sim.crashing",
    )


if __name__ == "__main__":
    sys.exit(main())
