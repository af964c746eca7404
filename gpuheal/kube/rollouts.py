"""The GPURollout object (deploy/crds/gpurollouts.gpuheal.io.yaml) as the CLI and
the controller read and write it: its JSON decoded, projected into the policy's
terms (gpuheal.policy.rollout), so both judge a roll-out the same way, and its
status written back under its resourceVersion (update_status), so the CLI's
pause, resume and abort and the controller's passes never overwrite each other."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gpuheal.kube.api import ApiError, KubeApi, gpurollout_path
from gpuheal.policy.rollout import (
    DETAIL_MAX,
    NodeProgress,
    Phase,
    RolloutDriver,
    RolloutStep,
    Target,
    counts,
    driver_rollout_view,
    rollout_name,
)
from gpuheal.values import text

DEFAULT_CHANGE_TIMEOUT_S = 3600.0
DEFAULT_GATE_TIMEOUT_S = 600.0


class RolloutMeta(msgspec.Struct):
    name: str = ""
    resourceVersion: str = ""  # noqa: N815 -- API field name
    creationTimestamp: str | None = None  # noqa: N815


class TargetJson(msgspec.Struct):
    driverVersion: str = ""  # noqa: N815
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}


class SpecJson(msgspec.Struct):
    pool: str
    target: TargetJson
    canary: int
    batchSize: int  # noqa: N815
    maxUnavailable: int  # noqa: N815
    maxUnavailablePercent: float | None = None  # noqa: N815
    reason: str = ""
    changeTimeoutSeconds: float = DEFAULT_CHANGE_TIMEOUT_S  # noqa: N815
    gateTimeoutSeconds: float = DEFAULT_GATE_TIMEOUT_S  # noqa: N815
    validate: bool = False  # the gate runs the validation Job too
    # How the controller drains each node (kubectl drain's flags of those names).
    deleteEmptyDirData: bool = False  # noqa: N815
    force: bool = False


class NodeStepJson(msgspec.Struct):
    name: str
    batch: int
    step: str
    since: str = ""
    detail: str = ""


class StatusJson(msgspec.Struct):
    phase: str = ""
    message: str = ""
    total: int = 0
    done: int = 0
    startedAt: str = ""  # noqa: N815
    finishedAt: str = ""  # noqa: N815
    # The controller replica that wrote the status last. An object where an older
    # CLI kept its lease ({holder, renewedAt}) until a pass writes it over.
    driver: str | dict[str, str] = ""
    nodes: list[NodeStepJson] = []

    @property
    def driven_by(self) -> str:
        return self.driver if isinstance(self.driver, str) else ""


class RolloutJson(msgspec.Struct):
    metadata: RolloutMeta
    spec: SpecJson
    status: StatusJson = msgspec.field(default_factory=StatusJson)


_ROLLOUT = msgspec.json.Decoder(RolloutJson)


def decode(raw: bytes) -> RolloutJson:
    return _ROLLOUT.decode(raw)


def _step(raw: str) -> RolloutStep:
    try:
        return RolloutStep(raw)
    except ValueError:
        return RolloutStep.PENDING  # the CRD's enum keeps others out; an older value: start over


def _phase(raw: str) -> Phase:
    try:
        return Phase(raw)
    except ValueError:
        return Phase.RUNNING


@dataclass(frozen=True)
class RolloutState:
    """A GPURollout in the policy's terms."""

    name: str
    pool: str
    target: Target
    phase: Phase
    progress: tuple[NodeProgress, ...]

    def driver_view(self, node: str) -> RolloutDriver | None:
        return driver_rollout_view(self.target.driver_version, self.progress, node)


def state_of(rollout: RolloutJson) -> RolloutState:
    target = rollout.spec.target
    return RolloutState(
        name=rollout.metadata.name,
        pool=rollout.spec.pool,
        target=Target(target.driverVersion, dict(target.labels), dict(target.annotations)),
        phase=_phase(rollout.status.phase),
        progress=tuple(progress_of(rollout)),
    )


def progress_of(rollout: RolloutJson) -> list[NodeProgress]:
    return [
        NodeProgress(n.name, n.batch, _step(n.step), n.since, n.detail)
        for n in rollout.status.nodes
    ]


async def read_rollout(api: KubeApi, name: str) -> RolloutJson | None:
    try:
        return decode(await api.get(gpurollout_path(name)))
    except ApiError as err:
        if err.code == 404:
            return None
        raise


async def pool_rollout(api: KubeApi, pool: str) -> RolloutState | None:
    """The pool's roll-out, for the health gate; None when there is none, or when
    it cannot be read (no CRD, no right to read it): the gate then judges by the
    pool's majority, as before roll-outs existed."""
    try:
        rollout = await read_rollout(api, rollout_name(pool))
    except ApiError as err:
        if err.code in (403, 404):
            return None
        raise
    return state_of(rollout) if rollout is not None else None


# -- writing the status ----------------------------------------------------------------

CONFLICT_RETRIES = 10

# Builds the status patch from the object as read; None: nothing to write.
Mutation = Callable[[RolloutJson], dict[str, Any] | None]


class RolloutWriteError(Exception):
    """The status could not be written: the object kept changing under us."""


def progress_json(progress: Sequence[NodeProgress]) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "batch": p.batch,
            "step": p.step.value,
            **({"since": p.since} if p.since else {}),
            **({"detail": text(p.detail, DETAIL_MAX)} if p.detail else {}),
        }
        for p in progress
    ]


def summary(progress: Sequence[NodeProgress]) -> dict[str, Any]:
    return {"total": len(progress), "done": counts(progress)[RolloutStep.DONE]}


async def update_status(api: KubeApi, name: str, mutate: Mutation) -> RolloutJson | None:
    """A resourceVersion-guarded merge patch of the status, `mutate` building it from
    the object as read; on 409 read again and rebuild. Returns the object as
    written (or as read when nothing was), None when it is gone."""
    for _ in range(CONFLICT_RETRIES):
        current = await read_rollout(api, name)
        if current is None:
            return None
        status = mutate(current)
        if status is None:
            return current
        body = {"metadata": {"resourceVersion": current.metadata.resourceVersion}, "status": status}
        try:
            return decode(await api.patch(gpurollout_path(name, status=True), body))
        except ApiError as err:
            if err.code == 404:
                return None
            if err.code != 409:
                raise
    raise RolloutWriteError(
        f"GPURollout {name} kept changing: {CONFLICT_RETRIES} writes conflicted"
    )
