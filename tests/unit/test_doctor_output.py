"""``doctor``'s answer fits the terminal, broken between words, and ends with one line
saying whether every check held for which row (not "FAIL: lockfile verdict verified")."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.commands.doctor import verdict_line

DATA = Path(__file__).parents[1] / "data"


@pytest.mark.parametrize(
    ("ok", "combination", "verdict", "line"),
    [
        (True, "py3.11-x", "verified", "✓ every check holds for py3.11-x (its verdict in the lockfile: verified)"),
        (False, "py3.11-x", "verified", "✕ not every check holds for py3.11-x (its verdict in the lockfile: verified)"),
        (False, None, None, "✕ no combination of the lockfile matches this environment"),
    ],
)  # fmt: skip
def test_the_last_line_says_what_held_for_which_row(
    ok: bool, combination: str | None, verdict: str | None, line: str
) -> None:
    assert verdict_line(ok, combination, verdict) == line


@pytest.mark.parametrize("columns", [80, 120])
def test_every_line_fits_the_terminal_without_breaking_a_word(
    columns: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main([*argv, "-o", "compat.lock.json"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", str(columns))
    doctor = ["doctor", "--no-probe", "--no-hashes", "--python", sys.executable]
    assert main([*doctor, "--lock", "compat.lock.json"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert [line for line in lines if len(line) > columns] == []
    assert lines[-1] == "✕ no combination of the lockfile matches this environment"
    # the words are those of the unwrapped answer: nothing was cut inside one
    assert (
        " ".join(out.split()).count("no combination in the lockfile matches this environment") == 1
    )
