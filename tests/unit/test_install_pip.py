"""``install`` without uv: pip installs the hash-pinned requirements, said once; a dry run
never fails for a missing installer."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuilder.cli import main
from tests.support.user_venv import pip_venv_without_uv

DATA = Path(__file__).parents[1] / "data"
VERIFIED = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


@pytest.fixture
def without_uv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The synthetic lockfile, an active Python 3.11 venv with pip, and no uv."""
    return pip_venv_without_uv(tmp_path, monkeypatch)


def _commands(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("+ ")]


def test_without_uv_pip_installs_with_hashes_and_says_so_once(
    without_uv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["install", VERIFIED, "--dry-run", "--lock", "compat.lock.json"]) == 0
    err = capsys.readouterr().err
    (command,) = _commands(err)
    assert " -m pip install --require-hashes " in command
    assert err.count("uv is not installed here: installing with pip") == 1


def test_a_dry_run_asking_for_uv_prints_its_commands_though_uv_is_missing(
    without_uv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    argv = ["install", VERIFIED, "--dry-run", "--installer", "uv", "--lock", "compat.lock.json"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    (command,) = _commands(err)
    assert command.startswith("+ uv pip install ")
    assert "uv is not installed here" in err
