"""A path that cannot be used is a one-line error naming it, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.errors import InputError
from envbuilder.index.pipconfig import default_index_url

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    (tmp_path / "a-file").write_text("not a directory\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["resolve", "--offline", "--matrix", "."], ".: Is a directory"),
        (
            ["lock", "--resolution", "locks/resolution.json", "-o", "a-file/compat.lock.json"],
            "a-file/compat.lock.json",
        ),
        (["lock", "--resolution", "locks"], "locks: cannot be read (Is a directory)"),
    ],
    ids=["matrix-is-a-directory", "out-below-a-file", "resolution-is-a-directory"],
)
def test_an_unusable_path_is_one_line_naming_it(
    workdir: Path, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc in (1, 2)
    assert said in err
    assert "Traceback" not in err
    assert sorted(p.name for p in workdir.iterdir()) == ["a-file", "locks"]


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1/simple",
        "http://u:secret@[::1/simple",
        "http://host:port/simple",
        # not an index: read as a directory, every combination was unsatisfiable
        "not a url",
        "htps://u:secret@mirror.example/simple",
        "https:///simple",
        "/srv/wheels",
    ],
)
def test_a_malformed_index_url_is_bad_input_with_its_password_hidden(url: str) -> None:
    with pytest.raises(InputError, match="malformed index-url") as caught:
        default_index_url({"PIP_INDEX_URL": url}, config_files=[])
    assert "secret" not in str(caught.value)
    assert "PIP_INDEX_URL or index-url in pip.conf" in str(caught.value)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("not a url", "'not a url' (not an http, https or file URL)"),
        ("htps://mirror.example/simple", "'htps://mirror.example/simple' (not an http, https"),
    ],
)
def test_resolve_stops_on_an_index_url_that_is_not_one(
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    url: str,
    why: str,
) -> None:
    """Not every row unsatisfiable and exit 0, replacing earlier answers: one line, exit 2."""
    monkeypatch.setenv("PIP_INDEX_URL", url)
    before = sorted(p.name for p in workdir.rglob("*"))
    assert main(["resolve", "py3.12*", "--matrix", str(DATA.parents[1] / "matrix.toml")]) == 2
    err = capsys.readouterr().err
    assert f"malformed index-url {why}" in err and "Traceback" not in err
    assert sorted(p.name for p in workdir.rglob("*")) == before


def test_a_malformed_index_url_in_the_environment_is_one_line(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://u:secret@[::1/simple")
    assert main(["resolve", "py3.12*", "--matrix", str(DATA.parents[1] / "matrix.toml")]) == 2
    err = capsys.readouterr().err
    assert "malformed index-url 'http://u:***@[::1/simple'" in err
    assert "Traceback" not in err
