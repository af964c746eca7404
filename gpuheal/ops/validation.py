"""`--validate` of `gpuheal gate` and `maintenance finish`: the validation Job the
controller's recovery runs (policy/validation.py), run from the CLI and waited for.

One Job per node and maintenance round (its name hashes both), so running the
command again finds a Job still there (an interrupted run) and reads it instead of
starting a second one. It is deleted once read, or when the wait is cut short.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable

from rich.text import Text

from gpuheal.clock import iso
from gpuheal.config import Config
from gpuheal.kube.api import KubeApi, pod_path
from gpuheal.kube.projections import NodeJson
from gpuheal.kube.snapshot import list_all
from gpuheal.kube.validation import ValidationPodJson, create_job, delete_job, validation_pod
from gpuheal.ops.fleet import quantity
from gpuheal.policy.gate import Validated
from gpuheal.policy.pools import pool_config, pool_of
from gpuheal.policy.validation import (
    VALIDATION_JOB_LABEL,
    CreateValidationJob,
    DeleteValidationJob,
    ValidationPod,
    deadline,
    job_name,
    judge,
)

POLL_S = 2.0


def attempt_key(node: str, since: dt.datetime | None) -> str:
    """What names the CLI's Job: the node and the maintenance round it ends."""
    return f"maintenance/{node}/{iso(since, 'seconds') if since else ''}"


async def _pod(api: KubeApi, namespace: str, job: str) -> ValidationPod | None:
    pods = await list_all(
        api,
        pod_path(namespace),
        ValidationPodJson,
        "Pod",
        label_selector=f"{VALIDATION_JOB_LABEL}={job}",
    )
    return validation_pod(pods[-1]) if pods else None


async def validate_node(
    api: KubeApi,
    config: Config,
    node: NodeJson,
    since: dt.datetime | None,
    *,
    now: Callable[[], dt.datetime],
    say: Callable[[Text], None] = lambda _: None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Validated:
    """Start (or find) the node's Job, wait for its verdict, delete it."""
    cfg = config.health_gate.validation
    name = node.metadata.name
    pool = pool_of(node.metadata.labels, config)
    resource = pool_config(pool, config).resource
    gpus = quantity(node.status.allocatable.get(resource, "0"))
    job = job_name(attempt_key(name, since), 1)
    if gpus <= 0:
        return Validated(False, f"{job}: not started: the node offers no {resource} to validate")
    action = CreateValidationJob(name, pool, job, attempt_key(name, since), resource, gpus)
    created = await create_job(api, action, config)
    if created == "not-ours":
        return Validated(False, f"{job}: a Job of that name in {cfg.namespace} is not this node's")
    say(
        Text(
            f"validation Job {cfg.namespace}/{job} {created} on {gpus} {resource}; "
            f"waiting up to {cfg.timeout_seconds:g}s",
            style="dim",
        )
    )
    started = now()
    try:
        while True:
            pod = await _pod(api, cfg.namespace, job)
            elapsed = (now() - started).total_seconds()
            verdict = judge(pod, elapsed, cfg)
            if verdict is not None:
                return Validated(verdict.passed, f"{job}: {verdict.reason}")
            await sleep(min(POLL_S, max(deadline(pod, cfg) - elapsed, 0.1)))
    finally:
        await delete_job(api, DeleteValidationJob(job), config)
