"""The `gpuheal` command line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from gpuheal import __version__
from gpuheal.logs import setup_logging

if TYPE_CHECKING:  # --help stays fast: the operator commands import on call
    from gpuheal.ops.context import Context

# The ConfigMap the chart renders for release gpuheal in gpuheal-system (docs/deploy.md):
# where the operator commands find the running controller's config (ops/configsource.py).
DEFAULT_CONTROLLER_CONFIG = "gpuheal-system/gpuheal-controller"
CONTROLLER_CONFIG_ENV = "GPUHEAL_CONTROLLER_CONFIG"

VALIDATE_HELP = (
    "also run the validation Job on the node (healthGate.validation: DCGM diag, NCCL) "
    "once the other checks pass, and wait for it; needs create/get/delete on Jobs "
    "in healthGate.validation.namespace"
)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM into SystemExit so `with` blocks stop child processes cleanly.
    raise SystemExit(128 + signum)


def _cmd_demo(args: argparse.Namespace) -> int:
    from gpuheal.sim import ControlPlaneError  # noqa: PLC0415 -- keeps --help fast
    from gpuheal.sim.demo import DemoOptions, run_demo  # noqa: PLC0415

    options = DemoOptions(
        nodes=args.nodes,
        replicas=args.replicas,
        gpus_per_pod=args.gpus_per_pod,
        keep=args.keep,
        dra=args.dra,
    )
    try:
        return run_demo(options)
    except (ControlPlaneError, TimeoutError) as err:
        print(f"gpuheal demo: {err}", file=sys.stderr)
        return 1


def _cmd_controller(args: argparse.Namespace) -> int:
    from gpuheal.controller.run import run_from_file  # noqa: PLC0415

    return run_from_file(
        args.config, kubeconfig=args.kubeconfig, identity=args.identity, listen=args.listen
    )


def _cmd_agent(args: argparse.Namespace) -> int:
    from gpuheal.agent.config import load_agent_config  # noqa: PLC0415
    from gpuheal.agent.run import run_agent  # noqa: PLC0415
    from gpuheal.config import ConfigError  # noqa: PLC0415
    from gpuheal.kube.kubeconfig import KubeconfigError  # noqa: PLC0415

    if not args.node:
        print("gpuheal agent: --node or $NODE_NAME is required", file=sys.stderr)
        return 2
    try:
        config = load_agent_config(args.config)
    except ConfigError as err:
        print(f"gpuheal agent: {err}", file=sys.stderr)
        return 2
    try:
        return run_agent(config, node=args.node, kubeconfig=args.kubeconfig)
    except KubeconfigError as err:
        print(f"gpuheal agent: cannot load a kubeconfig: {err}", file=sys.stderr)
        return 2


def _operator(args: argparse.Namespace) -> int:
    """Run an operator command: build its Context, run its coroutine in one event loop
    around kube/'s client (whose answers decode into msgspec projections), and turn
    the ways it can fail outside the command (no kubeconfig, bad config, API
    unreachable or refusing) into exit codes."""
    import asyncio  # noqa: PLC0415

    import aiohttp  # noqa: PLC0415
    import msgspec  # noqa: PLC0415

    from gpuheal.config import ConfigError  # noqa: PLC0415
    from gpuheal.kube.api import ApiError  # noqa: PLC0415
    from gpuheal.kube.client import operator_api  # noqa: PLC0415
    from gpuheal.kube.credentials import CredentialError  # noqa: PLC0415
    from gpuheal.kube.kubeconfig import KubeconfigError, NoKubeconfigError  # noqa: PLC0415
    from gpuheal.ops import configsource, exitcodes  # noqa: PLC0415
    from gpuheal.ops.context import Context  # noqa: PLC0415

    prog = f"gpuheal {args.command}"
    try:
        api = operator_api(args.kubeconfig, args.context)
    except NoKubeconfigError as err:
        print(f"{prog}: {err}", file=sys.stderr)  # kubectl's plain "nothing found"
        return exitcodes.USAGE
    except KubeconfigError as err:
        print(f"{prog}: cannot load a kubeconfig: {err}", file=sys.stderr)
        return exitcodes.USAGE

    async def operate() -> int:
        try:
            try:
                source = await configsource.resolve(api, args.config, args.controller_config)
            except ConfigError as err:
                print(f"{prog}: {err}", file=sys.stderr)
                return exitcodes.USAGE
            ctx = Context(api=api, config=source.config, output=args.output)
            if args.config is None:  # the CLI chose: it says which (a --config is known)
                ctx.err.print(source.said, style="dim", highlight=False)
            code: int = await args.operate(ctx, args)
            return code
        finally:
            await api.close()

    try:
        return asyncio.run(operate())
    except ApiError as err:
        print(f"{prog}: the API server refused: {err}", file=sys.stderr)
    except (aiohttp.ClientError, TimeoutError) as err:
        print(f"{prog}: cannot reach the API server: {err or type(err).__name__}", file=sys.stderr)
    except CredentialError as err:
        print(f"{prog}: no credentials for the API server: {err}", file=sys.stderr)
    except msgspec.DecodeError as err:
        print(f"{prog}: cannot read the API server's answer: {err}", file=sys.stderr)
    return exitcodes.ERROR


def _add_kubeconfig(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="kubeconfig (default: $KUBECONFIG, then ~/.kube/config, then in-cluster)",
    )


def _add_selector(parser: argparse.ArgumentParser, scope: str, note: str) -> None:
    """kubectl's -l: a label selector."""
    parser.add_argument(
        "-l",
        "--selector",
        default="",
        help=f"only {scope} with these labels (k=v,k2!=v2,k3); {note}",
    )


