"""``query`` fits the terminal it prints to: no line wider than ``COLUMNS``, cut at a word
with "…", and one screen of lines with "… N more" wherever a list is cut."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.consumer.advice import fit
from envbuilder.lockfile.canonical import seal
from envbuilder.lockfile.model import CompatLock

#: the lines one answer may take
SCREEN_LINES = 40


@pytest.mark.parametrize(
    ("text", "width", "fitted"),
    [
        ("short enough", 20, "short enough"),
        ("no results yet for this row", 20, "no results yet for…"),
        ("no results yet; for this row", 17, "no results yet…"),
        ("py3.12-cu130-torch2.11.0-xformers0.0.35", 20, "py3.12-cu130-torch2…"),
        ("a b", 1, "…"),
    ],
)
def test_a_line_is_cut_at_a_word_with_an_ellipsis(text: str, width: int, fitted: str) -> None:
    assert fit(text, width) == fitted
    assert len(fitted) <= width


@pytest.fixture
def synthetic(compat: CompatLock, tmp_path: Path) -> list[str]:
    path = tmp_path / "compat.lock.json"
    path.write_bytes(seal(compat.to_json()))
    return ["--lock", str(path)]


@pytest.fixture
def snapshot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The lockfile this envbuilder carries: no local one, no configured URL."""
    monkeypatch.delenv("ENVBUILDER_LOCK_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    return []


def _query(
    argv: list[str],
    columns: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[list[str], list[str]]:
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("LINES", "60")  # taller than one answer: the answer stays one screen
    main(["query", *argv])
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err.splitlines()


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("lockfile", ["snapshot", "synthetic"])
@pytest.mark.parametrize(
    "options",
    [[], ["--long"], ["--driver", "535"], ["--gpu", "H100", "--driver", "535", "--long"]],
    ids=["plain", "long", "driver", "gpu-driver-long"],
)
def test_every_line_fits_the_terminal(
    lockfile: str,
    columns: int,
    options: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    lock = request.getfixturevalue(lockfile)
    out, err = _query([*lock, *options], columns, monkeypatch, capsys)
    assert out
    too_wide = [line for line in out + err if len(line) > columns]
    assert not too_wide
    assert len(out) <= SCREEN_LINES


def test_a_driver_too_old_for_many_rows_stays_one_screen_and_counts_what_is_cut(
    snapshot: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = _query(["--driver", "535"], 80, monkeypatch, capsys)
    assert len(out) <= SCREEN_LINES
    assert any(line.lstrip().startswith("… ") and " more" in line for line in out)


def test_a_narrow_terminal_cuts_a_list_and_says_how_many_more(
    snapshot: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "12")
    main(["query", "--driver", "535"])
    out = capsys.readouterr().out.splitlines()
    assert len(out) <= 12
    assert any(line.lstrip().startswith("… ") and " more" in line for line in out)


@pytest.mark.parametrize("lines", [20, 40])
def test_one_combinations_causes_stay_one_screen_and_count_what_is_cut(
    snapshot: list[str],
    lines: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``query ID`` lists every use's causes: a row with many is cut to the screen."""
    from envbuilder.consumer.snapshot import embedded
    from envbuilder.lockfile.read import load_lockfile

    carried = embedded()
    assert carried is not None
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", str(lines))
    cut = 0
    for entry in load_lockfile(carried).combinations:
        if not entry.runs:
            continue
        main(["query", entry.id])
        out = capsys.readouterr().out.splitlines()
        assert len(out) <= lines, entry.id
        cut += sum(line.startswith("… ") and " more lines" in line for line in out)
    assert cut, "no row of the snapshot has more causes than one screen"


def test_an_interpreter_not_found_is_said_whole_within_the_width(
    snapshot: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``query --here --python 3.10`` where there is none: why, on as many lines as it needs."""
    import sys

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch(mode=0o755)
    (venv / "pyvenv.cfg").write_text("version = 3.11.7\n")
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    (tmp_path / "empty-path").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))  # no uv, no python3.10, no GPU
    monkeypatch.setitem(sys.modules, "pynvml", None)
    out, _ = _query(["--here", "--python", "3.10"], 80, monkeypatch, capsys)
    assert [line for line in out if len(line) > 80] == []
    said = " ".join(" ".join(out).split())
    assert (
        "interpreter: none (no Python 3.10 found: $VIRTUAL_ENV is Python 3.11; no python3.10 "
        "on PATH. Install one (`uv python install 3.10`) or pass --python PATH)"
    ) in said
    assert "this machine: no Python found, " in said
