"""export reads a combination's lock only from beside the lockfile, whatever the lockfile says."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.lockfile.canonical import HASH_KEY, content_sha256

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    shutil.copytree(DATA / "results", tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    assert main(["lock", "--resolution", "locks/resolution.json", "--results", "results"]) == 0
    return tmp_path


def point_lock_at(workdir: Path, where: str) -> str:
    """Rewrite the first locked entry's lock path and reseal the lockfile; return its id."""
    path = workdir / "compat.lock.json"
    data = json.loads(path.read_text())
    entry = next(e for e in data["combinations"] if e.get("lock"))
    entry["lock"]["path"] = where
    data[HASH_KEY] = content_sha256(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return str(entry["id"])


@pytest.mark.parametrize(
    "where", ["/etc/passwd", "/dev/zero", "../outside/pylock.toml", "locks/../../x.toml"]
)
def test_a_lock_path_outside_the_lockfiles_directory_is_refused(
    workdir: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    combination = point_lock_at(workdir, where)
    capsys.readouterr()
    assert main(["export", combination]) == 2
    err = capsys.readouterr().err
    assert "outside the lockfile's directory" in err
    assert repr(where) in err


TORCH_WHEEL = re.compile(r'^wheels = \[\{ url = "https://wheels\.invalid/packages/torch-.*$', re.M)
SHA = "9c0fcc16584ea4f5505b513355e197109c06e1701eb64d513bd8f59b36f8ce7a"


@pytest.mark.parametrize(
    ("locked", "said"),
    [
        (
            'wheels = [{ url = "http://wheels.invalid/packages/torch-2.5.1-cp311-cp311-'
            f'manylinux_2_28_x86_64.whl", size = 1000, hashes = {{ sha256 = "{SHA}" }} }}]',
            "is not on https://",
        ),
        (
            'sdist = { url = "https://wheels.invalid/packages/torch-2.5.1.tar.gz", '
            f'size = 1000, hashes = {{ sha256 = "{SHA}" }} }}',
            "source distribution",
        ),
    ],
    ids=["plain-http", "sdist"],
)
@pytest.mark.parametrize("command", ["export-pylock", "install-venv"])
def test_every_export_and_install_path_refuses_what_must_not_be_fetched(
    workdir: Path, locked: str, said: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pylock export (uv's input) makes the requirements export's checks, before
    `install` creates a venv or calls anything."""
    combination = "py3.11-default-torch2.5.1-xformers0.0.28.post3"
    pylock = workdir / "locks" / f"pylock.{combination}.toml"
    text, count = TORCH_WHEEL.subn(locked, pylock.read_text())
    assert count == 1
    pylock.write_text(text)
    # as a lockfile and locks published together would carry it (the lockfile sealed anew)
    path = workdir / "compat.lock.json"
    data = json.loads(path.read_text())
    (entry,) = [c for c in data["combinations"] if c["id"] == combination]
    entry["lock"]["sha256"] = hashlib.sha256(text.encode()).hexdigest()
    data[HASH_KEY] = content_sha256(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    capsys.readouterr()
    venv = workdir / "venv"
    argv = (
        ["export", combination, "--format", "pylock", "-o", "pylock.out.toml"]
        if command == "export-pylock"
        else ["install", combination, "--venv", str(venv), "--allow-unverified"]
    )
    assert main(argv) == 2
    assert said in capsys.readouterr().err
    assert not venv.exists()
    assert not (workdir / "pylock.out.toml").exists()