def _add_eviction_options(parser: argparse.ArgumentParser) -> None:
    """kubectl drain's: which pods a drain may evict (maintenance start, a roll-out's)."""
    parser.add_argument(
        "--delete-emptydir-data",
        action="store_true",
        help="evict pods with emptyDir volumes (their data is lost)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="also evict pods no controller manages (they are not recreated)",
    )


def _add_waiting(parser: argparse.ArgumentParser, until: str, *, poll_s: float = 1.0) -> None:
    """A request the controller carries out (maintenance, a roll-out): wait for it,
    showing its progress (the default), or not."""
    parser.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help=f"return once the request is written, not waiting for {until}",
    )
    parser.add_argument(
        "--poll",
        type=float,
        default=poll_s,
        metavar="SECONDS",
        help=f"how often the progress is read while waiting (default {poll_s:g})",
    )


def _operator_options() -> argparse.ArgumentParser:
    """kubectl's habits, shared by every operator command."""
    common = argparse.ArgumentParser(add_help=False)
    _add_kubeconfig(common)
    common.add_argument("--context", help="kubeconfig context (default: its current context)")
    common.add_argument(
        "-o",
        "--output",
        default="table",
        choices=["table", "json", "yaml"],
        help="output format (default table)",
    )
    common.add_argument(
        "--config",
        type=Path,
        help="a YAML config file to judge pools, the gate and maintenance with, instead "
        "of the running controller's (--controller-config)",
    )
    common.add_argument(
        "--controller-config",
        metavar="NAMESPACE/NAME",
        default=os.environ.get(CONTROLLER_CONFIG_ENV, DEFAULT_CONTROLLER_CONFIG),
        help="the running controller's ConfigMap, read when no --config is given; "
        "built-in defaults when it is absent or unreadable, and stderr says which "
        f"(default: ${CONTROLLER_CONFIG_ENV}, else {DEFAULT_CONTROLLER_CONFIG})",
    )
    return common


