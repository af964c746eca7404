"""The `gpuheal` command line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from gpuheal import __version__
from gpuheal.logs import setup_logging


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


def _cmd_controller(args: argparse.Namespace) -> int:
    from gpuheal.config import ConfigError, load_config  # noqa: PLC0415
    from gpuheal.controller.run import run_controller  # noqa: PLC0415

    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"gpuheal controller: {err}", file=sys.stderr)
        return 2
    return run_controller(
        config,
        kubeconfig=args.kubeconfig,
        identity=args.identity,
        listen=args.listen,
        config_path=args.config,
    )


def _cmd_agent(args: argparse.Namespace) -> int:
    from gpuheal.agent.config import load_agent_config  # noqa: PLC0415
    from gpuheal.agent.run import run_agent  # noqa: PLC0415
    from gpuheal.config import ConfigError  # noqa: PLC0415

    if not args.node:
        print("gpuheal agent: --node or $NODE_NAME is required", file=sys.stderr)
        return 2
    try:
        config = load_agent_config(args.config)
    except ConfigError as err:
        print(f"gpuheal agent: {err}", file=sys.stderr)
        return 2
    return run_agent(config, node=args.node, kubeconfig=args.kubeconfig)


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
        help="the whole product on a local cluster: fake GPU nodes, agents, controller, faults",
        description=(
            "Start a real local Kubernetes control plane (etcd, kube-apiserver, "
            "kube-scheduler, kube-controller-manager, kwok) with fake 8-GPU nodes, a GPU "
            "Deployment, the controller and one agent per node; inject an Xid 79, an ECC "
            "error, a P1 temperature warning and an alert storm; show each node's state "
            "change live, a node's recovery, and a summary. Needs `make testenv`."
        ),
    )
    demo.add_argument("--nodes", type=int, default=20, help="fake GPU nodes (default 20)")
    demo.add_argument("--replicas", type=int, default=32, help="GPU pods (default 32)")
    demo.add_argument("--gpus-per-pod", type=int, default=2, help="GPUs per pod (default 2)")
    demo.add_argument("--keep", action="store_true", help="keep the cluster running until Ctrl-C")
    demo.set_defaults(func=_cmd_demo)

    controller = commands.add_parser(
        "controller",
        help="run the controller: quarantine faulty GPU nodes, evict, recover",
        description=(
            "Watch Nodes, Pods and GPUFaults; for each new GPU fault create its GPUFault "
            "record, taint the node, evict its GPU pods and, once the fault clears, "
            "return the node. Exactly once per fault, under Lease leader election."
        ),
    )
    controller.add_argument("--config", type=Path, help="YAML config file (default: built-in)")
    controller.add_argument(
        "--kubeconfig",
        type=Path,
        help="kubeconfig (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)",
    )
    controller.add_argument(
        "--identity", default="", help="leader-election identity (default: $POD_NAME)"
    )
    controller.add_argument(
        "--listen",
        default="0.0.0.0:8080",
        help="address for /healthz, /readyz and /metrics (default 0.0.0.0:8080)",
    )
    controller.set_defaults(func=_cmd_controller)

    agent = commands.add_parser(
        "agent",
        help="run the node agent: probe the GPUs, report faults on this Node",
        description=(
            "Probe this node's GPUs (NVML, the kernel log, nvidia-smi, environment checks) "
            "every interval, debounce, and report the GPUHealthy condition and the "
            "gpuheal.io/* fault annotations on this node. Never taints or evicts."
        ),
    )
    agent.add_argument(
        "--node", default=os.environ.get("NODE_NAME", ""), help="this node (default: $NODE_NAME)"
    )
    agent.add_argument("--config", type=Path, help="YAML config file (default: built-in)")
    agent.add_argument(
        "--kubeconfig",
        type=Path,
        help="kubeconfig (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)",
    )
    agent.set_defaults(func=_cmd_agent)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, json_lines=args.command in ("controller", "agent"))
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
