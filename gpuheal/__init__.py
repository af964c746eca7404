"""gpuheal: GPU fault self-healing for Kubernetes."""

__version__ = "0.1.0"
