"""The operator commands' entry points, as the CLI calls them.

Each is a coroutine that takes the Context and the parsed arguments and returns
an exit code (ops/exitcodes.py); the work is in the module named after the
command. The CLI runs it in one event loop around kube/'s API client, which it
opens and closes.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this module to build --help: keep it light
    from gpuheal.ops.context import Context


async def status(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops.status import run_status  # noqa: PLC0415

    return await run_status(ctx, selector=args.selector)


async def maintenance_start(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops.maintenance_request import start  # noqa: PLC0415 -- keeps --help fast

    return await start(ctx, args)


async def maintenance_finish(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops.maintenance_request import finish  # noqa: PLC0415

    return await finish(ctx, args)


async def gate(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops.gate import run_gate  # noqa: PLC0415

    return await run_gate(ctx, args.node, validate=args.validate)


async def doctor(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops import doctor  # noqa: PLC0415 -- imports on call

    return await doctor.run(ctx, args.node)


async def audit(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops.audit import run_audit  # noqa: PLC0415

    return await run_audit(ctx, selector=args.selector, stuck_after_s=args.stuck_after)


async def approve(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.model import APPROVED  # noqa: PLC0415
    from gpuheal.ops.approval import answer  # noqa: PLC0415

    return await answer(ctx, args.fault, APPROVED)


async def reject(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.model import REJECTED  # noqa: PLC0415
    from gpuheal.ops.approval import answer  # noqa: PLC0415

    return await answer(ctx, args.fault, REJECTED)


async def release(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops.release import release as run_release  # noqa: PLC0415

    return await run_release(ctx, args.fault)


async def rollout(ctx: Context, args: argparse.Namespace) -> int:
    """`gpuheal rollout STEP POOL`: the step's coroutine in ops/rollout.py."""
    from gpuheal.ops import rollout as steps  # noqa: PLC0415

    operate = {
        "start": steps.start,
        "status": steps.status,
        "pause": steps.pause,
        "resume": steps.resume,
        "abort": steps.abort,
    }[args.step]
    return await operate(ctx, args)


async def selftest(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops.selftest import run_selftest  # noqa: PLC0415

    return await run_selftest(ctx, api_url=args.api)


async def crds_check(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops.crds import run_check  # noqa: PLC0415

    return await run_check(ctx)


async def crds_apply(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops.crds import run_apply  # noqa: PLC0415

    return await run_apply(ctx)
