"""Strings from results, lockfiles and indexes reach the terminal shown, never obeyed."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.textsafe import PrintableStream, printable

DATA = Path(__file__).parents[1] / "data"
BROKEN = "py3.10-default-torch2.4.1-xformers0.0.28.post1"  # two failing checks
ESCAPES = "\x1b[2J\x1b]0;owned\x07\r\x9b31m"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, tabs\tand\nnewlines", "plain text, tabs\tand\nnewlines"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("over\rwrite", "over\\x0dwrite"),
        ("csi\x9b2J del\x7f nul\x00", "csi\\x9b2J del\\x7f nul\\x00"),
        ("H200 · sm_90 ✓", "H200 · sm_90 ✓"),
    ],
)
def test_control_characters_are_written_as_escapes(text: str, shown: str) -> None:
    assert printable(text) == shown
    out = io.StringIO()
    assert PrintableStream(out).write(text) == len(text)
    assert out.getvalue() == shown


def test_a_check_reason_with_escapes_in_a_results_file_is_shown_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    (tmp_path / "results").mkdir()
    for src in sorted((DATA / "results").glob("*.json")):
        data = json.loads(src.read_text())
        for check in data["checks"]:
            if check["status"] != "pass":
                check["reason"] = ESCAPES + check["reason"]
        (tmp_path / "results" / src.name).write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    assert main(["lock", "--resolution", "locks/resolution.json", "--results", "results"]) == 0
    capsys.readouterr()
    assert main(["query", BROKEN]) == 0
    out = capsys.readouterr().out
    assert "\\x1b[2J" in out
    assert not any(c in out for c in "\x1b\x07\r\x9b")