def _add_operator_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    from gpuheal.ops import commands as ops  # noqa: PLC0415 -- thin: imports on call

    common = _operator_options()

    def command(
        under: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        operate: Callable[[Context, argparse.Namespace], Awaitable[int]],
        *,
        help: str,
        description: str | None = None,
        node: bool = False,
    ) -> argparse.ArgumentParser:
        """An operator command: kubectl's options, run by _operator; `node`: it takes a NODE."""
        parser = under.add_parser(name, parents=[common], help=help, description=description)
        if node:
            parser.add_argument("node", metavar="NODE")
        parser.set_defaults(func=_operator, operate=operate)
        return parser

    status = command(
        commands,
        "status",
        ops.status,
        help="the GPU fleet at a glance: node states, GPUs per pool, faults, breaker budget",
        description=(
            "GPU nodes by state (healthy, suspect, quarantined, draining, held, "
            "maintenance, not ready), GPUs per pool as capacity / allocatable / allocated, "
            "the open faults and the breaker's remaining budget."
        ),
    )
    _add_selector(status, "GPU nodes", "the breaker counts all")

    crd = commands.add_parser(
        "crds",
        help="gpuheal's CRDs: is the schema served this version's; install it (after helm upgrade)",
        description=(
            "Helm installs a chart's CRDs once and never upgrades them. `check` compares "
            "the served CRDs with this version's (exit 3 when one is older or missing); "
            "`apply` installs this version's by server-side apply and waits until served."
        ),
    )
    crd_steps = crd.add_subparsers(dest="step", required=True, metavar="STEP")
    command(crd_steps, "check", ops.crds_check, help="compare the served CRDs with this version's")
    command(crd_steps, "apply", ops.crds_apply, help="install this version's CRDs and wait")

    maintenance = commands.add_parser(
        "maintenance",
        help="take a GPU node out for maintenance and bring it back through the health gate",
    )
    steps = maintenance.add_subparsers(dest="step", required=True, metavar="STEP")
    start = command(
        steps,
        "start",
        ops.maintenance_start,
        node=True,
        help="label, taint and cordon the node, ask GPU workloads to checkpoint, then drain",
        description=(
            "Request maintenance of NODE; the leading controller carries it out: mark it "
            "(label gpuheal.io/state=maintenance, a NoSchedule taint, cordon), ask its GPU "
            "workloads to checkpoint, wait for them to leave, then drain it through the "
            "Eviction API, respecting PodDisruptionBudgets. DaemonSet pods stay. By "
            "default waits, printing what blocks the drain; stopping the wait stops "
            "nothing. Nodes in maintenance are not faults and do not count against the "
            "breaker (a roll-out's do). Only a node the controller manages (its "
            "nodeSelector, not opted out with gpuheal.io/managed=false): any other is "
            "refused, exit 2, before anything is written."
        ),
    )
    start.add_argument("--reason", required=True, help="why (recorded on the node and in Events)")
    start.add_argument(
        "--checkpoint",
        choices=["annotate", "webhook", "none"],
        help="how GPU workloads are told to checkpoint (default: config maintenance.checkpoint)",
    )
    start.add_argument(
        "--checkpoint-wait",
        type=float,
        metavar="SECONDS",
        help="how long GPU pods get to leave on their own (default: config)",
    )
    start.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="drain deadline; exit 4 with the blockers when it passes (default: config)",
    )
    _add_eviction_options(start)
    start.add_argument(
        "--no-drain", action="store_true", help="mark, taint and cordon only; do not evict"
    )
    _add_waiting(start, "the node is drained (or the drain's deadline passed)")
    finish = command(
        steps,
        "finish",
        ops.maintenance_finish,
        node=True,
        help="the controller runs the health gate; only if it passes, it removes our taint "
        "and label and uncordons",
    )
    finish.add_argument("--validate", action="store_true", help=VALIDATE_HELP)
    _add_waiting(finish, "the gate's verdict")
    _add_rollout(commands, command)
    gate = command(
        commands,
        "gate",
        ops.gate,
        node=True,
        help="run the health gate on a node and change nothing (--validate: runs a Job)",
        description=(
            "The checks a node must pass before it is returned: Ready, GPU count, "
            "driver version, no new Xid/ECC errors, diagnostics, device-plugin pod, and "
            "with --validate a validation Job on the node. "
            "Exit 0 when all pass, else 64 + the failing checks' bits."
        ),
    )
    gate.add_argument("--validate", action="store_true", help=VALIDATE_HELP)
    command(
        commands,
        "doctor",
        ops.doctor,
        node=True,
        help="why a GPU node or its workloads are stuck, in plain sentences",
        description=(
            "Answers, in order: is NODE registered and Ready; does the scheduler see its "
            "GPUs; why workloads did not move (Pending GPU pods that may use it, pods that "
            "should leave it); what else is affected (the same pool, driver, rack). Reads "
            "only. Exit 0 when nothing is wrong, 3 when it finds a problem, 5 when NODE "
            "is not registered."
        ),
    )
    selftest = command(
        commands,
        "selftest",
        ops.selftest,
        help="does this installation work: the controller ready, a leader, every agent seeing",
        description=(
            "Checks that the controller's API answers and is ready (--api, its Service), "
            "that one replica leads (the Lease of --config's leaderElection), and that "
            "every GPU node's agent reports and reaches NVML and its GPUs. What `helm "
            "test` runs. Reads only. Exit 0 when all pass, 3 when one fails."
        ),
    )
    selftest.add_argument(
        "--api",
        required=True,
        help="the controller's base URL, e.g. http://gpuheal-controller.gpuheal-system:8080",
    )
    audit = command(
        commands,
        "audit",
        ops.audit,
        help="fleet audit: leaked GPUs, zombie GPU processes, version skew, missing labels",
        description=(
            "Per node: allocatable GPUs against live pods' requests (leaks), GPU processes "
            "of no live pod, GPU nodes with zero or dropped allocatable or no device "
            "plugin, driver and CUDA skew within a pool, GPU nodes missing the expected "
            "taint or labels: the checks the controller exports as gpuheal_hygiene_findings. "
            "Exit 3 on findings."
        ),
    )
    _add_selector(audit, "nodes", "pools are judged on those nodes")
    audit.add_argument(
        "--stuck-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a GPU pod Terminating this long past its grace period is a leak "
        "(default: the config's hygiene.stuckAfterSeconds, 60)",
    )

    for verb, operate, what in (
        ("approve", ops.approve, "let the controller carry out"),
        ("reject", ops.reject, "refuse"),
    ):
        decide = command(
            commands,
            verb,
            operate,
            help=f"{what} a fault's plan awaiting approval (approval mode)",
            description=(
                f"{verb.capitalize()} the plan of a GPUFault in phase AwaitingApproval: written "
                "to the record's status with your identity as the API server knows it; "
                "the controller acts on it once. Exit 5: no such fault; 2: it is not "
                "awaiting approval (cleared, expired, answered)."
            ),
        )
        decide.add_argument("fault", metavar="FAULT", help="the GPUFault name, or its fault id")

    release = command(
        commands,
        "release",
        ops.release,
        help="let one fault held by the breaker past it, or a repeat offender's node back",
        description=(
            "Release a GPUFault in phase Held (the blast-radius breaker kept it from being "
            "quarantined), or a repeat offender's (its node stays out after the fault "
            "clears until a person releases it): written to the record's status with your "
            "identity as the API server knows it. The controller quarantines a held fault "
            "once, past the full breaker (every other held fault stays held); a repeat "
            "offender's node goes on to the health gate. Exit 5: no such fault; 2: it is "
            "neither (quarantined, cleared) or already released."
        ),
    )
    release.add_argument("fault", metavar="FAULT", help="the GPUFault name, or its fault id")


