"""``publish -o DIR`` replaces DIR as a whole: only an absent or empty directory, or an earlier
site, may be replaced; anything else is refused (exit 2) with every file left as it was."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main

SITE_MARKER = ".envbuilder-site"  # what marks a directory as an earlier site

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    shutil.copytree(DATA / "results", tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    assert main(["lock", "--resolution", "locks/resolution.json", "--results", "results"]) == 0
    return tmp_path


def files_below(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("target", ["docs", "."], ids=["a-users-directory", "the-project-itself"])
def test_a_directory_of_other_files_is_refused_and_kept(
    workdir: Path, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / "docs").mkdir()
    (workdir / "docs" / "guide.md").write_text("a user's notes\n")
    before = files_below(workdir)
    assert main(["publish", "-o", target]) == 2
    err = capsys.readouterr().err
    assert "not an envbuilder site" in err and "nothing was changed" in err
    assert files_below(workdir) == before


def test_a_file_is_refused(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "site").write_text("not a directory\n")
    assert main(["publish", "-o", "site"]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert (workdir / "site").read_text() == "not a directory\n"


@pytest.mark.parametrize("existing", ["absent", "empty"])
def test_a_new_or_empty_directory_gets_the_site_and_its_marker(
    workdir: Path, existing: str
) -> None:
    if existing == "empty":
        (workdir / "site").mkdir()
    assert main(["publish", "-o", "site"]) == 0
    assert {"index.html", "compat.md", "compat.lock.json", SITE_MARKER} <= set(
        files_below(workdir / "site")
    )


def test_an_earlier_site_is_replaced_whole(workdir: Path) -> None:
    assert main(["publish", "-o", "site"]) == 0
    (workdir / "site" / "stale.html").write_text("from an earlier publish\n")
    assert main(["publish", "-o", "site"]) == 0
    assert not (workdir / "site" / "stale.html").exists()
    assert (workdir / "site" / "index.html").is_file()
