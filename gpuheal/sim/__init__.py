"""A real local Kubernetes control plane with fake GPU nodes, for tests,
benchmarks and the demo. See controlplane.py."""

from gpuheal.sim.controlplane import (
    ADMIN,
    IDENTITIES,
    ControlPlane,
    ControlPlaneConfig,
    Identity,
)
from gpuheal.sim.process import ControlPlaneError

__all__ = [
    "ADMIN",
    "IDENTITIES",
    "ControlPlane",
    "ControlPlaneConfig",
    "ControlPlaneError",
    "Identity",
]