def _add_rollout(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    command: Callable[..., argparse.ArgumentParser],
) -> None:
    """`gpuheal rollout start|status|pause|resume|abort POOL` (ops/rollout.py)."""
    from gpuheal.ops import commands as ops  # noqa: PLC0415

    rollout = commands.add_parser(
        "rollout",
        help="roll a driver (or any node change) across a GPU pool: canary, then batches",
        description=(
            "A roll-out of one pool, kept in the cluster as a GPURollout named after the "
            "pool (one per pool) and driven by the leading controller: each node is taken "
            "out through maintenance, waits for the change (its reported driver version, "
            "or the labels/annotations given), passes the health gate on the new version "
            "and goes back; the canary first, then batch by batch, never more nodes out "
            "than the budget. The first failure stops it with that node held. These "
            "commands only write and read the object: a closed terminal or a controller "
            "failover loses nothing."
        ),
    )
    steps = rollout.add_subparsers(dest="step", required=True, metavar="STEP")

    def step(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        parser = command(steps, name, ops.rollout, help=help, description=description)
        parser.add_argument("pool", metavar="POOL", help="the pool (the value of pools.label)")
        return parser

    start = step(
        "start",
        "create the pool's roll-out; the controller drives it (exit 0 completed, 3 a node held)",
        "Create the GPURollout of POOL; the leading controller drives it. By default wait "
        "until it completes, fails (a node held: exit 3) or is paused or aborted, showing "
        "each node's steps; stopping the wait stops nothing. A second start on the same "
        "pool is refused (exit 2).",
    )
    start.add_argument("--driver-version", help="the driver version nodes must report")
    start.add_argument(
        "--label",
        action="append",
        metavar="KEY=VALUE",
        help="a label nodes must carry once changed (repeatable)",
    )
    start.add_argument(
        "--annotation",
        action="append",
        metavar="KEY=VALUE",
        help="an annotation nodes must carry once changed (repeatable)",
    )
    start.add_argument("--reason", required=True, help="why (recorded on the roll-out and nodes)")
    start.add_argument("--canary", type=int, default=1, help="canary nodes, first (default 1)")
    start.add_argument("--batch-size", type=int, default=1, help="nodes per batch (default 1)")
    start.add_argument(
        "--max-unavailable",
        type=int,
        default=1,
        metavar="N",
        help="most nodes of the pool out at once, faults and cordons included (default 1)",
    )
    start.add_argument(
        "--max-unavailable-percent",
        type=float,
        metavar="PERCENT",
        help="also at most this share of the pool (at least one node)",
    )
    start.add_argument(
        "--change-timeout",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="a drained node that does not report the change by then is held (default 3600)",
    )
    start.add_argument(
        "--gate-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="a changed node the gate still refuses by then is held (default 600)",
    )
    start.add_argument(
        "--validate",
        action="store_true",
        help="the gate also runs the validation Job on each changed node "
        "(healthGate.validation; recorded in the roll-out)",
    )
    _add_eviction_options(start)  # recorded in the roll-out: the controller drains so
    _add_waiting(start, "the roll-out to complete (`rollout status` shows it)", poll_s=2.0)
    step("status", "the roll-out's phase and every node's step (exit 3 when failed)")
    step("pause", "take no further node out; nodes in flight finish")
    _add_waiting(
        step(
            "resume",
            "let the controller drive the roll-out again: after a pause, or a failure "
            "(held nodes are gated again)",
        ),
        "the roll-out to complete",
        poll_s=2.0,
    )
    step(
        "abort",
        "stop for good: no further node is taken out; finished nodes stay, nothing is "
        "returned automatically",
    )


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
    demo.add_argument(
        "--dra",
        type=int,
        default=0,
        help="also N DRA-only GPU nodes, and one bad card fenced alone (default 0)",
    )
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
    _add_kubeconfig(controller)
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
    _add_kubeconfig(agent)
    agent.set_defaults(func=_cmd_agent)
    _add_operator_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, json_lines=args.command in ("controller", "agent"))
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
