"""``install`` without uv: pip installs the hash-pinned requirements, said once; a dry run
never fails for a missing installer."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from envbuilder.cli import main

DATA = Path(__file__).parents[1] / "data"
VERIFIED = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


@pytest.fixture
def without_uv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The synthetic lockfile, an active Python 3.11 venv with pip (as its files show it),
    and no uv: neither the ``uv`` package nor a ``uv`` on PATH."""
    venv = tmp_path / "user-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch(mode=0o755)
    (venv / "pyvenv.cfg").write_text("include-system-site-packages = false\nversion = 3.11.7\n")
    (venv / "lib" / "python3.11" / "site-packages" / "pip").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages" / "pip" / "__init__.py").touch()
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.setenv("ENVBUILDER_CACHE_DIR", str(tmp_path / "envbuilder-cache"))
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main(argv) == 0
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setitem(sys.modules, "uv", None)  # `import uv` fails
    return tmp_path


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
