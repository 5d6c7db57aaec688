"""A carried run's ``source`` means something beside the new lockfile.

A run's ``source`` is its results file's path relative to the lockfile that read it. Carried
by ``lock --previous`` into a lockfile elsewhere (the aggregate job downloads the previous
release's lockfile, whose results files it does not have), that path points nowhere: the
run then says which lockfile the path belongs to (``carried from lockfile <sha256>: <path>``,
docs/contracts.md). Where the path still leads to the run's own bytes the source stays as it
was, so a lockfile made in parts is byte for byte the one made at once.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuilder.aggregate.results import CARRIED_FROM
from envbuilder.cli import main

DATA = Path(__file__).parents[1] / "data"
EVERYTHING = ("results", "stale_results", "retired_results")
FRESH = "results/py3.12-default-torch2.10.0-xformers0.0.34.h100.json"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("locks", *EVERYTHING):
        shutil.copytree(DATA / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def lock(*extra: str) -> int:
    return main(["lock", "--resolution", "locks/resolution.json", *extra])


def runs(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for entry in document["combinations"]:
        yield from entry["runs"]
        yield from entry["stale_runs"]
    for retired in document["retired"]:
        yield from retired["runs"]


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def elsewhere(workdir: Path) -> Path:
    """A previous lockfile made of every results file, moved where its results are not."""
    assert lock("--results", *EVERYTHING, "-o", "made.json") == 0
    (workdir / "earlier").mkdir()
    return (workdir / "made.json").rename(workdir / "earlier" / "compat.lock.json")


def test_a_carried_run_whose_path_leads_nowhere_names_its_lockfile(workdir: Path) -> None:
    previous = elsewhere(workdir)
    sealed = read(previous)["content_sha256"]
    for name in EVERYTHING:  # the aggregate job has the new run's results file only
        for path in (workdir / name).glob("*.json"):
            if path.relative_to(workdir).as_posix() != FRESH:
                path.unlink()
    assert lock("--results", FRESH, "--previous", str(previous), "-o", "site/new.json") == 0
    new = read(workdir / "site" / "new.json")
    was = {(r["source_sha256"], r["started"]): r["source"] for r in runs(read(previous))}
    found = {(r["source_sha256"], r["started"]): r["source"] for r in runs(new)}
    assert found.keys() == was.keys() and len(found) == 14
    for key, source in found.items():
        if was[key] == FRESH:  # read in this merge: relative to the new lockfile, as always
            assert source == "../" + FRESH
        else:
            assert source == f"{CARRIED_FROM}{sealed}: {was[key]}"
            assert source.startswith("carried from lockfile ")


def test_a_run_carried_again_keeps_the_lockfile_it_first_came_from(workdir: Path) -> None:
    previous = elsewhere(workdir)
    sealed = read(previous)["content_sha256"]
    for name in EVERYTHING:
        shutil.rmtree(workdir / name)
    assert lock("--results", "--previous", str(previous), "-o", "once.json") == 0
    assert lock("--results", "--previous", "once.json", "-o", "twice.json") == 0
    assert (workdir / "twice.json").read_bytes() == (workdir / "once.json").read_bytes()
    sources = [r["source"] for r in runs(read(workdir / "twice.json"))]
    assert len(sources) == 14
    assert all(s.startswith(f"{CARRIED_FROM}{sealed}: ") for s in sources)
    assert not any(s.count("carried from") > 1 for s in sources)


def test_a_carried_path_to_other_bytes_is_not_the_run_s_source(workdir: Path) -> None:
    """The path is kept only where it leads to the bytes the run was read from."""
    assert lock("--results", *EVERYTHING, "-o", "previous.json") == 0
    edited = workdir / FRESH
    edited.write_bytes(edited.read_bytes() + b"\n")
    assert lock("--results", "--previous", "previous.json", "-o", "new.json") == 0
    sealed = read(workdir / "previous.json")["content_sha256"]
    sources = sorted(r["source"] for r in runs(read(workdir / "new.json")))
    assert f"{CARRIED_FROM}{sealed}: {FRESH}" in sources
    # the other 13 files are where the paths say, with their bytes: kept as they were
    assert sum(s.startswith(CARRIED_FROM) for s in sources) == 1
    assert len(sources) == 14


def test_a_previous_lockfile_beside_its_results_gives_itself_again(workdir: Path) -> None:
    assert lock("--results", *EVERYTHING, "-o", "previous.json") == 0
    assert lock("--results", "--previous", "previous.json", "-o", "same.json") == 0
    assert (workdir / "same.json").read_bytes() == (workdir / "previous.json").read_bytes()
