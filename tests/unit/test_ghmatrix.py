"""The GitHub Actions job matrix: which combinations get a job, on which runner, with which image."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from envbuilder.commands import matrix as matrix_command
from envbuilder.errors import InputError
from envbuilder.ghmatrix import (
    BUILD_JOBS,
    CHUNK_JOBS,
    CHUNK_OUTPUT_BYTES,
    GITHUB_JOB_LIMIT,
    GITHUB_OUTPUT_BYTES,
    chunk_plan,
    compact,
    estimate,
    github_output,
    plan_jobs,
    suite_seconds,
    workflow_command,
)
from envbuilder.model import (
    Combination,
    Resolution,
    ResolvedCombination,
    SourceBuild,
    SourceFile,
    Status,
)
from envbuilder.resolve.matrix import parse_matrix
from envbuilder.target import CudaTag, parse_cuda_build

GPU_RUNNER = ("self-hosted", "linux", "x64", "gpu")


def combo(
    python: str = "3.11", cuda: str = "cu121", torch: str = "2.4.1", xformers: str | None = None
) -> Combination:
    cid = f"py{python}-{cuda}-torch{torch}" + (f"-xformers{xformers}" if xformers else "")
    return Combination(
        id=cid,
        python=python,
        cuda=parse_cuda_build(cuda) or "default",
        torch=torch,
        xformers=xformers,
        runner=GPU_RUNNER,
    )


def answer(c: Combination, status: Status, lock_sha256: str | None = None) -> ResolvedCombination:
    return ResolvedCombination(
        combination=c,
        status=status,
        reason="" if status == "resolved" else f"no wheel of torch {c.torch} for {c.cuda}",
        lock_sha256=lock_sha256,
    )


def resolution(*answers: ResolvedCombination) -> Resolution:
    return Resolution(matrix="matrix.toml", matrix_sha256="0" * 64, combinations=answers)


A = combo("3.11", "cu121", "2.4.1", "0.0.28.post1")
B = combo("3.12", "cu124", "2.5.1", "0.0.28.post3")
C = combo("3.11", "cpu", "2.13.0")
SHA = "ab" * 32


def test_a_job_entry_carries_what_the_conformance_job_needs() -> None:
    plan = plan_jobs([A], resolution=resolution(answer(A, "resolved", SHA)))
    assert plan.github() == {
        "include": [
            {
                "id": "py3.11-cu121-torch2.4.1-xformers0.0.28.post1",
                "python": "3.11",
                "cuda": "cu121",
                "torch": "2.4.1",
                "xformers": "0.0.28.post1",
                "runs-on": ["self-hosted", "linux", "x64", "gpu"],
                "artifact": "results-py3.11-cu121-torch2.4.1-xformers0.0.28.post1",
                "image": "envbuilder/py3.11-cu121-torch2.4.1-xformers0.0.28.post1:abababababab",
                "image-artifact": "image-py3.11-cu121-torch2.4.1-xformers0.0.28.post1",
            }
        ]
    }


@pytest.mark.parametrize(
    ("statuses", "jobs", "not_run"),
    [
        (("resolved", "resolved", "resolved"), [A.id, B.id, C.id], []),
        (("resolved", "unsatisfiable", "resolved"), [A.id, C.id], [(B.id, "unsatisfiable")]),
        (("error", "unsatisfiable", "resolved"), [C.id], [(A.id, "error"), (B.id, "unsatisfiable")]),
        (("unsatisfiable", "unsatisfiable", "unsatisfiable"), [], [(A.id, "unsatisfiable"), (B.id, "unsatisfiable"), (C.id, "unsatisfiable")]),
    ],
)  # fmt: skip
def test_only_resolved_combinations_get_jobs_the_rest_are_listed_with_a_reason(
    statuses: tuple[Status, Status, Status], jobs: list[str], not_run: list[tuple[str, str]]
) -> None:
    answers = [answer(c, s, SHA) for c, s in zip((A, B, C), statuses, strict=True)]
    plan = plan_jobs([A, B, C], resolution=resolution(*answers))
    assert [j.id for j in plan.jobs] == jobs
    assert [(n.id, n.status) for n in plan.not_run] == not_run
    assert all(n.reason for n in plan.not_run)
    assert plan.to_json()["count"] == len(jobs)


def test_without_a_resolution_every_selected_combination_gets_a_job_but_no_image() -> None:
    plan = plan_jobs([A, B])
    assert [j.id for j in plan.jobs] == [A.id, B.id]
    assert all("image" not in entry for entry in plan.github()["include"])


def test_a_resolved_combination_without_a_lock_hash_gets_no_image_tag() -> None:
    plan = plan_jobs([A], resolution=resolution(answer(A, "resolved", None)))
    assert "image" not in plan.github()["include"][0]


def test_a_selected_combination_missing_from_the_resolution_is_an_error_naming_it() -> None:
    with pytest.raises(InputError, match=r"1 selected combination.*py3\.12-cu124.*nox -s resolve"):
        plan_jobs([A, B], resolution=resolution(answer(A, "resolved", SHA)))


def test_combinations_fan_out_over_gpu_models_with_their_own_labels_and_artifacts() -> None:
    gpus = {"h100": ("self-hosted", "h100"), "l4": ("self-hosted", "l4")}
    plan = plan_jobs([A, C], gpus=gpus)
    assert [(j.id, j.gpu, j.runs_on, j.artifact) for j in plan.jobs] == [
        (A.id, "h100", ("self-hosted", "h100"), f"results-{A.id}-h100"),
        (A.id, "l4", ("self-hosted", "l4"), f"results-{A.id}-l4"),
        (C.id, "h100", ("self-hosted", "h100"), f"results-{C.id}-h100"),
        (C.id, "l4", ("self-hosted", "l4"), f"results-{C.id}-l4"),
    ]
    artifacts = [e["artifact"] for e in plan.github()["include"]]
    assert len(set(artifacts)) == len(artifacts)


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ({"h100/sxm": ("gpu",)}, r"'h100/sxm' cannot name a results artifact"),
        ({"a b": ("gpu",)}, r"'a b' cannot name"),
        ({"h100": ()}, r"runners\.gpus\.h100 has no runner labels"),
    ],
)
def test_gpu_models_need_artifact_safe_names_and_labels(
    gpus: dict[str, tuple[str, ...]], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        plan_jobs([A], gpus=gpus)


def many(n: int) -> list[Combination]:
    return [combo("3.11", "cu121", f"2.4.{i}") for i in range(n)]


RUN_LIMIT = GITHUB_JOB_LIMIT * CHUNK_JOBS


@pytest.mark.parametrize(
    ("combinations", "gpus", "count"),
    [
        (RUN_LIMIT, 0, RUN_LIMIT),
        (RUN_LIMIT + 1, 0, None),
        (RUN_LIMIT // 2, 2, RUN_LIMIT),
        (RUN_LIMIT // 2 + 1, 2, None),
    ],
)
def test_the_run_limit_is_enforced_with_the_count_and_how_to_select_a_subset(
    combinations: int, gpus: int, count: int | None
) -> None:
    gpu_labels = {f"gpu{i}": ("self-hosted", f"gpu{i}") for i in range(gpus)}
    if count is not None:
        assert len(plan_jobs(many(combinations), gpus=gpu_labels).jobs) == count
        return
    with pytest.raises(InputError) as e:
        plan_jobs(many(combinations), gpus=gpu_labels)
    text = str(e.value)
    assert f"makes {combinations * max(gpus, 1)} jobs" in text
    assert f"limit of {RUN_LIMIT} jobs per run" in text
    assert "select a subset" in text


# --- chunks: as many matrices as GitHub's limits need --------------------------------------------


def fleet(rows: int, kinds: int) -> list[Any]:
    """``rows`` resolved combinations fanned out over ``kinds`` GPU models, with long labels."""
    combos = many(rows)
    gpus = {f"gpu-kind-{i}": ("self-hosted", "linux", "x64", f"gpu-kind-{i}") for i in range(kinds)}
    res = resolution(*[answer(c, "resolved", f"{i:064x}") for i, c in enumerate(combos)])
    return list(plan_jobs(combos, gpus=gpus, resolution=res).jobs)


@pytest.mark.parametrize(
    ("rows", "kinds", "chunks"),
    [
        (45, 8, [184, 176]),  # the fleet: 360 jobs
        (43, 6, [132, 126]),  # 258 jobs: one matrix refused them before
        (32, 8, [256]),
        (33, 8, [136, 128]),
        (1, 1, [1]),
        (128, 8, [256, 256, 256, 256]),
    ],
)
def test_a_fleet_plans_into_chunks_within_githubs_limits_with_every_job_once(
    rows: int, kinds: int, chunks: list[int]
) -> None:
    jobs = fleet(rows, kinds)
    planned = chunk_plan(jobs)
    assert [len(c.jobs) for c in planned] == chunks
    assert [c.output for c in planned] == [f"chunk-{i}" for i in range(1, len(chunks) + 1)]
    # every job exactly once, in the plan's order
    assert [j for c in planned for j in c.jobs] == jobs
    for chunk in planned:
        assert len(chunk.jobs) <= GITHUB_JOB_LIMIT
        text = compact(chunk.github())
        assert chunk.size() == len(text.encode()) <= CHUNK_OUTPUT_BYTES
        assert json.loads(text) == chunk.github()
    # a combination's GPU models share a chunk: its image is pulled within one matrix
    assert all(len({id(c) for c in planned if j in c.jobs}) == 1 for j in jobs)
    assert sum(c.size() for c in planned) < GITHUB_OUTPUT_BYTES
    # artifacts stay unique across chunks: the aggregate job downloads them all
    artifacts = [e["artifact"] for c in planned for e in c.github()["include"]]
    assert len(set(artifacts)) == len(artifacts) == rows * kinds


def test_chunks_split_by_bytes_when_entries_are_long() -> None:
    jobs = fleet(45, 8)
    planned = chunk_plan(jobs, max_bytes=40_000)
    assert len(planned) == 4
    assert all(c.size() <= 40_000 for c in planned)
    assert [j for c in planned for j in c.jobs] == jobs


def test_a_combination_over_more_gpu_models_than_a_chunk_holds_is_split_by_jobs() -> None:
    jobs = fleet(1, 300)
    planned = chunk_plan(jobs)
    assert [len(c.jobs) for c in planned] == [256, 44]
    assert [j for c in planned for j in c.jobs] == jobs


def test_more_chunks_than_the_workflow_has_conformance_jobs_are_refused() -> None:
    with pytest.raises(InputError, match=r"360 jobs in 2 chunks, more than the 1 conformance"):
        chunk_plan(fleet(45, 8), max_chunks=1)
    assert chunk_plan([]) == ()


def test_the_build_matrix_has_one_image_per_combination_not_per_gpu_model() -> None:
    combos = many(45)
    gpus = {f"g{i}": ("self-hosted", f"g{i}") for i in range(8)}
    built = dataclasses.replace(answer(combos[0], "resolved", SHA), source_build=SOURCE_BUILD)
    res = resolution(built, *[answer(c, "resolved", SHA) for c in combos[1:]])
    plan = plan_jobs(combos, gpus=gpus, resolution=res)
    builds = plan.builds()["include"]
    # a source-build row builds its own image on each GPU runner, from the wheel it built
    assert [b["id"] for b in builds] == [c.id for c in combos[1:]]
    assert builds[0] == {
        "id": combos[1].id,
        "image": combos[1].image_tag(SHA),
        "runs-on": ["self-hosted", "g0"],
        "artifact": f"image-{combos[1].id}",
    }
    # each conformance job finds its image's record under the artifact its build uploads
    entries = plan.github()["include"]
    assert {e["image-artifact"] for e in entries if "image-artifact" in e} == {
        b["artifact"] for b in builds
    }
    assert all("image-artifact" not in e for e in entries if e["id"] == combos[0].id)


def test_the_build_matrix_of_300_rows_is_chunked_within_githubs_limit() -> None:
    """One image per row: 300 rows are more than one matrix holds, so the build jobs take
    them in chunks, as the conformance jobs take theirs."""
    combos = many(300)
    res = resolution(*[answer(c, "resolved", f"{i:064x}") for i, c in enumerate(combos)])
    plan = plan_jobs(combos, gpus={"g0": ("self-hosted", "g0")}, resolution=res)
    chunks = plan.build_chunks()
    assert [len(c.jobs) for c in chunks] == [150, 150]
    assert [c.output for c in chunks] == ["build-1", "build-2"]
    entries = [e for c in chunks for e in c.github()["include"]]
    assert entries == plan.builds()["include"]  # every image once, in the plan's order
    assert [e["id"] for e in entries] == [c.id for c in combos]
    assert set(entries[0]) == {"id", "image", "runs-on", "artifact"}
    for chunk in chunks:
        assert len(chunk.github()["include"]) <= GITHUB_JOB_LIMIT
        assert chunk.size() == len(compact(chunk.github()).encode()) <= CHUNK_OUTPUT_BYTES
    # conformance and build chunks together fit the resolve job's outputs
    together = [*chunk_plan(plan.jobs), *chunks]
    assert sum(c.size() for c in together) < GITHUB_OUTPUT_BYTES - 16_000


def test_more_images_than_the_build_jobs_hold_are_refused_with_the_count() -> None:
    combos = many(BUILD_JOBS * GITHUB_JOB_LIMIT + 1)
    res = resolution(*[answer(c, "resolved", SHA) for c in combos])
    plan = plan_jobs(combos, resolution=res, limit=len(combos))
    with pytest.raises(InputError, match=r"1025 images to build in 5 chunks.*4 build jobs"):
        plan.build_chunks()


# --- the estimate ------------------------------------------------------------------------------


def test_the_estimate_multiplies_jobs_by_the_suites_measured_time() -> None:
    plan = plan_jobs(many(45), gpus={f"g{i}": ("gpu",) for i in range(8)})
    full, quick = suite_seconds("full"), suite_seconds("quick")
    assert 0 < quick < full
    cost = estimate(plan, overhead_s=120)
    assert (cost.jobs, cost.chunks) == (360, 2)
    assert cost.gpu_minutes == pytest.approx(360 * (full + 120) / 60)
    assert "360 job(s) in 2 chunk(s)" in cost.describe()
    assert estimate(plan, size="quick").gpu_minutes == pytest.approx(360 * quick / 60)
    with pytest.raises(InputError, match="give 0 or more"):
        estimate(plan, overhead_s=-1)


def test_the_suites_time_is_its_phases_longest_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    """One alone group then the rest side by side: the sum of each phase's makespan."""
    from envbuilder.conformance import costs

    table = {"performance": 30.0, "attention.sdpa": 20.0, "attention.xformers": 10.0}
    monkeypatch.setattr(costs, "known_costs", lambda size: table)
    assert suite_seconds("full") == pytest.approx(30.0 + 20.0)


