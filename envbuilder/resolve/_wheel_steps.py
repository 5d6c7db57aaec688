"""The wheel decisions: torch's wheel, then xformers' wheel, from the indexes.

`choose_torch` takes the first fitting torch wheel whose CUDA (its local label,
else the CUDA runtime it pins) is the combination's; `choose_xformers_wheel`
takes the best fitting xformers wheel and refuses it when its Requires-Dist
rules out that torch or its build record says it cannot run with it
(`_build_check`). Where no wheel fits, the reason names what the index offers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from envbuilder.errors import EnvbuilderError
from envbuilder.index.simple import DistributionFile
from envbuilder.model import (
    BuildRecord,
    IndexSpec,
    Rejection,
    ResolvedTorch,
    ResolvedXformers,
)
from envbuilder.resolve._build_check import check_build
from envbuilder.resolve._steps import (
    Chosen,
    Failed,
    Found,
    Inputs,
    sha256_of,
    unreadable,
    unsatisfiable,
)
from envbuilder.resolve.evidence import BUILD_RECORD, file_version
from envbuilder.resolve.wheels import (
    applicable_requirements,
    cuda_from_local_label,
    cuda_from_requirements,
    describe_release,
    portable_requirements,
    rank_wheels,
    requirements_of,
    torch_requirement,
)
from envbuilder.target import CudaTag, Target

__all__ = ["choose_torch", "choose_xformers_wheel"]


def choose_torch(inputs: Inputs) -> Chosen[ResolvedTorch] | Failed:
    """The first fitting torch wheel whose CUDA is the combination's; where none is, the
    reason says what the target's platform offers instead."""
    torch = _torch_wheel(inputs)
    hint = _platform_hint(inputs) if isinstance(torch, Failed) else ""
    if isinstance(torch, Failed) and torch.status == "unsatisfiable" and hint:
        return replace(torch, reason=f"{torch.reason}; {hint}")
    return torch


def _platform_hint(inputs: Inputs) -> str:
    """What a row asking a CUDA torch of a macOS or Windows target should ask instead."""
    c, target = inputs.c, inputs.target
    if not isinstance(c.cuda, CudaTag):
        return ""
    if target.family == "macos":
        return "torch has no CUDA builds for macOS: a macOS row is cuda = 'cpu' (MPS is in it)"
    if target.family == "windows" and not inputs.indexes[c.torch_index].per_cuda:
        return (
            f"torch's Windows wheels on index {c.torch_index!r} are CPU builds where they pin no "
            "CUDA runtime: take a CUDA build for Windows from a per-CUDA index (torch-index)"
        )
    return ""


def _torch_wheel(inputs: Inputs) -> Chosen[ResolvedTorch] | Failed:
    c = inputs.c
    spec = inputs.indexes[c.torch_index]
    wheels = _fitting_wheels(
        inputs, spec, "torch", c.torch, local_label=str(c.cuda) if spec.per_cuda else None
    )
    if isinstance(wheels, Failed):
        return wheels
    found = wheels.found
    wanted_cuda = c.cuda if isinstance(c.cuda, CudaTag) else None
    problems: list[str] = []
    try:
        for file in wheels.value:
            filename = file.filename
            version = parse_wheel_filename(filename)[1]
            requirements = requirements_of(inputs.evidence.metadata(file))
            read = cuda_from_local_label(version)
            if read is None:
                read = cuda_from_requirements(requirements, inputs.target)
            cuda, source, evidence = read
            mismatch = None
            if c.cuda == "cpu" and cuda is not None:
                mismatch = (
                    f"a CUDA {cuda.version} build ({evidence}), "
                    "but the combination asks for a CPU build"
                )
            elif wanted_cuda is not None and cuda != wanted_cuda:
                built = f"CUDA {cuda.version}" if cuda else "a CPU build"
                mismatch = f"{built} ({evidence}), but the combination asks for {c.cuda}"
            if mismatch:
                rejection = Rejection(project="torch", filename=filename, reason=mismatch)
                found += Found(rejected=(rejection,))
                problems.append(f"{filename} is {mismatch}")
                continue
            found += Found(
                dependencies=tuple(applicable_requirements(requirements, inputs.target)),
                raw_dependencies=tuple(portable_requirements(requirements)),
            )
            torch = ResolvedTorch(
                version=str(version),
                cuda=cuda,
                cuda_source=source,
                filename=filename,
                url=file.url,
                sha256=sha256_of(file),
                size=file.size,
                index=spec.name,
            )
            return Chosen(value=torch, found=found)
    except (EnvbuilderError, ValueError) as e:
        return unreadable(e, found)
    return unsatisfiable(f"no torch {c.torch} build for {c.cuda}: " + "; ".join(problems), found)


