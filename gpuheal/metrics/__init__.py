"""Prometheus metrics, one module per program: `controller` (the controller's
reconciles, its HTTP API, notifier and DCGM source) and `agent`; each metric is
declared once (`declare`) and built on the program's own registry. Gauges that
describe the fleet read it when scraped instead of being set by the code that
changes it. The names are documented in docs/controller.md ("Observability"),
docs/api.md and docs/agent.md."""