def test_the_limit_counts_jobs_not_combinations_after_unresolvable_ones_drop_out() -> None:
    combos = many(GITHUB_JOB_LIMIT + 10)
    answers = [answer(c, "resolved" if i < 250 else "unsatisfiable") for i, c in enumerate(combos)]
    plan = plan_jobs(combos, resolution=resolution(*answers))
    assert (len(plan.jobs), len(plan.not_run)) == (250, 16)


@pytest.mark.parametrize(
    ("sha", "tag"),
    [
        ("0123456789abcdef" * 4, "envbuilder/py3.11-cpu-torch2.13.0:0123456789ab"),
        ("f" * 64, "envbuilder/py3.11-cpu-torch2.13.0:ffffffffffff"),
    ],
)
def test_image_tag_is_the_one_envbuilder_build_gives_the_lock(sha: str, tag: str) -> None:
    plan = plan_jobs([C], resolution=resolution(answer(C, "resolved", sha)))
    assert plan.jobs[0].image == tag


def test_a_malformed_lock_hash_in_the_resolution_is_refused() -> None:
    with pytest.raises(InputError, match="not 64 lowercase hex digits"):
        plan_jobs([C], resolution=resolution(answer(C, "resolved", "XYZ")))


@pytest.mark.parametrize(
    ("kind", "title", "message", "expected"),
    [
        ("notice", "", "plain", "::notice::plain"),
        ("notice", "No job", "a: b", "::notice title=No job::a: b"),
        ("warning", "x: y, z", "50% done\nnext", "::warning title=x%3A y%2C z::50%25 done%0Anext"),
        ("error", "", "line\r\n", "::error::line%0D%0A"),
    ],
)  # fmt: skip
def test_workflow_commands_escape_what_github_would_misread(
    kind: Any, title: str, message: str, expected: str
) -> None:
    assert workflow_command(kind, message, title=title) == expected


