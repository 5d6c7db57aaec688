"""What the steps of a decision share: what they read, what they return, their helpers.

Every step of `decisions.decide` (torch's wheel, xformers' wheel and its build
record check, xformers' source build) reads one `Inputs` and returns a
`Chosen` value with what it `Found` on the way, or a `Failed` answer carrying
what it found before it stopped. Findings join with ``+`` in step order. Nothing
here does I/O of its own: the indexes are read only through the `Evidence`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from envbuilder.errors import EnvbuilderError
from envbuilder.index.simple import DistributionFile
from envbuilder.model import (
    Combination,
    IndexSpec,
    Rejection,
    ResolvedXformers,
    SourceBuild,
)
from envbuilder.resolve.closure import IndexArgument
from envbuilder.resolve.evidence import Evidence, file_version
from envbuilder.target import CudaTag, Target

__all__ = [
    "Chosen",
    "Failed",
    "Found",
    "Inputs",
    "XformersChoice",
    "cuda_text",
    "index_url",
    "newest_for_cuda",
    "parse_requirements",
    "sha256_of",
    "unreadable",
    "unsatisfiable",
]


@dataclass(frozen=True, kw_only=True)
class Found:
    """What a step found besides its choice; steps' findings join with ``+`` in step order."""

    rejected: tuple[Rejection, ...] = ()
    notes: tuple[str, ...] = ()
    indexes: tuple[IndexArgument, ...] = ()
    dependencies: tuple[str, ...] = ()
    raw_dependencies: tuple[str, ...] = ()
    extra_runtime: tuple[str, ...] = ()

    def __add__(self, other: Found) -> Found:
        return Found(
            rejected=self.rejected + other.rejected,
            notes=self.notes + other.notes,
            indexes=tuple(dict.fromkeys(self.indexes + other.indexes)),
            dependencies=self.dependencies + other.dependencies,
            raw_dependencies=self.raw_dependencies + other.raw_dependencies,
            extra_runtime=self.extra_runtime + other.extra_runtime,
        )


_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class Chosen(Generic[_T]):
    """A step's choice and what it found on the way."""

    value: _T
    found: Found


@dataclass(frozen=True, kw_only=True)
class Failed:
    """A step that could not choose: why, and what it found before it stopped."""

    status: Literal["unsatisfiable", "error"]
    reason: str
    found: Found
    xformers: ResolvedXformers | None = None  # the wheel chosen when its checks refuse it


@dataclass(frozen=True, kw_only=True)
class XformersChoice:
    """xformers as chosen: a wheel, or an sdist with what building it needs."""

    xformers: ResolvedXformers
    source_build: SourceBuild | None = None


def unsatisfiable(reason: str, found: Found) -> Failed:
    return Failed(status="unsatisfiable", reason=reason, found=found)


def unreadable(e: EnvbuilderError | ValueError, found: Found) -> Failed:
    """Evidence that could not be read is an ``error`` answer, keeping what was found before."""
    if isinstance(e, EnvbuilderError):
        return Failed(status="error", reason=str(e), found=found)
    # evidence the resolver cannot read, e.g. a broken build record
    return Failed(status="error", reason=f"unreadable evidence: {e}", found=found)


def index_url(spec: IndexSpec, cuda: str, default_index_url: str) -> str:
    """The URL of ``spec`` for a combination's CUDA; the default index has none of its own."""
    if spec.url is None:
        return default_index_url
    url = spec.url_for(cuda)
    assert url is not None
    return url


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """What every step of one decision reads; the steps return what they find."""

    c: Combination
    target: Target
    evidence: Evidence
    indexes: Mapping[str, IndexSpec]
    default_index_url: str
    default_url: str  # the default index's URL for this combination

    def index_argument(self, spec: IndexSpec) -> tuple[str, Found]:
        """``spec``'s URL, and the index argument uv needs for it (none for the default)."""
        url = index_url(spec, str(self.c.cuda), self.default_index_url)
        if spec.url is None:
            return url, Found()
        role: Literal["index", "find-links"] = (
            "find-links" if spec.kind == "find-links" else "index"
        )
        return url, Found(indexes=(IndexArgument(role=role, url=url),))


def newest_for_cuda(inputs: Inputs, project: str, cuda: CudaTag) -> Version | None:
    """The newest release of ``project`` on the default index with a wheel for the target
    and ``cuda``'s major.minor as its own."""
    best: Version | None = None
    for file in inputs.evidence.page(inputs.default_url, project, "simple"):
        if file.yanked or (version := file_version(file.filename, project)) is None:
            continue
        tags = parse_wheel_filename(file.filename)[3]
        fits = any(t in inputs.target.tag_priority for t in tags)
        if fits and version.release[:2] == (cuda.major, cuda.minor):
            best = version if best is None or version > best else best
    return best


def parse_requirements(lines: Sequence[str], where: str) -> list[Requirement]:
    out: list[Requirement] = []
    for line in lines:
        try:
            out.append(Requirement(line))
        except InvalidRequirement as e:
            raise ValueError(f"{where}: invalid requirement {line!r} ({e})") from e
    return out


def sha256_of(file: DistributionFile) -> str:
    sha = file.hashes.get("sha256")
    if not sha:
        raise EnvbuilderError(f"{file.filename!r} has no sha256 on its index")
    return sha


def cuda_text(cuda: CudaTag | None) -> str | None:
    """A CUDA as messages spell it, ``12.8``; None stays None."""
    return None if cuda is None else cuda.version
