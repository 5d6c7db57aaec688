"""``envbuilder resolve``: arguments, bad input (exit 2, nothing written), progress and summary."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from envbuilder import cli
from envbuilder.commands import resolve as command
from envbuilder.model import Rejection, ResolvedCombination
from envbuilder.reporter import Reporter
from tests.support.cells import cell

MATRIX = """
[axes]
python = ["3.11"]

[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.4.1"
xformers = "0.0.28.post1"
"""


def _result(
    status: str, reason: str, *, cid: str = "py3.11-cu121-torch2.4.1"
) -> ResolvedCombination:
    return ResolvedCombination(
        combination=cell(cid),
        status=status,  # type: ignore[arg-type]
        reason=reason,
        notes=("a note",),
        rejected=(Rejection(project="torch", filename="torch-2.4.1-cp312.whl", reason="tags"),),
    )


def test_defaults() -> None:
    args = cli.parse(["resolve"])
    assert (args.selectors, args.matrix, args.out, args.cache_dir) == (
        [],
        Path("matrix.toml"),
        Path("locks"),
        None,
    )
    assert (args.offline, args.upgrade, args.jobs, args.json, args.verbose) == (
        False,
        False,
        16,
        False,
        0,
    )


def test_options() -> None:
    argv = ["resolve", "cu121", "py3.11", "--matrix", "m.toml", "--out", "o", "--cache-dir", "c"]
    argv += ["--offline", "--upgrade", "--jobs", "3", "--json", "-v"]
    args = cli.parse(argv)
    assert args.selectors == ["cu121", "py3.11"]
    assert (args.matrix, args.out, args.cache_dir) == (Path("m.toml"), Path("o"), Path("c"))
    assert (args.offline, args.upgrade, args.jobs, args.json, args.verbose) == (
        True,
        True,
        3,
        True,
        1,
    )


@pytest.mark.parametrize(
    ("matrix_text", "extra", "message"),
    [
        (MATRIX, ["--jobs", "0"], "--jobs must be at least 1, not 0"),
        (MATRIX, ["cu999"], "cu999"),
        ("[axes]\npython = [3.11]\n", [], "got float 3.11"),
        ("not toml [", [], "TOML syntax error"),
    ],
)
def test_bad_input_exits_2_with_the_problem_and_writes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    matrix_text: str,
    extra: list[str],
    message: str,
) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(matrix_text, encoding="utf-8")
    out = tmp_path / "locks"
    argv = ["resolve", "--matrix", str(matrix), "--out", str(out), "--cache-dir", str(tmp_path)]
    rc = cli.main([*argv, *extra])
    captured = capsys.readouterr()
    assert rc == 2
    assert message in captured.err
    assert captured.err.startswith("envbuilder resolve: error: ")
    assert captured.out == ""
    assert not out.exists()


def test_a_missing_matrix_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.toml"
    rc = cli.main(["resolve", "--matrix", str(missing), "--out", str(tmp_path / "locks")])
    assert rc == 2
    assert "nope.toml" in capsys.readouterr().err
    assert not (tmp_path / "locks").exists()


@pytest.mark.parametrize(
    ("status", "mark"), [("resolved", "✓"), ("unsatisfiable", "✕"), ("error", "!")]
)
@pytest.mark.parametrize("verbose", [0, 1])
def test_progress_prints_one_line_per_combination_and_rejections_with_v(
    status: str, mark: str, verbose: int
) -> None:
    stream = io.StringIO()
    progress = command._Progress(Reporter(stream, verbose=verbose), total=12)
    progress.done(_result(status, "because"), 1.25)
    lines = stream.getvalue().splitlines()
    assert lines[0] == f"[ 1/12] {mark} py3.11-cu121-torch2.4.1  {status} (1.2s): because"
    assert lines[1] == "      note: a note"
    rejected = "      rejected torch-2.4.1-cp312.whl: tags"
    assert lines[2:] == ([rejected] if verbose else [])


def test_the_summary_is_a_markdown_table_with_pipes_in_reasons_escaped() -> None:
    table = command._markdown(
        [
            _result("resolved", "torch 2.4.1 (CUDA 12.1)"),
            _result("unsatisfiable", "a | b", cid="py3.11-cu124-torch2.4.1"),
        ]
    )
    assert table.splitlines() == [
        "| combination | status | reason |",
        "|---|---|---|",
        "| `py3.11-cu121-torch2.4.1` | resolved | torch 2.4.1 (CUDA 12.1) |",
        "| `py3.11-cu124-torch2.4.1` | unsatisfiable | a / b |",
    ]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_live_bar_counts_by_status_under_the_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    stream = _Terminal()
    with command._Progress(Reporter(stream), total=2) as progress:
        progress.done(_result("resolved", "because"), 1.25)
        progress.done(_result("unsatisfiable", "no", cid="py3.11-cu124-torch2.4.1"), 0.5)
    out = stream.getvalue()
    assert "[1/2] ✓ py3.11-cu121-torch2.4.1  resolved (1.2s): because" in out
    assert "[2/2] ✕ py3.11-cu124-torch2.4.1  unsatisfiable (0.5s): no" in out
    assert "resolving" in out and "1 resolved, 1 unsatisfiable, 0 error" in out


def test_elsewhere_there_is_no_bar() -> None:
    stream = io.StringIO()
    with command._Progress(Reporter(stream), total=1) as progress:
        progress.done(_result("resolved", "because"), 1.0)
    assert "resolving" not in stream.getvalue()


def test_a_resolution_nests_the_cell_it_answers_and_reads_back_whole() -> None:
    from envbuilder.model import RESOLUTION_SCHEMA, Resolution

    answer = _result("resolved", "", cid="py3.11-cu121-torch2.4.1-xformers0.0.28.post1-cudart")
    resolution = Resolution(matrix="m.toml", matrix_sha256="0" * 64, combinations=(answer,))
    data = resolution.to_json()
    assert data["schema"] == RESOLUTION_SCHEMA == "envbuilder.resolution/2"
    written = data["combinations"][0]
    # the cell is nested, not copied: no id, python, cuda, platform or requested beside it
    assert {"id", "python", "cuda", "platform", "requested"}.isdisjoint(written)
    assert written["combination"]["cuda"] == "cu121"
    assert Resolution.from_json(data) == resolution


def test_a_resolution_1_file_is_read_with_the_cell_it_recorded() -> None:
    from envbuilder.model import Resolution
    from envbuilder.target import CudaTag

    answer = {
        "id": "py3.11-cu121-torch2.4.1-cudart",
        "status": "unsatisfiable",
        "reason": "no wheel",
        "python": "3.11",
        "cuda": "cu121",
        "platform": "manylinux_2_28_x86_64",
        "requested": {"torch": "2.4.1", "xformers": None},
    }
    old = {"schema": "envbuilder.resolution/1", "matrix": "m", "matrix_sha256": "0" * 64}
    (read,) = Resolution.from_json({**old, "combinations": [answer]}).combinations
    c = read.combination
    assert (c.id, c.python, c.cuda, c.platform, c.torch, c.xformers, c.add_cuda_runtime) == (
        "py3.11-cu121-torch2.4.1-cudart",
        "3.11",
        CudaTag(12, 1),
        "manylinux_2_28_x86_64",
        "2.4.1",
        None,
        True,
    )


def test_an_unknown_resolution_schema_says_to_resolve_again() -> None:
    from envbuilder.errors import InputError
    from envbuilder.model import Resolution

    with pytest.raises(InputError, match=r"'envbuilder\.resolution/9'.*run `nox -s resolve` again"):
        Resolution.from_json({"schema": "envbuilder.resolution/9", "combinations": []})


def test_a_resolution_1_answer_that_recorded_no_versions_asks_for_none() -> None:
    """Files older than ``requested`` recorded the asked-for versions nowhere but in a
    resolved torch: without one, nothing is made up (no version parsed out of the id)."""
    from envbuilder.model import Resolution

    answer = {
        "id": "py3.11-cpu-torch2.13.0",
        "status": "resolved",
        "reason": "",
        "python": "3.11",
        "cuda": "cpu",
        "platform": "manylinux_2_28_x86_64",
    }
    old = {"schema": "envbuilder.resolution/1", "matrix": "m", "matrix_sha256": "0" * 64}
    (read,) = Resolution.from_json({**old, "combinations": [answer]}).combinations
    assert (read.id, read.cuda, read.requested) == ("py3.11-cpu-torch2.13.0", "cpu", None)