def test_github_output_lines_and_one_line_json() -> None:
    text = github_output({"matrix": compact({"include": [{"id": "x"}]}), "count": "1"})
    assert text == 'matrix={"include":[{"id":"x"}]}\ncount=1\n'
    with pytest.raises(ValueError, match="one line"):
        github_output({"matrix": "a\nb"})


# --- the command, on a real matrix file and resolution file -----------------------------------

MATRIX = b"""
[axes]
python = ["3.11", "3.12"]

[runners]
default = ["self-hosted", "gpu"]
cuda = { cpu = ["ubuntu-latest"] }

[[pairs]]
torch = "2.4.1"
xformers = "0.0.28.post1"
cuda = "cu121"

[[combinations]]
python = "3.11"
cuda = "cpu"
torch = "2.13.0"
"""


def write_inputs(tmp_path: Path, statuses: dict[str, Status]) -> tuple[Path, Path]:
    matrix_path = tmp_path / "matrix.toml"
    matrix_path.write_bytes(MATRIX)
    loaded = parse_matrix(MATRIX, path=matrix_path, environ={})
    answers = [answer(c, statuses[c.id], SHA) for c in loaded.combinations if c.id in statuses]
    res = Resolution(
        matrix=str(matrix_path), matrix_sha256=loaded.sha256, combinations=tuple(answers)
    )
    res_path = tmp_path / "resolution.json"
    res_path.write_text(json.dumps(res.to_json()), encoding="utf-8")
    return matrix_path, res_path


