"""Run the agent process until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

from gpuheal.agent.app import Agent, serve_metrics
from gpuheal.agent.config import AgentConfig
from gpuheal.agent.fakenvml import FakeNvml
from gpuheal.kube.api import KubeApi
from gpuheal.kube.blocking import BlockingKube

log = logging.getLogger(__name__)


def nvml_library(config: AgentConfig) -> Any:
    """pynvml itself, or the spec-driven fake with the same surface."""
    if config.nvml_backend == "fake" and config.nvml_fake_spec is not None:
        return FakeNvml(config.nvml_fake_spec)
    import pynvml  # noqa: PLC0415 -- loaded only where the real library is wanted

    return pynvml


def run_agent(config: AgentConfig, *, node: str, kubeconfig: Path | None) -> int:
    # Short timeouts: a hung request must not hold up the next probe round.
    client = BlockingKube(
        lambda: KubeApi.from_kubeconfig(kubeconfig, timeout_s=5.0), timeout_s=10.0
    )
    agent = Agent(config, node, client, nvml_library(config) if config.nvml_enabled else None)
    port = serve_metrics(agent, config.metrics_port)
    log.info("agent started", extra={"node": node, "metrics_port": port})
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        agent.run(stop)
    except Exception:  # said with its traceback and counted by the supervisor
        return 1
    return 0
