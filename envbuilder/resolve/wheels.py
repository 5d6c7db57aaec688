"""Choosing wheels for a *target* (Python version + platform), not for the host.

Everything here is pure: the target is an argument, the evidence (file
names, core metadata, xformers' build record) is passed in, and each
decision comes back with the reason for it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from typing import Generic, Literal, Protocol, TypeVar

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from envbuilder.model import BuildRecord, CudaSource, Rejection
from envbuilder.target import CudaTag, Target, names_cuda_runtime

__all__ = [
    "CudaComparison",
    "RankedWheels",
    "TorchCuda",
    "WheelFile",
    "applicable_requirements",
    "compare_cuda",
    "cuda_from_local_label",
    "cuda_from_requirements",
    "describe_release",
    "parse_build_record",
    "portable_requirements",
    "rank_wheels",
    "requirements_of",
    "sdist_version",
    "torch_requirement",
]


class WheelFile(Protocol):
    """What ranking needs of a file on an index (``envbuilder.index.simple.DistributionFile``)."""

    @property
    def filename(self) -> str: ...
    @property
    def yanked(self) -> bool: ...
    @property
    def yanked_reason(self) -> str | None: ...
    @property
    def requires_python(self) -> str | None: ...


F = TypeVar("F", bound=WheelFile)


@dataclass(frozen=True, kw_only=True)
class RankedWheels(Generic[F]):
    """The files of one release that fit the target, best first, and why others don't."""

    candidates: tuple[F, ...]
    rejected: tuple[Rejection, ...]
    notes: tuple[str, ...] = ()


def _version_matches(file_version: Version, wanted: Version) -> bool:
    if wanted.local is not None:
        return file_version == wanted
    return file_version.public == wanted.public


