"""``query --json`` has one shape, whatever was asked: an object naming the lockfile that
answered (path, URL, whether it is the carried snapshot) and its age, beside the query, the
matches and the rejections."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.consumer.snapshot import newest_evidence
from envbuilder.lockfile.read import load_lockfile

DATA = Path(__file__).parents[1] / "data"
KEYS = ["lockfile", "interpreter", "host", "query", "matches", "rejected"]


@pytest.fixture
def lockfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main([*argv, "-o", "compat.lock.json"]) == 0
    return tmp_path / "compat.lock.json"


@pytest.mark.parametrize(
    "argv",
    [[], ["--python", "3.11"], ["--arch", "x86_64"], ["--driver", "550.54.15"]],
    ids=lambda a: " ".join(a) or "plain",
)
def test_every_query_answers_one_object_naming_the_lockfile_and_its_age(
    lockfile: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    capsys.readouterr()
    assert main(["query", "--json", *argv]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    assert list(out) == KEYS
    day = newest_evidence(load_lockfile(lockfile))
    assert day is not None
    assert out["lockfile"] == {
        "path": "compat.lock.json",
        "url": None,
        "carried": False,
        "newest_evidence": day,
        "age_days": (datetime.now(UTC).date() - date.fromisoformat(day)).days,
    }
    assert all("id" in m and "verdict" in m for m in out["matches"])