def run_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-v", "--verbose", action="count", default=0)
    matrix_command.configure(parser)
    return matrix_command.run(parser.parse_args(argv))


ALL: dict[str, Status] = {
    "py3.11-cu121-torch2.4.1-xformers0.0.28.post1": "resolved",
    "py3.12-cu121-torch2.4.1-xformers0.0.28.post1": "unsatisfiable",
    "py3.11-cpu-torch2.13.0": "resolved",
}


@pytest.mark.parametrize(
    ("selectors", "ids"),
    [
        ([], ["py3.11-cu121-torch2.4.1-xformers0.0.28.post1", "py3.11-cpu-torch2.13.0"]),
        (["cpu"], ["py3.11-cpu-torch2.13.0"]),
        (["py3.12"], []),
    ],
)
def test_command_prints_ids_of_resolvable_selected_combinations(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    selectors: list[str],
    ids: list[str],
) -> None:
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    m, r = write_inputs(tmp_path, ALL)
    rc = run_command([*selectors, "--matrix", str(m), "--resolution", str(r), "--format", "ids"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out.splitlines() == ids
    if "py3.12" in selectors or not selectors:
        assert "not run: py3.12-cu121-torch2.4.1-xformers0.0.28.post1: unsatisfiable" in err


def test_command_uses_runner_labels_per_cuda_from_matrix_toml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m, r = write_inputs(tmp_path, ALL)
    assert run_command(["--matrix", str(m), "--resolution", str(r), "--format", "github"]) == 0
    entries = json.loads(capsys.readouterr().out)["include"]
    assert {e["id"]: e["runs-on"] for e in entries} == {
        "py3.11-cu121-torch2.4.1-xformers0.0.28.post1": ["self-hosted", "gpu"],
        "py3.11-cpu-torch2.13.0": ["ubuntu-latest"],
    }


def test_in_actions_the_command_writes_outputs_notices_and_the_step_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    output, summary = tmp_path / "output", tmp_path / "summary"
    output.write_text("earlier=kept\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    m, r = write_inputs(tmp_path, ALL)
    args = ["--matrix", str(m), "--resolution", str(r), "--format", "github"]
    assert run_command([*args, "--github-output", str(output)]) == 0
    out, err = capsys.readouterr()
    lines = output.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "earlier=kept"
    assert lines[1] == "count=2"
    assert lines[2] == "chunks=[1]"
    assert lines[3] == f"chunk-1={out.strip()}"
    assert lines[4] == "build-chunks=[1]"
    builds = json.loads(lines[5].removeprefix("build-1="))["include"]
    assert [b["id"] for b in builds] == [
        "py3.11-cu121-torch2.4.1-xformers0.0.28.post1",
        "py3.11-cpu-torch2.13.0",
    ]
    assert (
        "::notice title=No conformance job::py3.12-cu121-torch2.4.1-xformers0.0.28.post1:"
        " unsatisfiable: no wheel" in err
    )
    assert (
        "| `py3.12-cu121-torch2.4.1-xformers0.0.28.post1` | unsatisfiable |"
        in summary.read_text(encoding="utf-8")
    )


def test_the_summary_counts_rows_of_other_platforms_apart_from_unresolvable_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Windows row resolved fine: it has no image to run, which is not 'not resolvable'."""
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    text = (
        MATRIX
        + b'\n[[combinations]]\npython = "3.11"\ncuda = "cpu"\ntorch = "2.13.0"\nplatform = "win_amd64"\n'
    )
    matrix_path = tmp_path / "matrix.toml"
    matrix_path.write_bytes(text)
    loaded = parse_matrix(text, path=matrix_path, environ={})
    # the platform joins the ids of a matrix of several platforms: pick rows by field
    answers = [
        answer(c, "unsatisfiable" if c.python == "3.12" else "resolved", SHA)
        for c in loaded.combinations
    ]
    res = Resolution(
        matrix=str(matrix_path), matrix_sha256=loaded.sha256, combinations=tuple(answers)
    )
    res_path = tmp_path / "resolution.json"
    res_path.write_text(json.dumps(res.to_json()), encoding="utf-8")
    rc = run_command(["--matrix", str(matrix_path), "--resolution", str(res_path), "--format", "ids"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0
    assert (
        "2 job(s) in 1 chunk(s) for 4 selected combination(s), 1 not resolvable,"
        " 1 skipped for their platform (no image)"
    ) in err


@pytest.mark.parametrize(
    ("statuses", "selectors", "message"),
    [
        ({"py3.11-cpu-torch2.13.0": "resolved"}, [], r"2 selected combination\(s\) are not in the resolution"),
        (ALL, ["cu118"], r"selector 'cu118' matches no combination"),
    ],
)  # fmt: skip
def test_command_refuses_stale_resolutions_and_bad_selectors(
    tmp_path: Path, statuses: dict[str, Status], selectors: list[str], message: str
) -> None:
    m, r = write_inputs(tmp_path, statuses)
    output = tmp_path / "output"
    with pytest.raises(InputError, match=message) as e:
        run_command([*selectors, "--matrix", str(m), "--resolution", str(r), "--github-output", str(output)])  # fmt: skip
    assert e.value.return_code == 2
    assert not output.exists()


def test_command_reports_a_missing_resolution_file_with_what_to_run(tmp_path: Path) -> None:
    m, _ = write_inputs(tmp_path, ALL)
    with pytest.raises(InputError, match=r"not found; run `nox -s resolve` first"):
        run_command(["--matrix", str(m), "--resolution", str(tmp_path / "nope.json")])


SOURCE_BUILD = SourceBuild(
    sdist=SourceFile(filename="xformers-0.0.35.tar.gz", url="https://x.invalid/x.tar.gz", sha256="5" * 64),
    why="no wheel fits",
    cuda=CudaTag(13, 0),
    arch_list=("9.0",),
    flags=(),
    build_requirements_in=(),
)  # fmt: skip


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ({}, [("", "publish", "built-{id}")]),
        # a CUDA build is not byte-reproducible: each GPU model's job builds its own wheel
        # for its image, and one of them publishes it
        ({"h100": ("self-hosted", "h100"), "l4": ("self-hosted", "l4")},
         [("h100", "publish", "built-{id}"), ("l4", "build", None)]),
    ],
)  # fmt: skip
def test_a_source_build_row_builds_its_wheel_on_the_runner_and_one_job_publishes_it(
    gpus: dict[str, tuple[str, ...]], expected: list[tuple[str, str, str | None]]
) -> None:
    built = dataclasses.replace(answer(A, "resolved", SHA), source_build=SOURCE_BUILD)
    plan = plan_jobs([A, B], gpus=gpus, resolution=resolution(built, answer(B, "resolved", SHA)))
    entries = plan.github()["include"]
    mine = [e for e in entries if e["id"] == A.id]
    assert [(e.get("gpu", ""), e["source-build"], e.get("wheel-artifact")) for e in mine] == [
        (gpu, how, artifact and artifact.format(id=A.id)) for gpu, how, artifact in expected
    ]
    # rows whose xformers is a wheel from an index have neither key
    assert all(
        "source-build" not in e and "wheel-artifact" not in e for e in entries if e["id"] == B.id
    )
