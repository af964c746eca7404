"""The provider hook of repair.replace: one call of a webhook or a command for one
attempt (what is called when, and why at least once: gpuheal/policy/replace.py).

The webhook gets the attempt's JSON as a POST with the idempotency key also in the
`Idempotency-Key` header; a 2xx answer is accepted. The command gets the JSON on
stdin and the key in GPUHEAL_IDEMPOTENCY_KEY; exit 0 is accepted. Both within
`timeoutSeconds`. A webhook URL is a secret: only its scheme and host are logged
or recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path

import aiohttp

from gpuheal.config import ReplaceConfig, url_origin, without_url_secrets
from gpuheal.policy.replace import IDEMPOTENCY_HEADER, CallReplace

log = logging.getLogger(__name__)

KEY_ENV = "GPUHEAL_IDEMPOTENCY_KEY"
_TAIL = 200  # characters of a failed command's stderr kept in the record


async def call_hook(cfg: ReplaceConfig, call: CallReplace) -> tuple[bool, str]:
    """(accepted, what came of it, as the record may say it)."""
    if cfg.webhook:
        accepted, detail = await _post(cfg, call)
    else:
        accepted, detail = await _run(cfg, call)
    log.log(
        logging.INFO if accepted else logging.WARNING,
        "replace hook called",
        extra={
            "node": call.node,
            "fault_id": call.fault_id,
            "attempt": call.attempt,
            "key": call.key,
            "hook": url_origin(cfg.webhook) if cfg.webhook else cfg.command[0],
            "accepted": accepted,
            "detail": detail,
        },
    )
    return accepted, detail


async def _post(cfg: ReplaceConfig, call: CallReplace) -> tuple[bool, str]:
    origin = url_origin(cfg.webhook)
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_seconds)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(
                cfg.webhook, json=call.body(), headers={IDEMPOTENCY_HEADER: call.key}
            ) as response,
        ):
            await response.read()
            return 200 <= response.status < 300, f"{origin}: HTTP {response.status}"
    except TimeoutError:
        return False, f"{origin}: no answer within {cfg.timeout_seconds:g}s"
    except aiohttp.ClientError as err:
        said = without_url_secrets(str(err), cfg.webhook)
        return False, f"{origin}: {type(err).__name__}: {said}"


async def _run(cfg: ReplaceConfig, call: CallReplace) -> tuple[bool, str]:
    name = Path(cfg.command[0]).name
    try:
        process = await asyncio.create_subprocess_exec(
            *cfg.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, KEY_ENV: call.key},
        )
    except OSError as err:
        return False, f"{name}: not started: {err.strerror or err}"
    try:
        _, stderr = await asyncio.wait_for(
            process.communicate(json.dumps(call.body()).encode()), cfg.timeout_seconds
        )
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return False, f"{name}: no exit within {cfg.timeout_seconds:g}s (killed)"
    if process.returncode == 0:
        return True, f"{name}: exit 0"
    tail = stderr.decode(errors="replace").strip()[-_TAIL:]
    return False, f"{name}: exit {process.returncode}" + (f": {tail}" if tail else "")
