"""lightkube resource types for our custom resources (the local control plane and
the tests build GPUFaults and GPURollouts as lightkube objects)."""

from __future__ import annotations

from lightkube.generic_resource import create_global_resource

from gpuheal.model import (
    GPUFAULT_GROUP,
    GPUFAULT_KIND,
    GPUFAULT_PLURAL,
    GPUFAULT_VERSION,
    GPUROLLOUT_KIND,
    GPUROLLOUT_PLURAL,
)

GPUFault = create_global_resource(GPUFAULT_GROUP, GPUFAULT_VERSION, GPUFAULT_KIND, GPUFAULT_PLURAL)
GPURollout = create_global_resource(
    GPUFAULT_GROUP, GPUFAULT_VERSION, GPUROLLOUT_KIND, GPUROLLOUT_PLURAL
)
