"""The GitHub Actions job matrix: one conformance job per resolvable combination.

Pure: takes the selected combinations, the runner labels from ``matrix.toml``
and (optionally) the resolution, and returns the ``strategy.matrix`` object
that ``.github/workflows/gpu-matrix.yml`` feeds to its conformance job.

GitHub refuses a matrix of more than 256 jobs and a job's outputs of more than
1 MB, so the plan is split into chunks (``chunk_plan``): each chunk is one
matrix of at most 256 jobs whose one-line JSON fits its share of the resolve
job's outputs, and the workflow has one conformance job per chunk
(``conformance``, ``conformance-2`` ... ``conformance-<CHUNK_JOBS>``), each
running only when its output is not empty. A combination's jobs (one per GPU
model) stay in one chunk where they fit. A plan that needs more chunks than the
workflow has is refused with the count and how to pick a subset. The build job's
matrix (one image per combination) is chunked the same way (``build_chunks``: outputs
``build-1`` ... ``build-<BUILD_JOBS>``, one build job each).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from envbuilder.errors import InputError
from envbuilder.model import Combination, Resolution, ResolvedCombination
from envbuilder.target import not_in_images

__all__ = [
    "BUILD_JOBS",
    "CHUNK_JOBS",
    "CHUNK_OUTPUT_BYTES",
    "GITHUB_JOB_LIMIT",
    "GITHUB_OUTPUT_BYTES",
    "Chunk",
    "Estimate",
    "JobMatrix",
    "MatrixJob",
    "NotRun",
    "chunk_output",
    "chunk_plan",
    "compact",
    "estimate",
    "github_output",
    "plan_jobs",
    "suite_seconds",
    "workflow_command",
]

#: GitHub Actions: "A matrix can generate a maximum of 256 jobs per workflow run."
GITHUB_JOB_LIMIT = 256
#: GitHub Actions: a job's outputs are at most 1 MB together (the resolve job's hold every chunk).
GITHUB_OUTPUT_BYTES = 1_000_000
#: The conformance jobs of ``.github/workflows/gpu-matrix.yml``, one per chunk of the plan.
CHUNK_JOBS = 4
#: The build jobs of ``.github/workflows/gpu-matrix.yml``, one per chunk of the images to build.
BUILD_JOBS = 4
#: One chunk's one-line JSON, conformance or build: its share of the resolve job's outputs,
#: less room for the others.
CHUNK_OUTPUT_BYTES = (GITHUB_OUTPUT_BYTES - 16_000) // (CHUNK_JOBS + BUILD_JOBS)

#: A chunk's jobs: ``conformance`` (one entry per job) or ``build`` (one image per entry).
ChunkKind: TypeAlias = Literal["conformance", "build"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHOWN = 5


@dataclass(frozen=True, kw_only=True)
class MatrixJob:
    """One entry of ``strategy.matrix.include``."""

    id: str
    python: str
    cuda: str
    torch: str
    xformers: str  # "" when the combination has no xformers
    runs_on: tuple[str, ...]
    gpu: str = ""  # the [runners.gpus] key when combinations fan out over GPU models
    image: str | None = None  # envbuilder/<id>:<lock sha12>, known once resolved
    #: xformers is built from its sdist on the runner (``envbuilder build-wheel``) before
    #: the image; "publish" for the one job per combination whose wheel is published (a
    #: CUDA build is not byte-reproducible: jobs on other GPU models build their own)
    source_build: Literal["", "build", "publish"] = ""

    @property
    def artifact(self) -> str:
        """The name its results are uploaded under; unique within a run."""
        return f"results-{self.id}" + (f"-{self.gpu}" if self.gpu else "")

    @property
    def image_artifact(self) -> str | None:
        """The artifact holding the record of its image, pushed by the build job
        (``image-<id>``); None where the job builds its own image (a source build, or no
        lock hash to name the image by)."""
        if self.image is None or self.source_build:
            return None
        return f"image-{self.id}"

    @property
    def wheel_artifact(self) -> str:
        """The name its built wheel and build record are uploaded under (``publish`` only)."""
        return f"built-{self.id}"

    def to_include(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "id": self.id,
            "python": self.python,
            "cuda": self.cuda,
            "torch": self.torch,
            "xformers": self.xformers,
            "runs-on": list(self.runs_on),
            "artifact": self.artifact,
        }
        if self.gpu:
            entry["gpu"] = self.gpu
        if self.image is not None:
            entry["image"] = self.image
        if self.image_artifact is not None:
            entry["image-artifact"] = self.image_artifact
        if self.source_build:
            entry["source-build"] = self.source_build
            if self.source_build == "publish":
                entry["wheel-artifact"] = self.wheel_artifact
        return entry

    def to_build(self) -> dict[str, Any]:
        """Its entry in the build job's matrix: the image, built on its labels."""
        return {
            "id": self.id,
            "image": self.image,
            "runs-on": list(self.runs_on),
            "artifact": self.image_artifact,
        }

    def entry(self, kind: ChunkKind) -> dict[str, Any]:
        return self.to_build() if kind == "build" else self.to_include()


