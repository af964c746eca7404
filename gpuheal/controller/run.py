"""Run the controller process until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from gpuheal.config import Config, ConfigError, load_config
from gpuheal.controller.app import Controller, RunOptions, default_identity
from gpuheal.controller.executor import Crashpoint
from gpuheal.kube.api import KubeApi, connections_for
from gpuheal.kube.kubeconfig import KubeconfigError


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host or "0.0.0.0", int(port)  # noqa: S104


async def _main(config: Config, options: RunOptions, crashpoint: Crashpoint | None) -> int:
    stop, hangup = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hangup.set)
    api = KubeApi.from_kubeconfig(options.kubeconfig, connections=connections_for(config.workers))
    try:
        controller = Controller(config, api, options.identity, crashpoint=crashpoint)
        return await controller.run(stop, options, hangup)
    finally:
        await api.close()


def run_controller(
    config: Config,
    *,
    kubeconfig: Path | None,
    identity: str,
    listen: str,
    config_path: Path | None = None,
    crashpoint: Crashpoint | None = None,
) -> int:
    """Run the controller until SIGTERM/SIGINT (`crashpoint`: the harness's only)."""
    host, port = _split_listen(listen)
    options = RunOptions(
        kubeconfig=kubeconfig,
        config_path=config_path,
        identity=identity or default_identity(),
        listen_host=host,
        listen_port=port,
    )
    return asyncio.run(_main(config, options, crashpoint))


def run_from_file(
    config_path: Path | None,
    *,
    kubeconfig: Path | None,
    identity: str,
    listen: str,
    crashpoint: Crashpoint | None = None,
    program: str = "gpuheal controller",
) -> int:
    """`gpuheal controller`: the config file read (2 and said when it is bad, or no
    kubeconfig is found, as kubectl says it), then the controller run on it."""
    try:
        config = load_config(config_path, check_files=True)
    except ConfigError as err:
        print(f"{program}: {err}", file=sys.stderr)
        return 2
    try:
        return run_controller(
            config,
            kubeconfig=kubeconfig,
            identity=identity,
            listen=listen,
            config_path=config_path,
            crashpoint=crashpoint,
        )
    except KubeconfigError as err:
        print(f"{program}: {err}", file=sys.stderr)
        return 2
