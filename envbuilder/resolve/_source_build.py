"""The source-build decision: xformers from its sdist, and what building it needs.

Where a row asks for it (``xformers-source``), xformers is locked as its sdist
with a build group: the sdist's ``[build-system]`` requirements (its torch
being the combination's own), the build tools, and the CUDA compiler, header
and CCCL wheels of torch's CUDA for the target. A build compiles in a glibc
Linux image for a CUDA torch and the row's ``cuda-archs``; anything else is
unsatisfiable, with the reason the row gave for building.
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from envbuilder.errors import EnvbuilderError
from envbuilder.index.simple import DistributionFile
from envbuilder.model import (
    BuildRecord,
    IndexSpec,
    ResolvedTorch,
    ResolvedXformers,
    SourceBuild,
    SourceFile,
)
from envbuilder.resolve._steps import (
    Chosen,
    Failed,
    Found,
    Inputs,
    XformersChoice,
    newest_for_cuda,
    parse_requirements,
    sha256_of,
    unreadable,
    unsatisfiable,
)
from envbuilder.resolve.sdists import BUILD_TOOLS, arch_problem, build_flags, compiler_projects
from envbuilder.resolve.wheels import (
    applicable_requirements,
    portable_requirements,
    sdist_version,
    torch_requirement,
)
from envbuilder.target import CudaTag

__all__ = ["choose_source_build"]


def choose_source_build(
    inputs: Inputs, torch: ResolvedTorch, why: str
) -> Chosen[XformersChoice] | Failed:
    """Lock xformers' sdist and what building it needs; impossible is unsatisfiable."""
    c, target = inputs.c, inputs.target
    assert c.xformers is not None
    spec = inputs.indexes[c.xformers_index]
    found = Found()
    if target.family != "linux":
        return unsatisfiable(
            f"{why}; a source build compiles in a glibc Linux image, "
            f"and this row is for {target.platform}",
            found,
        )
    try:
        url, found = inputs.index_argument(spec)
        sdists = _sdists(inputs, url, spec)
        if not sdists:
            return unsatisfiable(
                f"{why}; and xformers {c.xformers} has no sdist on index {spec.name!r} "
                "to build it from",
                found,
            )
        if torch.cuda is None:
            return unsatisfiable(
                f"{why}; a source build compiles xformers' CUDA kernels, "
                f"but torch {torch.version} is a CPU build",
                found,
            )
        if (problem := _archs_problem(c.cuda_archs, torch.cuda)) is not None:
            return unsatisfiable(f"{why}; {problem}", found)
        file = sdists[0]
        info = inputs.evidence.sdist_info(file)
        requires = parse_requirements(info.requires_dist, file.filename)
        req = torch_requirement(requires, target)
        if req is not None and not req.specifier.contains(Version(torch.version), prereleases=True):
            return unsatisfiable(
                f"{why}; and xformers {c.xformers}'s sdist requires torch{req.specifier}, "
                f"which torch {torch.version} does not satisfy",
                found,
            )
        build = _build_requirements(inputs, file, info.build_requires, torch, torch.cuda, why)
        if isinstance(build, str):
            return unsatisfiable(build, found)
        found += Found(
            dependencies=tuple(applicable_requirements(requires, target, exclude=["torch"])),
            raw_dependencies=tuple(portable_requirements(requires, exclude=["torch"])),
        )
        requires_torch = str(req.specifier) if req is not None else ""
        chosen = _built_xformers(inputs, spec, file, torch, torch.cuda, requires_torch, why, build)
    except (EnvbuilderError, ValueError) as e:
        return unreadable(e, found)
    note = (
        f"xformers {c.xformers} is built from {file.filename} for CUDA {torch.cuda.version}, "
        f"architectures {';'.join(c.cuda_archs)} (envbuilder build-wheel {c.id})"
    )
    return Chosen(value=chosen, found=found + Found(notes=(note,)))


