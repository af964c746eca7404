"""The controller's HTTP surface: health, readiness, metrics."""