@dataclass(frozen=True, kw_only=True)
class NotRun:
    """A selected combination that gets no job, and why."""

    id: str
    #: the resolver's, or ``skipped``: resolved, but not for glibc Linux (no image, no GPU job)
    status: Literal["unsatisfiable", "error", "skipped"]
    reason: str


@dataclass(frozen=True, kw_only=True)
class JobMatrix:
    jobs: tuple[MatrixJob, ...]
    not_run: tuple[NotRun, ...] = ()

    def github(self) -> dict[str, Any]:
        """The object for ``strategy.matrix``: ``{"include": [...]}``."""
        return {"include": [job.to_include() for job in self.jobs]}

    def build_jobs(self) -> tuple[MatrixJob, ...]:
        """The images to build: one per combination, built once for every GPU model's
        job, on the labels of its first job (source builds build their own)."""
        firsts: dict[str, MatrixJob] = {}
        for job in self.jobs:
            if job.image_artifact is not None and job.id not in firsts:
                firsts[job.id] = job
        return tuple(firsts.values())

    def builds(self) -> dict[str, Any]:
        """Every image to build as one ``strategy.matrix`` (the build jobs take it in
        chunks: ``build_chunks``)."""
        return {"include": [job.to_build() for job in self.build_jobs()]}

    def build_chunks(self) -> tuple[Chunk, ...]:
        """The images to build in chunks within GitHub's limits, one per build job."""
        return chunk_plan(self.build_jobs(), kind="build", max_chunks=BUILD_JOBS)

    def to_json(self) -> dict[str, Any]:
        return {
            "count": len(self.jobs),
            "include": [job.to_include() for job in self.jobs],
            "not_run": [{"id": n.id, "status": n.status, "reason": n.reason} for n in self.not_run],
        }


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """One conformance (or build) job's matrix: part ``index`` (from 1) of the plan."""

    index: int
    jobs: tuple[MatrixJob, ...]
    kind: ChunkKind = "conformance"

    @property
    def output(self) -> str:
        """Its ``$GITHUB_OUTPUT`` name, which its conformance (or build) job reads."""
        return chunk_output(self.index, self.kind)

    def github(self) -> dict[str, Any]:
        return {"include": [job.entry(self.kind) for job in self.jobs]}

    def size(self) -> int:
        """Bytes of its one-line JSON."""
        return len(compact(self.github()).encode("utf-8"))


def chunk_output(index: int, kind: ChunkKind = "conformance") -> str:
    """The output name of chunk ``index`` (from 1): ``chunk-1`` ... ``chunk-<CHUNK_JOBS>``,
    or for the images to build ``build-1`` ... ``build-<BUILD_JOBS>``."""
    return f"{'build' if kind == 'build' else 'chunk'}-{index}"


def _rows(jobs: Sequence[MatrixJob]) -> list[list[MatrixJob]]:
    """Consecutive jobs of one combination (its GPU models) as one row."""
    rows: list[list[MatrixJob]] = []
    for job in jobs:
        if rows and rows[-1][0].id == job.id:
            rows[-1].append(job)
        else:
            rows.append([job])
    return rows