def rank_wheels(
    files: Iterable[F],
    *,
    project: str,
    version: str,
    target: Target,
    local_label: str | None = None,
) -> RankedWheels[F]:
    """Order the wheels of ``project==version`` that fit ``target``.

    ``local_label`` (e.g. ``"cu121"``) keeps only files whose local version
    label is that one or absent — how a per-CUDA index names its builds.
    Order follows pip: tag preference first, then the higher build number.
    Yanked files are used only when nothing else fits the exact pin (PEP 592).
    """
    wanted = Version(version)
    name = canonicalize_name(project)
    fitting: list[tuple[int, tuple[int, str] | tuple[()], F]] = []
    yanked: list[tuple[int, tuple[int, str] | tuple[()], F]] = []
    rejected: list[Rejection] = []
    notes: list[str] = []

    def reject(file: F, reason: str) -> None:
        rejected.append(Rejection(project=name, filename=file.filename, reason=reason))

    for file in files:
        if not file.filename.endswith(".whl"):
            found = sdist_version(file.filename, name)
            if found is not None and found.public == wanted.public:
                reject(file, "source distribution: envbuilder installs wheels only")
            continue
        try:
            wname, wversion, build, wtags = parse_wheel_filename(file.filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if wname != name or not _version_matches(wversion, wanted):
            continue
        if local_label is not None and wversion.local not in (None, local_label):
            reject(file, f"local label +{wversion.local} is not the requested +{local_label}")
            continue
        best = min(
            (target.tag_priority[t] for t in wtags if t in target.tag_priority), default=None
        )
        if best is None:
            shown = ".".join(sorted({str(t) for t in wtags}))
            reject(file, f"tags {shown} do not fit the target {target.describe()}")
            continue
        if file.requires_python:
            try:
                spec = SpecifierSet(file.requires_python)
            except InvalidSpecifier:
                reject(file, f"invalid Requires-Python {file.requires_python!r}")
                continue
            if not spec.contains(
                target.marker_environment["python_full_version"], prereleases=True
            ):
                reject(
                    file, f"Requires-Python {file.requires_python} excludes Python {target.python}"
                )
                continue
        entry = (best, build, file)
        (yanked if file.yanked else fitting).append(entry)

    def order(entries: list[tuple[int, tuple[int, str] | tuple[()], F]]) -> list[F]:
        # Lower tag priority index is better; a higher build number is better.
        return [f for _, _, f in sorted(entries, key=lambda e: (e[0], _neg_build(e[1])))]

    if fitting:
        for _, _, file in yanked:
            reject(file, f"yanked ({file.yanked_reason or 'no reason given'})")
        return RankedWheels(candidates=tuple(order(fitting)), rejected=tuple(rejected))
    if yanked:
        chosen = order(yanked)
        notes.append(
            f"{name} {version} is yanked ({chosen[0].yanked_reason or 'no reason given'}); "
            "used because the matrix pins this exact version (PEP 592)"
        )
        return RankedWheels(candidates=tuple(chosen), rejected=tuple(rejected), notes=tuple(notes))
    return RankedWheels(candidates=(), rejected=tuple(rejected))


def describe_release(
    files: Iterable[WheelFile], *, project: str, version: str, local_label: str | None = None
) -> str:
    """Which Pythons and platforms the wheels of ``project==version`` are for, grouped by
    the platforms that share the same Pythons, e.g. "the release has wheels for Python
    3.11, 3.12 on manylinux_2_28_aarch64, win_amd64; for Python 3.13 on
    manylinux_2_28_x86_64". ``local_label`` keeps the files `rank_wheels` would consider."""
    wanted = Version(version)
    name = canonicalize_name(project)
    pythons: dict[str, dict[str, tuple[int, ...]]] = {}  # platform -> python label -> sort key
    sdist = False
    for file in files:
        if not file.filename.endswith(".whl"):
            found = sdist_version(file.filename, name)
            sdist = sdist or (found is not None and found.public == wanted.public)
            continue
        try:
            wname, wversion, _, wtags = parse_wheel_filename(file.filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if wname != name or not _version_matches(wversion, wanted):
            continue
        if local_label is not None and wversion.local not in (None, local_label):
            continue
        for tag in wtags:
            key, label = _python_of(tag)
            pythons.setdefault(tag.platform, {})[label] = key
    source = "a source distribution, which envbuilder does not install"
    if not pythons:
        return f"the release has no wheels, only {source}" if sdist else "the release has no files"
    groups: dict[tuple[str, ...], list[str]] = {}
    for platform, labels in pythons.items():
        ordered = tuple(sorted(labels, key=lambda label: (labels[label], label)))
        groups.setdefault(ordered, []).append(platform)
    parts = [
        f"for Python {', '.join(labels)} on {', '.join(sorted(platforms))}"
        for labels, platforms in sorted(groups.items(), key=lambda g: sorted(g[1]))
    ]
    text = "the release has wheels " + "; ".join(parts)
    return text + (f"; and {source}" if sdist else "")


_PYTHON_TAG = re.compile(r"(cp|py)(\d)(\d*)")


def _python_of(tag: Tag) -> tuple[tuple[int, ...], str]:
    """A wheel tag's Python, said plainly ("3.11", "3.13t", "3.9+ (abi3)", "3"), and its order."""
    match = _PYTHON_TAG.fullmatch(tag.interpreter)
    if match is None:
        return (99,), f"{tag.interpreter}-{tag.abi}"
    kind, major, minor = match.groups()
    key = (int(major), int(minor) if minor else -1)
    shown = f"{major}.{minor}" if minor else major
    if tag.abi == "abi3":
        return key, f"{shown}+ (abi3)"
    if kind == "py":
        return key, f"{shown}+" if minor else shown
    if tag.abi.endswith("t"):
        return (*key, 1), f"{shown}t"
    return key, shown


def _neg_build(build: tuple[int, str] | tuple[()]) -> tuple[int, str]:
    if not build:
        return (1, "")
    return (-build[0], build[1])


def sdist_version(filename: str, name: str) -> Version | None:
    """The version of an sdist of project ``name`` from its filename, else None."""
    name = canonicalize_name(name)
    for suffix in (".tar.gz", ".zip"):
        if filename.endswith(suffix):
            stem = filename[: -len(suffix)]
            project, _, version = stem.rpartition("-")
            if canonicalize_name(project) != name:
                return None
            try:
                return Version(version)
            except InvalidVersion:
                return None
    return None


TorchCuda = tuple[CudaTag | None, CudaSource, str]
"""(torch's CUDA or None for a CPU build, where it was read, the evidence)."""


def cuda_from_local_label(version: Version) -> TorchCuda | None:
    """A PyTorch-index build names its CUDA in the local label (``2.5.1+cu121``)."""
    if version.local is None:
        return None
    if version.local == "cpu":
        return None, "local-label", f"+{version.local}"
    try:
        cuda = CudaTag.from_tag(version.local)
    except ValueError:
        return None
    return cuda, "local-label", f"+{version.local}"


def requirements_of(metadata: Message) -> list[Requirement]:
    """The Requires-Dist entries of core metadata; unparsable lines are skipped."""
    out: list[Requirement] = []
    for line in metadata.get_all("Requires-Dist") or []:
        try:
            out.append(Requirement(line))
        except InvalidRequirement:
            continue
    return out


def _applies(req: Requirement, environment: Mapping[str, str]) -> bool:
    if req.marker is None:
        return True
    try:
        return req.marker.evaluate(dict(environment))
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
        return False


def cuda_from_requirements(requirements: Sequence[Requirement], target: Target) -> TorchCuda:
    """Read torch's CUDA from the CUDA runtime it pins for the target.

    Public-index builds pin ``nvidia-cuda-runtime-cu12==12.4.127`` or, in
    newer releases, ``cuda-toolkit[...]==13.0.2``. No such pin: a CPU build.
    """
    for req in requirements:
        if not names_cuda_runtime(req.name):
            continue
        if not _applies(req, target.marker_environment):
            continue
        for spec in req.specifier:
            if spec.operator in ("==", "==="):
                try:
                    cuda = CudaTag.from_version(spec.version)
                except ValueError:
                    continue
                return cuda, "requires-dist", str(req)
    return None, "none", "no CUDA runtime among its requirements"


def torch_requirement(requirements: Sequence[Requirement], target: Target) -> Requirement | None:
    """xformers' requirement on torch for the target, if it has one."""
    for req in requirements:
        if canonicalize_name(req.name) == "torch" and _applies(req, target.marker_environment):
            return req
    return None


def applicable_requirements(
    requirements: Sequence[Requirement], target: Target, *, exclude: Iterable[str] = ()
) -> list[str]:
    """The requirements that apply to the target (no extras), markers evaluated away.

    These are what the rest of a closure is resolved from once envbuilder has
    chosen torch's and xformers' files itself.
    """
    skip = {canonicalize_name(n) for n in exclude}
    out: list[str] = []
    for req in requirements:
        if canonicalize_name(req.name) in skip or not _applies(req, target.marker_environment):
            continue
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        url = f" @ {req.url}" if req.url else ""
        out.append(f"{req.name}{extras}{req.specifier}{url}")
    return out


def portable_requirements(
    requirements: Sequence[Requirement], *, exclude: Iterable[str] = ()
) -> list[str]:
    """The requirements with their markers kept (extras-only ones dropped), for a
    resolution that serves several targets at once."""
    skip = {canonicalize_name(n) for n in exclude}
    out: list[str] = []
    for req in requirements:
        if canonicalize_name(req.name) in skip:
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue
        out.append(str(req))
    return out


def parse_build_record(data: bytes) -> BuildRecord:
    """Read ``xformers/cpp_lib.json``: the torch, CUDA and architectures it was built with.

    ``version.cuda`` is an int such as 1201 (CUDA 12.1); ``version.torch`` is
    e.g. ``2.4.1+cu121``; ``env.TORCH_CUDA_ARCH_LIST`` the architectures.
    """
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"xformers/cpp_lib.json is not JSON: {e}") from e
    version = doc.get("version") if isinstance(doc, dict) else None
    env = doc.get("env") if isinstance(doc, dict) else None
    version = version if isinstance(version, dict) else {}
    env = env if isinstance(env, dict) else {}
    cuda_raw = version.get("cuda")
    cuda: CudaTag | None = None
    if isinstance(cuda_raw, int) and cuda_raw > 0:
        cuda = CudaTag(cuda_raw // 100, cuda_raw % 100)
    elif isinstance(cuda_raw, str) and cuda_raw:
        try:
            cuda = CudaTag.from_version(cuda_raw)
        except ValueError:
            cuda = None  # a build CUDA it does not spell as one: no record of it
    torch = version.get("torch")
    arch = env.get("TORCH_CUDA_ARCH_LIST")
    return BuildRecord(
        torch=torch if isinstance(torch, str) else None,
        cuda=cuda,
        arch_list=arch if isinstance(arch, str) else None,
    )


CudaComparison = Literal["same", "minor", "major", "cpu-torch", "no-record"]


def compare_cuda(built_with: CudaTag | None, torch_cuda: CudaTag | None) -> CudaComparison:
    """How xformers' build CUDA relates to torch's CUDA."""
    if built_with is None:
        return "no-record"
    if torch_cuda is None:
        return "cpu-torch"
    if built_with.major != torch_cuda.major:
        return "major"
    return "same" if built_with.minor == torch_cuda.minor else "minor"
