"""The `gpuheal` command line."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from gpuheal import __version__


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM into SystemExit so `with` blocks stop child processes cleanly.
    raise SystemExit(128 + signum)


def _cmd_demo(args: argparse.Namespace) -> int:
    from gpuheal.sim import ControlPlaneError  # noqa: PLC0415 -- keeps --help fast
    from gpuheal.sim.demo import DemoOptions, run_demo  # noqa: PLC0415

    options = DemoOptions(
        nodes=args.nodes, replicas=args.replicas, gpus_per_pod=args.gpus_per_pod, keep=args.keep
    )
    try:
        return run_demo(options)
    except (ControlPlaneError, TimeoutError) as err:
        print(f"gpuheal demo: {err}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuheal",
        description="GPU fault self-healing for Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"gpuheal {__version__}")
    parser.add_argument(
        "--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run a local control plane with fake GPU nodes and a GPU workload",
        description=(
            "Start a real local Kubernetes control plane (etcd, kube-apiserver, "
            "kube-scheduler, kube-controller-manager, kwok), register fake 8-GPU "
            "nodes, schedule a GPU Deployment and print the cluster's GPU state. "
            "Needs the binaries from `make testenv`."
        ),
    )
    demo.add_argument("--nodes", type=int, default=20, help="fake GPU nodes (default 20)")
    demo.add_argument("--replicas", type=int, default=32, help="GPU pods (default 32)")
    demo.add_argument("--gpus-per-pod", type=int, default=2, help="GPUs per pod (default 2)")
    demo.add_argument("--keep", action="store_true", help="keep the cluster running until Ctrl-C")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