def _entry_bytes(job: MatrixJob, kind: ChunkKind) -> int:
    return len(compact(job.entry(kind)).encode("utf-8"))


#: ``{"include":[`` and ``]}`` around the entries, which commas separate.
_FRAME_BYTES = len(b'{"include":[]}')


def _fill(
    rows: Sequence[Sequence[MatrixJob]],
    target: int,
    limit: int,
    max_bytes: int,
    kind: ChunkKind = "conformance",
) -> list[list[MatrixJob]] | None:
    """Rows dealt in order into chunks of about ``target`` jobs (a row joins a chunk that
    would then be nearer the target with it than without); None when one job alone
    passes ``max_bytes``. No chunk passes ``limit`` jobs or ``max_bytes``; a row that
    alone passes a limit is split by jobs."""
    chunks: list[list[MatrixJob]] = [[]]
    used = [0]  # the current chunk's entry bytes, commas included

    def fits(count: int, entry_bytes: int) -> bool:
        return count <= limit and _FRAME_BYTES + entry_bytes <= max_bytes

    def grow(jobs: Sequence[MatrixJob]) -> int:
        sizes = [_entry_bytes(j, kind) + 1 for j in jobs]
        return used[0] + sum(sizes) - (0 if chunks[-1] else 1)

    for row in rows:
        if chunks[-1] and (
            2 * len(chunks[-1]) + len(row) > 2 * target
            or not fits(len(chunks[-1]) + len(row), grow(row))
        ):
            chunks.append([])
            used[0] = 0
        if fits(len(chunks[-1]) + len(row), grow(row)):
            used[0] = grow(row)
            chunks[-1].extend(row)
            continue
        for job in row:  # one combination over more GPU models than a chunk holds
            if chunks[-1] and not fits(len(chunks[-1]) + 1, grow([job])):
                chunks.append([])
                used[0] = 0
            if not fits(1, grow([job])):
                return None
            used[0] = grow([job])
            chunks[-1].append(job)
    return [c for c in chunks if c]


