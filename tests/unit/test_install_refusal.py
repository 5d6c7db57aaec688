"""``install`` on a row that is not verified: refused (exit 2) naming the verified row to
install instead and how to get there, as ``query`` does; on a machine without an NVIDIA GPU
a CUDA build installs, said once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.lockfile.model import INSTALLABLE, Entry
from envbuilder.lockfile.read import load_lockfile
from tests.support.user_venv import pip_venv_without_uv

DATA = Path(__file__).parents[1] / "data"
COMMITTED = Path(__file__).parents[2] / "envbuilder" / "data" / "compat.lock.json"
VERIFIED = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


def _sibling(entry: Entry, entries: list[Entry]) -> Entry | None:
    for other in entries:
        same = (other.torch, other.xformers, other.cuda) == (
            entry.torch,
            entry.xformers,
            entry.cuda,
        )
        if same and other.id != entry.id and other.verdict.verdict in INSTALLABLE:
            return other
    return None


def test_an_unverified_row_names_the_verified_one_on_another_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = list(load_lockfile(COMMITTED).combinations)
    pairs = [
        (e, s)
        for e in entries
        if e.verdict.verdict == "unverified" and e.lock is not None
        for s in [_sibling(e, entries)]
        if s is not None
    ]
    assert pairs, "the committed lockfile has no unverified row beside a verified sibling"
    unverified, verified = pairs[0]
    monkeypatch.setenv("ENVBUILDER_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["install", unverified.id, "--dry-run", "--lock", str(COMMITTED)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"refusing to install {unverified.id!r}: it is unverified; " in err
    assert (
        f"{verified.id!r} is verified with Python {verified.python}: "
        f"`uv venv -p {verified.python}`, then `envbuilder install {verified.id} --python .venv`"
    ) in err
    assert err.rstrip().endswith("pass --allow-unverified to install it anyway")


@pytest.fixture
def no_gpu_no_uv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The synthetic lockfile, an active Python 3.11 venv with pip, no uv, no GPU."""
    pip_venv_without_uv(tmp_path, monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # and no NVML: no GPU
    return tmp_path


def test_a_cuda_build_on_a_machine_without_a_gpu_is_said_once(
    no_gpu_no_uv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["install", VERIFIED, "--dry-run", "--lock", "compat.lock.json"]) == 0
    err = capsys.readouterr().err
    assert err.count("no NVIDIA GPU here") == 1
    assert f"! no NVIDIA GPU here (no NVML and no nvidia-smi on PATH): {VERIFIED} installs" in err


@pytest.mark.parametrize("columns", [80, 120])
def test_installs_sentences_fit_the_terminal_and_its_commands_stay_whole(
    no_gpu_no_uv: Path,
    columns: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    capsys.readouterr()
    assert main(["install", VERIFIED, "--dry-run", "--lock", "compat.lock.json"]) == 0
    lines = capsys.readouterr().err.splitlines()
    commands = [line for line in lines if line.startswith("+ ")]
    assert len(commands) == 1 and " -m pip install --require-hashes " in commands[0]
    too_wide = [
        line
        for line in lines
        if len(line) > columns and not line.startswith("+ ") and " " in line.strip()
    ]
    assert too_wide == []
