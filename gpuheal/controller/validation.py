"""The validation Jobs' I/O: create one idempotently, delete it when its result is
read. What to create and when is policy/validation.py's."""

from __future__ import annotations

import json
import logging

from gpuheal.config import Config
from gpuheal.kube.api import ApiError, KubeApi
from gpuheal.policy.validation import (
    NODE_ANNOTATION,
    CreateValidationJob,
    DeleteValidationJob,
    job_manifest,
)

log = logging.getLogger(__name__)

# The Job goes now, its pod after it (the garbage collector): nothing waits on it.
BACKGROUND = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}


def job_path(namespace: str, name: str = "") -> str:
    base = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    return f"{base}/{name}" if name else base


async def create_job(api: KubeApi, action: CreateValidationJob, config: Config) -> str:
    """ "created", or "present": the attempt's Job exists already (this pass ran before
    a crash, or twice). One of another node's by the same name is left alone and
    said: this attempt then times out."""
    namespace = config.health_gate.validation.namespace
    try:
        await api.create(job_path(namespace), job_manifest(action, config))
    except ApiError as err:
        if err.code != 409:
            raise
        existing = json.loads(await api.get(job_path(namespace, action.name)))
        node = (existing.get("metadata", {}).get("annotations") or {}).get(NODE_ANNOTATION)
        if node != action.node:
            log.warning(
                "a Job by the validation's name is not ours",
                extra={"node": action.node, "job": action.name, "its_node": node},
            )
            return "not-ours"
        return "present"
    return "created"


async def delete_job(api: KubeApi, action: DeleteValidationJob, config: Config) -> str:
    namespace = config.health_gate.validation.namespace
    try:
        await api.delete(job_path(namespace, action.name), BACKGROUND)
    except ApiError as err:
        if err.code != 404:
            raise
        return "gone"
    return "deleted"
