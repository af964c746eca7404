"""lightkube resource types for our custom resources (the local control plane and
the tests build GPUFaults as lightkube objects)."""

from __future__ import annotations

from lightkube.generic_resource import create_global_resource

GPUFault = create_global_resource("gpuheal.io", "v1alpha1", "GPUFault", "gpufaults")
