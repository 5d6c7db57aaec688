"""``query`` ranks by evidence on the user's GPU architecture; Python, CUDA and the driver
are suggestions when changing them reaches a verified combination.

The synthetic lockfile of ``tests/data`` is remade with its runs moved from an H100 to an
H200 and the 3.11 rows' runs left out, as on the published lockfile: for an H100 (the
same architecture, sm_90) with Python 3.11 the best answer needs Python 3.12.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from envbuilder.aggregate.merge import build_lockfile
from envbuilder.aggregate.results import find_results
from envbuilder.cli import main
from envbuilder.consumer.query import Query, answer
from envbuilder.consumer.query_text import render
from envbuilder.lockfile.canonical import seal
from envbuilder.lockfile.model import CompatLock
from envbuilder.model import load_resolution

DATA = Path(__file__).parents[1] / "data"
H200_ROW = "py3.12-default-torch2.11.0-xformers0.0.35"
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _lockfile(root: Path, on_h100: tuple[str, ...] = ()) -> tuple[CompatLock, Path]:
    """The lockfile with every run on an H200, but those of *on_h100*."""
    shutil.copytree(DATA / "locks", root / "locks")
    results = root / "results"
    results.mkdir()
    for file in (DATA / "results").glob("*.json"):
        if file.name.startswith("py3.11-"):
            continue  # the 3.11 rows stay untested
        text = file.read_text()
        if not file.name.startswith(tuple(f"{c}." for c in on_h100)):
            text = text.replace("NVIDIA H100 80GB HBM3", "NVIDIA H200")
        (results / file.name).write_text(text)
    resolution = root / "locks" / "resolution.json"
    out = root / "compat.lock.json"
    lock, rejected = build_lockfile(
        load_resolution(resolution),
        resolution_path=resolution,
        results=find_results([results]),
        out=out,
    )
    assert not rejected
    out.write_bytes(seal(lock.to_json()))
    return lock, out


@pytest.fixture
def published(tmp_path: Path) -> tuple[CompatLock, Path]:
    return _lockfile(tmp_path)


def test_the_h200_verified_row_comes_first_for_an_h100_with_its_suggestion(
    published: tuple[CompatLock, Path],
) -> None:
    lock, _ = published
    result = answer(lock, Query(gpu="H100", python="3.11", suggest=True))
    first = result.matches[0]
    assert first.entry.id == H200_ROW
    assert first.evidence is not None
    assert first.evidence.text == "verified on H200 (same architecture, sm_90)"
    assert first.suggestion == (
        "verified with Python 3.12: `uv venv -p 3.12`, then "
        f"`envbuilder install {H200_ROW} --python .venv`"
    )
    # the 3.11 rows that fit as asked are untested: after every verified one
    untested = [m.entry.id for m in result.matches if m.entry.python == "3.11"]
    assert untested and all(
        result.matches.index(m) > 0 for m in result.matches if m.entry.id in untested
    )


def test_the_query_command_prints_the_suggestion_under_the_first_row(
    published: tuple[CompatLock, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, path = published
    monkeypatch.setenv("COLUMNS", "200")  # the evidence beside the action, on the row's line
    assert main(["query", "--gpu", "H100", "--python", "3.11", "--lock", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["verified-with-workaround", H200_ROW]
    assert lines[1].endswith("[verified on H200 (same architecture, sm_90)]")
    assert lines[2] == (
        "    ↳ verified with Python 3.12: `uv venv -p 3.12`, then "
        f"`envbuilder install {H200_ROW} --python .venv`"
    )


def test_a_python_that_reaches_nothing_verified_stays_a_filter(
    published: tuple[CompatLock, Path],
) -> None:
    lock, _ = published
    result = answer(lock, Query(gpu="H100", python="3.11", suggest=True))
    rejected = {r.entry.id: r.reason for r in result.rejected}
    # broken on sm_90 with Python 3.12: not a suggestion, still "not for this Python"
    assert rejected["py3.12-default-torch2.10.0-xformers0.0.34"] == "Python 3.12, not 3.11"
    assert all(m.entry.python == "3.11" or m.changes for m in result.matches)


@pytest.mark.parametrize(
    ("gpu", "order"),
    [
        # this GPU, then the same architecture: the H200 rows before the H100 one
        ("H200", ["verified on H200", "verified on H100 (same architecture, sm_90)"]),
        # another architecture: verified elsewhere ranks above untested
        ("A100", ["verified elsewhere: on H200 (sm_90), not on sm_80", None]),
    ],
)
def test_evidence_ranks_this_gpu_then_its_architecture_then_elsewhere_then_untested(
    tmp_path: Path, gpu: str, order: list[str | None]
) -> None:
    lock, _ = _lockfile(tmp_path, on_h100=("py3.12-default-torch2.7.0-xformers0.0.30-cudart",))
    result = answer(lock, Query(gpu=gpu, python="3.12", suggest=True))
    said = [m.evidence.text if m.evidence else None for m in result.matches]
    seen = [said.index(text) for text in order]
    assert seen == sorted(seen), said


def test_without_a_gpu_only_builds_for_the_cpu_match(published: tuple[CompatLock, Path]) -> None:
    lock, _ = published
    result = answer(lock, Query(no_gpu=True))
    assert all(m.entry.cuda_release is None for m in result.matches)
    reasons = [r.reason for r in result.rejected if r.entry.cuda_release is not None]
    assert reasons and all("and no NVIDIA GPU here" in r for r in reasons)


def test_the_answer_fits_one_screen(published: tuple[CompatLock, Path]) -> None:
    lock, _ = published
    lines = render(answer(lock, Query(gpu="H100", python="3.11", suggest=True)), use=None, now=NOW)
    assert len(lines) <= 40 and all(len(line) <= 200 for line in lines)
