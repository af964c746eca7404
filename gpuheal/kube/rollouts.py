"""The GPURollout object (deploy/crds/gpurollouts.gpuheal.io.yaml) as the CLI and
the controller read it: its JSON decoded, and projected into the policy's terms
(gpuheal.policy.rollout), so both judge a roll-out the same way."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from gpuheal.kube.api import ApiError, KubeApi, gpurollout_path
from gpuheal.policy.rollout import (
    NodeProgress,
    Phase,
    RolloutDriver,
    RolloutStep,
    Target,
    driver_rollout_view,
    rollout_name,
)

DEFAULT_LEASE_S = 30.0
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
    leaseSeconds: float = DEFAULT_LEASE_S  # noqa: N815
    validate: bool = False  # the gate runs the validation Job too


class NodeStepJson(msgspec.Struct):
    name: str
    batch: int
    step: str
    since: str = ""
    detail: str = ""


class DriverJson(msgspec.Struct):
    holder: str = ""
    renewedAt: str = ""  # noqa: N815


class StatusJson(msgspec.Struct):
    phase: str = ""
    message: str = ""
    total: int = 0
    done: int = 0
    startedAt: str = ""  # noqa: N815
    finishedAt: str = ""  # noqa: N815
    driver: DriverJson = msgspec.field(default_factory=DriverJson)
    nodes: list[NodeStepJson] = []


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
