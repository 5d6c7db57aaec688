"""A lockfile's verdicts are made again from its runs on every read: one flipped and resealed
changes nothing that readers do."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.lockfile.canonical import HASH_KEY, content_sha256
from envbuilder.lockfile.read import load_lockfile

DATA = Path(__file__).parents[1] / "data"
BROKEN = "py3.10-default-torch2.4.1-xformers0.0.28.post1"


@pytest.fixture
def flipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The synthetic lockfile with a broken row's every verdict set to verified, resealed."""
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    shutil.copytree(DATA / "results", tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    assert main(["lock", "--resolution", "locks/resolution.json", "--results", "results"]) == 0
    path = tmp_path / "compat.lock.json"
    data = json.loads(path.read_text())
    (entry,) = [e for e in data["combinations"] if e["id"] == BROKEN]
    assert entry["verdict"]["verdict"] == "broken"

    def flip(value: object) -> None:
        if isinstance(value, dict):
            if value.get("verdict") in ("broken", "unverified"):
                value["verdict"] = "verified"
            for child in value.values():
                flip(child)
        elif isinstance(value, list):
            for child in value:
                flip(child)

    flip(entry)
    data[HASH_KEY] = content_sha256(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def test_a_flipped_verdict_is_made_again_from_the_runs(
    flipped: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        entry = load_lockfile(flipped).by_id()[BROKEN]
    assert entry.verdict.verdict == "broken"
    assert {u.verdict.verdict for u in entry.uses} == {"broken"}
    assert "is recorded verified, its runs give broken" in caplog.text


def test_install_refuses_a_flipped_row_without_allow_unverified(
    flipped: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    venv = flipped.parent / "venv"
    assert main(["install", BROKEN, "--venv", str(venv), "--dry-run"]) == 2
    assert f"refusing to install {BROKEN!r}: it is broken" in capsys.readouterr().err
    assert not venv.exists()