def _sdists(inputs: Inputs, url: str, spec: IndexSpec) -> list[DistributionFile]:
    """The row's xformers release's sdists on ``spec`` at ``url``, unyanked, the
    ``.tar.gz`` first."""
    c = inputs.c
    assert c.xformers is not None
    wanted = Version(c.xformers)
    return sorted(
        (
            f
            for f in inputs.evidence.release_files(url, "xformers", spec.kind, c.xformers)
            if not f.filename.endswith(".whl")
            and not f.yanked
            and sdist_version(f.filename, "xformers") == wanted
        ),
        key=lambda f: (not f.filename.endswith(".tar.gz"), f.filename),
    )


def _archs_problem(archs: Sequence[str], cuda: CudaTag) -> str | None:
    """Why the row's ``cuda-archs`` cannot be built with ``cuda``; None when they can."""
    if not archs:
        return "a source build needs cuda-archs, and the row has none"
    for arch in archs:
        if (problem := arch_problem(cuda, arch)) is not None:
            return problem
    return None


def _build_requirements(
    inputs: Inputs,
    file: DistributionFile,
    build_requires: Sequence[str],
    torch: ResolvedTorch,
    cuda: CudaTag,
    why: str,
) -> list[str] | str:
    """What building ``file`` needs for the target: its ``[build-system]`` requirements but
    torch (the combination's own, which they must admit), the build tools they leave out,
    and the CUDA compiler wheels; or why it cannot be built."""
    c, target = inputs.c, inputs.target
    build: list[str] = []
    for r in parse_requirements(build_requires, f"{file.filename} [build-system]"):
        if canonicalize_name(r.name) == "torch":  # the combination's own torch
            if not r.specifier.contains(Version(torch.version), prereleases=True):
                return (
                    f"{why}; and xformers {c.xformers} builds only with torch{r.specifier} "
                    f"(its [build-system] requires), not torch {torch.version}"
                )
            continue
        build += applicable_requirements([r], target)
    named = {canonicalize_name(Requirement(b).name) for b in build}
    build += [tool for tool in BUILD_TOOLS if canonicalize_name(tool) not in named]
    compiler = _compiler(inputs, cuda, why)
    if isinstance(compiler, str):
        return compiler
    return build + compiler


def _built_xformers(
    inputs: Inputs,
    spec: IndexSpec,
    file: DistributionFile,
    torch: ResolvedTorch,
    cuda: CudaTag,
    requires_torch: str,
    why: str,
    build: Sequence[str],
) -> XformersChoice:
    """xformers as it will be built from ``file``, and the source build that makes it."""
    c = inputs.c
    assert c.xformers is not None
    xformers = ResolvedXformers(
        version=c.xformers,
        filename=file.filename,
        url=file.url,
        sha256=sha256_of(file),
        requires_torch=requires_torch,
        built_with=BuildRecord(torch=torch.version, cuda=cuda, arch_list=";".join(c.cuda_archs)),
        size=file.size,
        index=spec.name,
    )
    source_build = SourceBuild(
        sdist=SourceFile(
            filename=file.filename, url=file.url, sha256=sha256_of(file), size=file.size
        ),
        why=why,
        cuda=cuda,
        arch_list=c.cuda_archs,
        flags=build_flags(version=c.xformers, arch_list=c.cuda_archs),
        build_requirements_in=tuple(dict.fromkeys(build)),
    )
    return XformersChoice(xformers=xformers, source_build=source_build)


def _compiler(inputs: Inputs, cuda: CudaTag, why: str) -> list[str] | str:
    """The CUDA ``cuda`` compiler, header and CCCL wheels for the target, each the newest
    release of that major.minor on the default index; any missing, why it is unsatisfiable."""
    chosen: list[str] = []
    missing: list[str] = []
    for project in compiler_projects(cuda.major):
        best = newest_for_cuda(inputs, project, cuda)
        if best is None:
            missing.append(project)
        else:
            chosen.append(f"{project}=={best}")
    if missing:
        major, minor = cuda.major, cuda.minor
        return (
            f"{why}; and no CUDA {major}.{minor} compiler wheels for "
            f"{inputs.target.describe()} on the default index: none of "
            f"{', '.join(f'{m} {major}.{minor}.*' for m in missing)}"
        )
    return chosen
