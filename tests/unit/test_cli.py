from __future__ import annotations

from pathlib import Path

import pytest

from gpuheal import __version__
from gpuheal.cli import build_parser, main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpuheal {__version__}"


def test_demo_defaults_match_the_readme() -> None:
    args = build_parser().parse_args(["demo"])
    assert (args.nodes, args.replicas, args.gpus_per_pod, args.keep) == (20, 32, 2, False)


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_controller_refuses_a_bad_config_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("breakerMaxPercent: 250\n")
    assert main(["controller", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "breakerMaxPercent: must be between 0 and 100, got 250" in err
