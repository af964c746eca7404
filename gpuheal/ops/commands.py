"""The operator commands' entry points, as the CLI calls them.

Each takes the Context and the parsed arguments and returns an exit code
(ops/exitcodes.py); the work is in the module named after the command. The
commands on kube/'s client (status, audit, gate, doctor, approve, reject) are
coroutines given a ReadContext: the CLI runs them in one event loop around the
API client it opens and closes. `maintenance` is on lightkube's client still
(issue 17).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this module to build --help: keep it light
    from gpuheal.ops.context import Context, ReadContext


async def status(ctx: ReadContext, args: argparse.Namespace) -> int:
    from gpuheal.ops.status import run_status  # noqa: PLC0415

    return await run_status(ctx, selector=args.selector)


def maintenance_start(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops.maintenance import start  # noqa: PLC0415 -- keeps --help fast

    return start(ctx, args)


def maintenance_finish(ctx: Context, args: argparse.Namespace) -> int:
    from gpuheal.ops.maintenance import finish  # noqa: PLC0415

    return finish(ctx, args)


async def gate(ctx: ReadContext, args: argparse.Namespace) -> int:
    from gpuheal.ops.gate import run_gate  # noqa: PLC0415

    return await run_gate(ctx, args.node)


async def doctor(ctx: ReadContext, args: argparse.Namespace) -> int:
    from gpuheal.ops import doctor  # noqa: PLC0415 -- imports on call

    return await doctor.run(ctx, args.node)


async def audit(ctx: ReadContext, args: argparse.Namespace) -> int:
    from gpuheal.ops.audit import run_audit  # noqa: PLC0415

    return await run_audit(ctx, selector=args.selector, stuck_after_s=args.stuck_after)


async def approve(ctx: ReadContext, args: argparse.Namespace) -> int:
    from gpuheal.model import APPROVED  # noqa: PLC0415
    from gpuheal.ops.approval import answer  # noqa: PLC0415

    return await answer(ctx, args.fault, APPROVED)


async def reject(ctx: ReadContext, args: argparse.Namespace) -> int:
    from gpuheal.model import REJECTED  # noqa: PLC0415
    from gpuheal.ops.approval import answer  # noqa: PLC0415

    return await answer(ctx, args.fault, REJECTED)
