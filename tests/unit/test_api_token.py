"""The API's tokens from a mounted Secret: read again when the kubelet swaps it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuheal.api.token import ApiTokens
from gpuheal.sim.secretvolume import SecretVolume

OLD = b"0ld-t0ken-kR3vX9qLm2ZpW7yNc4Tb8sJh6"
NEW = b"n3w-t0ken-Qa5Ud1Ef7Gh2Jk9Lm4No6Pq8"


def test_a_kubelet_style_swap_replaces_the_accepted_token(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "token", {"token": OLD.decode() + "\n"})
    tokens = ApiTokens(volume.path("token"))
    assert tokens.refresh()
    assert tokens.identify(OLD) is not None and tokens.identify(NEW) is None
    assert not tokens.refresh()  # unchanged: not read again
    volume.update({"token": NEW.decode() + "\n"})
    assert tokens.refresh()
    assert tokens.identify(NEW) is not None and tokens.identify(OLD) is None


def test_one_token_a_line_lets_a_rotation_overlap(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "token", {"token": OLD.decode()})
    tokens = ApiTokens(volume.path("token"))
    tokens.refresh()
    volume.update({"token": f"{OLD.decode()}\r\n\n  {NEW.decode()}  \n"})
    tokens.refresh()
    assert tokens.count == 2
    old, new = tokens.identify(OLD), tokens.identify(NEW)
    assert old and new and old != new  # two budgets
    for partial in (b"", OLD[:-1], OLD + b"x", OLD + b"\n" + NEW, b"\xff" + NEW):
        assert tokens.identify(partial) is None


def test_an_emptied_file_refuses_all_and_an_unreadable_one_keeps_the_last(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    volume = SecretVolume(tmp_path / "token", {"token": OLD.decode()})
    tokens = ApiTokens(volume.path("token"))
    tokens.refresh()
    volume.update({"token": " \n"})
    assert tokens.refresh() and tokens.count == 0 and tokens.identify(OLD) is None
    volume.update({"token": NEW.decode()})
    tokens.refresh()
    caplog.clear()
    (tmp_path / "token" / "..data").unlink()  # the mount broken under us
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            assert not tokens.refresh()
    assert tokens.identify(NEW) is not None
    assert [r.getMessage() for r in caplog.records] == [
        "apiTokenFile unreadable; keeping the tokens read last"
    ]  # once, not at every poll
    assert all(NEW.decode() not in r.getMessage() + str(vars(r)) for r in caplog.records)


def test_without_a_file_nothing_is_accepted(caplog: pytest.LogCaptureFixture) -> None:
    tokens = ApiTokens(None)
    with caplog.at_level(logging.INFO):
        tokens.refresh()
        tokens.refresh()
    assert tokens.identify(b"") is None and tokens.identify(b"anything") is None
    assert [r.getMessage() for r in caplog.records] == [
        "no API token: every request that needs one is refused"
    ]
