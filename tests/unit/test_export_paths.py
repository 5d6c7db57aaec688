"""export reads a combination's lock only from beside the lockfile, whatever the lockfile says."""

from __future__ import annotations

import json
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
