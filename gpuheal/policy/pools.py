"""GPU pools: which pool a node belongs to and what its nodes should look like.

Pure functions of a node's labels and annotations and the config, shared by
the health gate, `gpuheal status`, `audit` and `doctor`, so every tool agrees
on a node's pool, its expected GPU count and its driver version.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from gpuheal.config import Config, PoolConfig
from gpuheal.model import CUDA_VERSION, DRIVER_VERSION, VBIOS_VERSION

NO_POOL = "(none)"

# GPU feature discovery's labels, newest first, then its older split form.
_GFD_DRIVER = "nvidia.com/cuda.driver-version.full"
_GFD_DRIVER_PARTS = (
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
)
_GFD_CUDA = "nvidia.com/cuda.runtime-version.full"
_GFD_CUDA_PARTS = ("nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor")


def pool_of(labels: Mapping[str, str], config: Config) -> str:
    """The node's pool: the pool label, else the first fallback label present."""
    for key in (config.pools.label, *config.pools.fallback_labels):
        if labels.get(key):
            return labels[key]
    return NO_POOL


def pool_config(pool: str, config: Config) -> PoolConfig:
    return config.pools.by_name.get(pool) or PoolConfig()


def expected_gpus(labels: Mapping[str, str], config: Config) -> int | None:
    """GPUs the node should offer: its pool's gpusPerNode, else the count label, else None."""
    configured = pool_config(pool_of(labels, config), config).gpus_per_node
    if configured is not None:
        return configured
    try:
        return int(labels.get(config.pools.expected_gpus_label, ""))
    except ValueError:
        return None


def _joined(labels: Mapping[str, str], parts: tuple[str, ...]) -> str:
    values = [labels.get(key, "") for key in parts]
    return ".".join(values) if all(values) else ""


def driver_version(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str:
    """The agent's report, else GPU feature discovery's labels; "" when unknown."""
    return (
        annotations.get(DRIVER_VERSION)
        or labels.get(_GFD_DRIVER)
        or _joined(labels, _GFD_DRIVER_PARTS)
    )


def cuda_version(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str:
    return (
        annotations.get(CUDA_VERSION) or labels.get(_GFD_CUDA) or _joined(labels, _GFD_CUDA_PARTS)
    )


def vbios_version(_labels: Mapping[str, str], annotations: Mapping[str, str]) -> str:
    """The agent's report ("" when unknown, or when the node's GPUs disagree: that is
    the agent's own warning, VbiosMismatch)."""
    found = annotations.get(VBIOS_VERSION, "")
    return "" if "," in found else found


def prevailing(versions: Iterable[str]) -> str:
    """The version most nodes run (ties: the highest string, for stability); "" if none."""
    counts = Counter(v for v in versions if v)
    if not counts:
        return ""
    return max(counts.items(), key=lambda item: (item[1], item[0]))[0]


def expected_driver(pool: str, versions_in_pool: Iterable[str], config: Config) -> str:
    """The pool's driver: configured, else the prevailing one."""
    return pool_config(pool, config).driver_version or prevailing(versions_in_pool)


def expected_cuda(pool: str, versions_in_pool: Iterable[str], config: Config) -> str:
    return pool_config(pool, config).cuda_version or prevailing(versions_in_pool)


def expected_vbios(pool: str, versions_in_pool: Iterable[str], config: Config) -> str:
    return pool_config(pool, config).vbios_version or prevailing(versions_in_pool)