def chunk_plan(
    jobs: Sequence[MatrixJob],
    *,
    limit: int = GITHUB_JOB_LIMIT,
    max_bytes: int = CHUNK_OUTPUT_BYTES,
    max_chunks: int = CHUNK_JOBS,
    kind: ChunkKind = "conformance",
) -> tuple[Chunk, ...]:
    """The plan split into the fewest chunks that GitHub's limits allow, of about equal size.

    Each chunk has at most ``limit`` jobs and at most ``max_bytes`` of one-line JSON;
    every job is in exactly one chunk, in the plan's order, and a combination's jobs
    share a chunk unless they alone pass a limit. No jobs: no chunk. ``kind="build"``
    chunks the build job's entries (one per image) for the build jobs."""
    if not jobs:
        return ()
    rows = _rows(jobs)
    size = Chunk(index=1, jobs=tuple(jobs), kind=kind).size()
    count = max(-(-len(jobs) // limit), -(-size // max_bytes), 1)
    dealt = _fill(rows, -(-len(jobs) // count), limit, max_bytes, kind)
    if dealt is not None and len(dealt) > count:  # rows that do not share out evenly
        dealt = _fill(rows, limit, limit, max_bytes, kind)
    if dealt is None:
        raise InputError(
            f"a job's matrix entry is more than {max_bytes} bytes of JSON, which no chunk"
            " holds; shorten its runner labels"
        )
    if len(dealt) > max_chunks:
        what = "images to build" if kind == "build" else "jobs"
        raise InputError(
            f"the selection makes {len(jobs)} {what} in {len(dealt)} chunks, more than the"
            f" {max_chunks} {kind} jobs of gpu-matrix.yml ({max_chunks} x {limit} jobs);"
            " select a subset with selectors (e.g. 'cu124', 'py3.11', 'torch2.5*') and run"
            " the workflow once per subset (its 'selector' input), or add a"
            f" {kind} job and raise {'BUILD_JOBS' if kind == 'build' else 'CHUNK_JOBS'}"
        )
    return tuple(Chunk(index=i, jobs=tuple(c), kind=kind) for i, c in enumerate(dealt, start=1))


def plan_jobs(
    combinations: Sequence[Combination],
    *,
    gpus: Mapping[str, Sequence[str]] | None = None,
    resolution: Resolution | None = None,
    limit: int = GITHUB_JOB_LIMIT * CHUNK_JOBS,
) -> JobMatrix:
    """One job per combination, or per combination and GPU model when ``gpus`` names any.

    With a resolution, only ``resolved`` combinations get jobs (and an image
    tag); the rest are listed in ``not_run`` with the resolver's reason. Rows
    for other platforms than glibc Linux get no job either (``skipped``, with
    the reason): the images and the suite are Linux. A
    selected combination missing from the resolution is an error: the locks
    are stale or were made for another selection.
    """
    gpus = gpus or {}
    _check_gpus(gpus)
    resolved = resolution.by_id() if resolution is not None else None
    if resolved is not None:
        _check_resolved(combinations, resolved)
    jobs: list[MatrixJob] = []
    not_run: list[NotRun] = []
    for combination in combinations:
        answer = None if resolved is None else resolved[combination.id]
        if answer is not None and answer.status != "resolved":
            not_run.append(NotRun(id=combination.id, status=answer.status, reason=answer.reason))
            continue
        image = None
        if answer is not None and answer.lock_sha256:
            image = combination.image_tag(answer.lock_sha256)
        if (why := not_in_images(combination.platform)) is not None:
            not_run.append(NotRun(id=combination.id, status="skipped", reason=why))
            continue
        source_build = answer is not None and answer.source_build is not None
        jobs.extend(_jobs_of(combination, gpus, image=image, source_build=source_build))
    if len(jobs) > limit:
        per = f" ({len(jobs) // len(gpus)} combinations x {len(gpus)} GPU models)" if gpus else ""
        raise InputError(
            f"the selection makes {len(jobs)} jobs{per}, more than the limit of {limit}"
            f" jobs per run ({CHUNK_JOBS} conformance jobs of at most {GITHUB_JOB_LIMIT});"
            " select a subset with selectors (e.g. 'cu124', 'py3.11',"
            " 'torch2.5*') and run the workflow once per subset (its 'selector' input)"
        )
    return JobMatrix(jobs=tuple(jobs), not_run=tuple(not_run))


def _check_gpus(gpus: Mapping[str, Sequence[str]]) -> None:
    """Refuse a GPU model whose name cannot name a results artifact, or without labels."""
    for name, labels in gpus.items():
        if not _NAME.fullmatch(name):
            raise InputError(
                f"runners.gpus key {name!r} cannot name a results artifact;"
                " use letters, digits, '.', '_' and '-' (e.g. 'h100')"
            )
        if not labels:
            raise InputError(f"runners.gpus.{name} has no runner labels; list at least one")


def _check_resolved(
    combinations: Sequence[Combination], resolved: Mapping[str, ResolvedCombination]
) -> None:
    """Refuse selected combinations that the resolution does not hold (stale locks)."""
    missing = [c.id for c in combinations if c.id not in resolved]
    if missing:
        shown = ", ".join(missing[:_SHOWN]) + (
            f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
        )
        raise InputError(
            f"{len(missing)} selected combination(s) are not in the resolution: {shown};"
            " resolve them first (nox -s resolve -- SELECTOR) or select resolved ones"
        )


def _jobs_of(
    combination: Combination,
    gpus: Mapping[str, Sequence[str]],
    *,
    image: str | None,
    source_build: bool,
) -> list[MatrixJob]:
    """A combination's jobs: one per GPU model of ``gpus``, else one on its own runner.
    Of a source build's jobs, the first publishes the wheel and the others build it."""
    targets: list[tuple[str, tuple[str, ...]]] = (
        [(name, tuple(labels)) for name, labels in gpus.items()]
        if gpus
        else [("", combination.runner)]
    )
    jobs: list[MatrixJob] = []
    for n, (gpu, labels) in enumerate(targets):
        if not labels:
            raise InputError(
                f"combination {combination.id!r} has no runner labels;"
                " set [runners] default in matrix.toml"
            )
        jobs.append(
            MatrixJob(
                id=combination.id,
                python=combination.python,
                cuda=str(combination.cuda),
                torch=combination.torch,
                xformers=combination.xformers or "",
                runs_on=labels,
                gpu=gpu,
                image=image,
                source_build=("publish" if n == 0 else "build") if source_build else "",
            )
        )
    return jobs


def suite_seconds(size: Literal["full", "quick"] = "full") -> float:
    """One suite run's seconds on a GPU, from the measured per-unit costs the runner
    schedules by: each group that runs alone, then the rest side by side (``GPU_JOBS``
    processes), each phase ending with its longest process chain."""
    from envbuilder.conformance import costs, schedule
    from envbuilder.conformance.groups import group_names

    table = costs.known_costs(size)
    jobs = schedule.GPU_JOBS
    total = 0.0
    for batch in schedule.phases(group_names(), jobs):
        counts = schedule.parts(batch, jobs=jobs, table=table)
        parts = schedule.plan_parts(batch, counts, table=table)
        total += costs.makespan([part.estimate_s for part in parts], jobs)
    return total


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """What a run costs: its jobs, and GPU-runner minutes from the measured suite time."""

    jobs: int
    chunks: int
    suite_s: float  # one job's suite, measured
    overhead_s: float  # one job's setup and image, as given
    size: Literal["full", "quick"]

    @property
    def job_minutes(self) -> float:
        return (self.suite_s + self.overhead_s) / 60

    @property
    def gpu_minutes(self) -> float:
        return self.jobs * self.job_minutes

    def describe(self) -> str:
        setup = (
            f" + {self.overhead_s / 60:.1f} min setup and image"
            if self.overhead_s
            else " (setup and image not included: --overhead-minutes)"
        )
        return (
            f"estimate: {self.jobs} job(s) in {self.chunks} chunk(s) x"
            f" {self.suite_s / 60:.1f} min {self.size} suite{setup}"
            f" = {self.gpu_minutes:.0f} GPU-runner-minutes ({self.gpu_minutes / 60:.1f} h)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "chunks": self.chunks,
            "size": self.size,
            "suite_s": round(self.suite_s, 1),
            "overhead_s": round(self.overhead_s, 1),
            "gpu_minutes": round(self.gpu_minutes, 1),
        }


def estimate(
    plan: JobMatrix,
    *,
    size: Literal["full", "quick"] = "full",
    overhead_s: float = 0.0,
) -> Estimate:
    """The plan's jobs and GPU-runner minutes (``suite_seconds`` per job, plus overhead)."""
    if overhead_s < 0:
        raise InputError(f"overhead {overhead_s!r} s: give 0 or more")
    return Estimate(
        jobs=len(plan.jobs),
        chunks=len(chunk_plan(plan.jobs)),
        suite_s=suite_seconds(size),
        overhead_s=overhead_s,
        size=size,
    )


def github_output(values: Mapping[str, str]) -> str:
    """Lines for ``$GITHUB_OUTPUT``: ``name=value``, one-line values only."""
    lines = []
    for name, value in values.items():
        if "\n" in value or "\r" in value:
            raise ValueError(f"output {name!r} must be one line, got {value!r}")
        lines.append(f"{name}={value}\n")
    return "".join(lines)


def workflow_command(
    kind: Literal["notice", "warning", "error"], message: str, *, title: str = ""
) -> str:
    """A GitHub Actions annotation (``::notice title=...::message``), escaped."""

    def data(text: str) -> str:
        return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    def prop(text: str) -> str:
        return data(text).replace(":", "%3A").replace(",", "%2C")

    props = f" title={prop(title)}" if title else ""
    return f"::{kind}{props}::{data(message)}"


def compact(matrix: Mapping[str, Any] | Sequence[Any]) -> str:
    """JSON on one line, as ``$GITHUB_OUTPUT`` and ``fromJSON`` want it."""
    return json.dumps(matrix, separators=(",", ":"), sort_keys=False)
