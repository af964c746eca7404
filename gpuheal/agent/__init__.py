"""The node agent: probes the GPUs, debounces, reports on its own Node. Never taints or evicts."""