def choose_xformers_wheel(
    inputs: Inputs, torch: ResolvedTorch
) -> Chosen[ResolvedXformers] | Failed:
    """The best fitting xformers wheel, refused if its Requires-Dist or build record rule out
    the combination's torch."""
    c = inputs.c
    assert c.xformers is not None
    spec = inputs.indexes[c.xformers_index]
    wheels = _fitting_wheels(inputs, spec, "xformers", c.xformers)
    if isinstance(wheels, Failed):
        return wheels
    found = wheels.found
    file = wheels.value[0]
    filename = file.filename
    try:
        xf_requirements = requirements_of(inputs.evidence.metadata(file))
        req = torch_requirement(xf_requirements, inputs.target)
        found += Found(
            dependencies=tuple(
                applicable_requirements(xf_requirements, inputs.target, exclude=["torch"])
            ),
            raw_dependencies=tuple(portable_requirements(xf_requirements, exclude=["torch"])),
        )
        record = inputs.evidence.build_record(file)
        if record is None:
            record = BuildRecord(torch=None, cuda=None, arch_list=None)
            found += Found(notes=(f"{filename} has no {BUILD_RECORD}: its build CUDA is unknown",))
        xformers = ResolvedXformers(
            version=c.xformers,
            filename=filename,
            url=file.url,
            sha256=sha256_of(file),
            requires_torch=str(req.specifier) if req is not None else "",
            built_with=record,
            size=file.size,
            index=spec.name,
        )
    except (EnvbuilderError, ValueError) as e:
        return unreadable(e, found)
    if req is not None and not req.specifier.contains(Version(torch.version), prereleases=True):
        refused = unsatisfiable(
            f"xformers {c.xformers} requires torch{req.specifier} (its Requires-Dist), "
            f"which torch {torch.version} does not satisfy",
            found,
        )
        return replace(refused, xformers=xformers)
    checked = check_build(inputs, xformers, torch)
    if isinstance(checked, Failed):
        return replace(checked, found=found + checked.found, xformers=xformers)
    return Chosen(value=xformers, found=found + checked)


def _fitting_wheels(
    inputs: Inputs, spec: IndexSpec, project: str, version: str, *, local_label: str | None = None
) -> Chosen[tuple[DistributionFile, ...]] | Failed:
    """The wheels of ``project==version`` on ``spec`` that fit the target, best first;
    none fitting is unsatisfiable."""
    target = inputs.target
    found = Found()
    try:
        url, found = inputs.index_argument(spec)
        files = inputs.evidence.release_files(url, project, spec.kind, version)
        ranked = rank_wheels(
            files, project=project, version=version, target=target, local_label=local_label
        )
        found += Found(rejected=tuple(ranked.rejected), notes=tuple(ranked.notes))
        if ranked.candidates:
            return Chosen(value=tuple(ranked.candidates), found=found)
        where = f"index {spec.name!r} ({url})"
        page = inputs.evidence.page(url, project, spec.kind)
    except (EnvbuilderError, ValueError) as e:
        return unreadable(e, found)
    if not page:
        found += Found(notes=(f"index {spec.name!r} lists no files for {project}",))
    if not ranked.rejected:
        return unsatisfiable(_not_on_index(project, version, where, page), found)
    offered = describe_release(files, project=project, version=version, local_label=local_label)
    return unsatisfiable(
        f"no {project} {version} wheel fits {target.describe()} on {where}: "
        + offered
        + _refused(ranked.rejected, target),
        found,
    )


def _not_on_index(project: str, version: str, where: str, files: Sequence[DistributionFile]) -> str:
    versions = sorted({v for f in files if (v := file_version(f.filename, project)) is not None})
    near = [str(v) for v in versions if v.release[:2] == Version(version).release[:2]][-5:]
    hint = f"; releases there near it: {', '.join(near)}" if near else ""
    return f"{project} {version} is not on {where}{hint}"


def _refused(rejected: Sequence[Rejection], target: Target, *, shown: int = 4) -> str:
    """The wheels whose tags fit the target but which were refused all the same, and why."""
    fitting = []
    for r in rejected:
        if r.filename.endswith(".whl"):
            tags = parse_wheel_filename(r.filename)[3]
            if any(t in target.tag_priority for t in tags):
                fitting.append(f"{r.filename}: {r.reason}")
    if not fitting:
        return ""
    more = f"; and {len(fitting) - shown} more" if len(fitting) > shown else ""
    return "; refused: " + "; ".join(fitting[:shown]) + more
