"""The GitHub Actions job matrix: one conformance job per resolvable combination.

Pure: takes the selected combinations, the runner labels from ``matrix.toml``
and (optionally) the resolution, and returns the ``strategy.matrix`` object
that ``.github/workflows/gpu-matrix.yml`` feeds to its conformance job.

GitHub refuses a matrix of more than 256 jobs; rather than splitting it into
chunks that a workflow cannot fan out without hard-coding their number, a
plan above the limit is refused with the count and how to pick a subset.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from envbuilder.errors import InputError
from envbuilder.model import Combination, Resolution

__all__ = [
    "GITHUB_JOB_LIMIT",
    "JobMatrix",
    "MatrixJob",
    "NotRun",
    "compact",
    "github_output",
    "plan_jobs",
    "workflow_command",
]

#: GitHub Actions: "A matrix can generate a maximum of 256 jobs per workflow run."
GITHUB_JOB_LIMIT = 256

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
        if self.source_build:
            entry["source-build"] = self.source_build
            if self.source_build == "publish":
                entry["wheel-artifact"] = self.wheel_artifact
        return entry


@dataclass(frozen=True, kw_only=True)
class NotRun:
    """A selected combination that gets no job, and why."""

    id: str
    status: Literal["unsatisfiable", "error"]  # the resolver's
    reason: str


@dataclass(frozen=True, kw_only=True)
class JobMatrix:
    jobs: tuple[MatrixJob, ...]
    not_run: tuple[NotRun, ...] = ()

    def github(self) -> dict[str, Any]:
        """The object for ``strategy.matrix``: ``{"include": [...]}``."""
        return {"include": [job.to_include() for job in self.jobs]}

    def to_json(self) -> dict[str, Any]:
        return {
            "count": len(self.jobs),
            "include": [job.to_include() for job in self.jobs],
            "not_run": [{"id": n.id, "status": n.status, "reason": n.reason} for n in self.not_run],
        }


def plan_jobs(
    combinations: Sequence[Combination],
    *,
    gpus: Mapping[str, Sequence[str]] | None = None,
    resolution: Resolution | None = None,
    limit: int = GITHUB_JOB_LIMIT,
) -> JobMatrix:
    """One job per combination, or per combination and GPU model when ``gpus`` names any.

    With a resolution, only ``resolved`` combinations get jobs (and an image
    tag); the rest are listed in ``not_run`` with the resolver's reason. A
    selected combination missing from the resolution is an error: the locks
    are stale or were made for another selection.
    """
    gpus = gpus or {}
    for name, labels in gpus.items():
        if not _NAME.fullmatch(name):
            raise InputError(
                f"runners.gpus key {name!r} cannot name a results artifact;"
                " use letters, digits, '.', '_' and '-' (e.g. 'h100')"
            )
        if not labels:
            raise InputError(f"runners.gpus.{name} has no runner labels; list at least one")
    resolved = resolution.by_id() if resolution is not None else None
    if resolved is not None:
        missing = [c.id for c in combinations if c.id not in resolved]
        if missing:
            shown = ", ".join(missing[:_SHOWN]) + (
                f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
            )
            raise InputError(
                f"{len(missing)} selected combination(s) are not in the resolution: {shown};"
                " resolve them first (nox -s resolve -- SELECTOR) or select resolved ones"
            )
    jobs: list[MatrixJob] = []
    not_run: list[NotRun] = []
    for combination in combinations:
        image = None
        source_build = False
        if resolved is not None:
            answer = resolved[combination.id]
            if answer.status != "resolved":
                not_run.append(
                    NotRun(id=combination.id, status=answer.status, reason=answer.reason)
                )
                continue
            if answer.lock_sha256:
                image = combination.image_tag(answer.lock_sha256)
            source_build = answer.source_build is not None
        targets: list[tuple[str, tuple[str, ...]]] = (
            [(name, tuple(labels)) for name, labels in gpus.items()]
            if gpus
            else [("", combination.runner)]
        )
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
    if len(jobs) > limit:
        per = f" ({len(jobs) // len(gpus)} combinations x {len(gpus)} GPU models)" if gpus else ""
        raise InputError(
            f"the selection makes {len(jobs)} jobs{per}, more than GitHub's limit of {limit}"
            " jobs per matrix; select a subset with selectors (e.g. 'cu124', 'py3.11',"
            " 'torch2.5*') and run the workflow once per subset (its 'selector' input)"
        )
    return JobMatrix(jobs=tuple(jobs), not_run=tuple(not_run))


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


def compact(matrix: Mapping[str, Any]) -> str:
    """JSON on one line, as ``$GITHUB_OUTPUT`` and ``fromJSON`` want it."""
    return json.dumps(matrix, separators=(",", ":"), sort_keys=False)
