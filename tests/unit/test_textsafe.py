"""Strings from results, lockfiles and indexes reach the terminal shown, never obeyed."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.textsafe import PrintableStream, one_line, printable

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
        ("A100\u202e002H", "A100\\u202e002H"),  # right-to-left override
        (
            "iso\u2066late\u2069 mark\u200f sep\u2028",
            "iso\\u2066late\\u2069 mark\\u200f sep\\u2028",
        ),
    ],
)
def test_control_characters_are_written_as_escapes(text: str, shown: str) -> None:
    assert printable(text) == shown
    out = io.StringIO()
    assert PrintableStream(out).write(text) == len(text)
    assert out.getvalue() == shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("NVIDIA A100", "NVIDIA A100"),
        ("A100\n✓ forged", "A100\\x0a✓ forged"),
        ("tab\there\r", "tab\\x09here\\x0d"),
        ("A100\u202e", "A100\\u202e"),
    ],
)
def test_a_value_printed_in_a_line_stays_on_it(text: str, shown: str) -> None:
    assert one_line(text) == shown


def test_lock_verbose_prints_a_forged_gpu_name_on_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU name carrying a newline and a bidi override cannot print a line of its own."""
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    (tmp_path / "results").mkdir()
    src = DATA / "results" / "py3.11-default-torch2.5.1-xformers0.0.28.post3.a100.json"
    data = json.loads(src.read_text())
    forged = "\n✓ py3.10-default-torch2.4.1-xformers0.0.28.post1 verified FORGED\u202e"
    data["runner"]["gpus"][0]["name"] += forged
    (tmp_path / "results" / src.name).write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    args = ["lock", "-v", "--resolution", "locks/resolution.json", "--results", "results"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert not any(line.startswith("✓ py3.10") for line in err.splitlines())
    assert "\u202e" not in err
    assert "on NVIDIA A100-SXM4-80GB\\x0a✓ py3.10-default" in err


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
