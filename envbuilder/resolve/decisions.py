"""Decisions: torch and xformers for one combination, from the evidence, as values.

`decide` reads the indexes only through an `Evidence` source and returns
a `Decision`: what was chosen, every rejected file with its reason, the
notes, and its status — ``decided`` (ready to be locked), ``unsatisfiable``
(a reason why the combination cannot work) or ``error`` (the evidence
could not be read). Nothing here does I/O of its own: a fake evidence
source with no HTTP server is enough to test it.

Each step (torch, then xformers' wheel or sdist) returns its choice with
what it found on the way, or a failure carrying what it found before it
stopped, so that an answer short of ``decided`` still lists the files
refused and the notes gathered; `decide` joins them in step order.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Generic, Literal, TypeVar

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from envbuilder.errors import EnvbuilderError
from envbuilder.index.simple import DistributionFile
from envbuilder.model import (
    BuildRecord,
    Combination,
    IndexSpec,
    Rejection,
    ResolvedCombination,
    ResolvedTorch,
    ResolvedXformers,
    SourceBuild,
    SourceFile,
    Status,
)
from envbuilder.resolve.closure import IndexArgument, PinnedFile
from envbuilder.resolve.evidence import BUILD_RECORD, Evidence, file_version
from envbuilder.resolve.sdists import BUILD_TOOLS, arch_problem, build_flags, compiler_projects
from envbuilder.resolve.wheels import (
    applicable_requirements,
    compare_cuda,
    cuda_from_local_label,
    cuda_from_requirements,
    describe_release,
    portable_requirements,
    rank_wheels,
    requirements_of,
    sdist_version,
    torch_requirement,
)
from envbuilder.target import CudaTag, Target, cuda_runtime_projects

__all__ = ["Decision", "decide", "target_of"]


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What the evidence says about one combination, before its closure is locked."""

    combination: Combination
    target: Target
    status: Literal["decided", "unsatisfiable", "error"]
    reason: str = ""
    torch: ResolvedTorch | None = None
    xformers: ResolvedXformers | None = None
    extra_runtime: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    indexes: tuple[IndexArgument, ...] = ()
    dependencies: tuple[str, ...] = ()  # of torch and xformers, for the target
    raw_dependencies: tuple[str, ...] = ()  # the same, markers kept
    source_build: SourceBuild | None = None  # xformers from its sdist: what the build needs

    def result(self, status: Status, reason: str) -> ResolvedCombination:
        """The resolver's answer with this decision's findings."""
        c = self.combination
        return ResolvedCombination(
            combination=c,
            status=status,
            reason=reason,
            torch=self.torch,
            xformers=self.xformers,
            extra_runtime=self.extra_runtime,
            notes=self.notes,
            rejected=self.rejected,
            source_build=self.source_build,
        )

    def pins(self) -> list[PinnedFile]:
        """The files envbuilder chose itself, added to uv's closure."""
        assert self.torch is not None
        pinned = [_pinned("torch", self.torch)]
        # a source-built xformers is no file of the lock: its build group and record hold it
        if self.xformers is not None and self.source_build is None:
            pinned.append(_pinned("xformers", self.xformers))
        return pinned

    def closure_requirements(self) -> list[str]:
        """What the rest of the closure is resolved from, for the target."""
        return list(dict.fromkeys(self.dependencies + self.extra_runtime))

    def closure_key(self) -> tuple[object, ...]:
        """Decisions with the same key are locked from one universal resolution."""
        return (tuple(sorted(set(self.raw_dependencies + self.extra_runtime))), self.indexes)

    def resolved_reason(self) -> str:
        """The one-line account of a resolved combination."""
        assert self.torch is not None
        torch_cuda = f"CUDA {self.torch.cuda.version}" if self.torch.cuda else "CPU"
        text = f"torch {self.torch.version} ({torch_cuda}, from {self.torch.cuda_source})"
        if self.xformers is not None and self.source_build is not None:
            torch = self.torch.version
            if "+" not in torch and self.torch.cuda:
                torch += "+" + self.torch.cuda.tag
            return (
                f"xformers {self.xformers.version} built from source for torch {torch} "
                f"({self.source_build.why}); {text}"
            )
        if self.xformers is not None:
            built = self.xformers.built_with
            text += (
                f"; xformers {self.xformers.version} built with torch {built.torch}, "
                f"CUDA {_version(built.cuda)}"
            )
            if self.xformers.requires_torch:
                text += f"; requires torch{self.xformers.requires_torch}"
        if self.extra_runtime:
            text += "; added " + ", ".join(self.extra_runtime)
        return text


@dataclass(frozen=True, kw_only=True)
class _Found:
    """What a step found besides its choice; steps' findings join with ``+`` in step order."""

    rejected: tuple[Rejection, ...] = ()
    notes: tuple[str, ...] = ()
    indexes: tuple[IndexArgument, ...] = ()
    dependencies: tuple[str, ...] = ()
    raw_dependencies: tuple[str, ...] = ()
    extra_runtime: tuple[str, ...] = ()

    def __add__(self, other: _Found) -> _Found:
        return _Found(
            rejected=self.rejected + other.rejected,
            notes=self.notes + other.notes,
            indexes=tuple(dict.fromkeys(self.indexes + other.indexes)),
            dependencies=self.dependencies + other.dependencies,
            raw_dependencies=self.raw_dependencies + other.raw_dependencies,
            extra_runtime=self.extra_runtime + other.extra_runtime,
        )


_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class _Chosen(Generic[_T]):
    """A step's choice and what it found on the way."""

    value: _T
    found: _Found


@dataclass(frozen=True, kw_only=True)
class _Failed:
    """A step that could not choose: why, and what it found before it stopped."""

    status: Literal["unsatisfiable", "error"]
    reason: str
    found: _Found
    xformers: ResolvedXformers | None = None  # the wheel chosen when its checks refuse it


@dataclass(frozen=True, kw_only=True)
class _Xformers:
    """xformers as chosen: a wheel, or an sdist with what building it needs."""

    xformers: ResolvedXformers
    source_build: SourceBuild | None = None


def _unsatisfiable(reason: str, found: _Found) -> _Failed:
    return _Failed(status="unsatisfiable", reason=reason, found=found)


def _unreadable(e: EnvbuilderError | ValueError, found: _Found) -> _Failed:
    """Evidence that could not be read is an ``error`` answer, keeping what was found before."""
    if isinstance(e, EnvbuilderError):
        return _Failed(status="error", reason=str(e), found=found)
    # evidence the resolver cannot read, e.g. a broken build record
    return _Failed(status="error", reason=f"unreadable evidence: {e}", found=found)


@functools.cache
def target_of(python: str, platform: str) -> Target:
    """Targets are shared: their tag lists are long to compute."""
    return Target(python=python, platform=platform)


def index_url(spec: IndexSpec, cuda: str, default_index_url: str) -> str:
    """The URL of ``spec`` for a combination's CUDA; the default index has none of its own."""
    if spec.url is None:
        return default_index_url
    url = spec.url_for(cuda)
    assert url is not None
    return url


@dataclass(frozen=True, kw_only=True)
class _Inputs:
    """What every step of one decision reads; the steps return what they find."""

    c: Combination
    target: Target
    evidence: Evidence
    indexes: Mapping[str, IndexSpec]
    default_index_url: str
    default_url: str  # the default index's URL for this combination

    def index_argument(self, spec: IndexSpec) -> tuple[str, _Found]:
        """``spec``'s URL, and the index argument uv needs for it (none for the default)."""
        url = index_url(spec, str(self.c.cuda), self.default_index_url)
        if spec.url is None:
            return url, _Found()
        role: Literal["index", "find-links"] = (
            "find-links" if spec.kind == "find-links" else "index"
        )
        return url, _Found(indexes=(IndexArgument(role=role, url=url),))


def decide(
    combination: Combination,
    evidence: Evidence,
    *,
    indexes: Mapping[str, IndexSpec],
    default_index_url: str,
) -> Decision:
    """Choose torch and xformers for ``combination`` from the evidence."""
    target = target_of(combination.python, combination.platform)
    default_spec = indexes.get("default", IndexSpec(name="default", url=None))
    default = IndexArgument(
        role="default", url=index_url(default_spec, str(combination.cuda), default_index_url)
    )
    inputs = _Inputs(
        c=combination,
        target=target,
        evidence=evidence,
        indexes=indexes,
        default_index_url=default_index_url,
        default_url=default.url,
    )
    found = _Found(indexes=(default,))

    def answer(
        found: _Found,
        outcome: _Failed | None,
        torch: ResolvedTorch | None = None,
        xformers: _Xformers | None = None,
    ) -> Decision:
        status: Literal["decided", "unsatisfiable", "error"] = "decided"
        reason = ""
        chosen_xformers = xformers.xformers if xformers is not None else None
        if outcome is not None:
            status, reason, chosen_xformers = outcome.status, outcome.reason, outcome.xformers
        return Decision(
            combination=combination,
            target=target,
            status=status,
            reason=reason,
            torch=torch,
            xformers=chosen_xformers,
            extra_runtime=found.extra_runtime,
            notes=found.notes,
            rejected=found.rejected,
            indexes=found.indexes,
            dependencies=found.dependencies,
            raw_dependencies=found.raw_dependencies,
            source_build=xformers.source_build if xformers is not None else None,
        )

    torch = _torch(inputs)
    found += torch.found
    if isinstance(torch, _Failed):
        return answer(found, torch)
    if combination.xformers is None:
        return answer(found, None, torch.value)
    xformers = _xformers(inputs, torch.value)
    found += xformers.found
    if isinstance(xformers, _Failed):
        return answer(found, xformers, torch.value)
    return answer(found, None, torch.value, xformers.value)


def _fitting_wheels(
    inputs: _Inputs, spec: IndexSpec, project: str, version: str, *, local_label: str | None = None
) -> _Chosen[tuple[DistributionFile, ...]] | _Failed:
    """The wheels of ``project==version`` on ``spec`` that fit the target, best first;
    none fitting is unsatisfiable."""
    target = inputs.target
    found = _Found()
    try:
        url, found = inputs.index_argument(spec)
        files = inputs.evidence.release_files(url, project, spec.kind, version)
        ranked = rank_wheels(
            files, project=project, version=version, target=target, local_label=local_label
        )
        found += _Found(rejected=tuple(ranked.rejected), notes=tuple(ranked.notes))
        if ranked.candidates:
            return _Chosen(value=tuple(ranked.candidates), found=found)
        where = f"index {spec.name!r} ({url})"
        page = inputs.evidence.page(url, project, spec.kind)
    except (EnvbuilderError, ValueError) as e:
        return _unreadable(e, found)
    if not page:
        found += _Found(notes=(f"index {spec.name!r} lists no files for {project}",))
    if not ranked.rejected:
        return _unsatisfiable(_not_on_index(project, version, where, page), found)
    offered = describe_release(files, project=project, version=version, local_label=local_label)
    return _unsatisfiable(
        f"no {project} {version} wheel fits {target.describe()} on {where}: "
        + offered
        + _refused(ranked.rejected, target),
        found,
    )


def _torch(inputs: _Inputs) -> _Chosen[ResolvedTorch] | _Failed:
    """The first fitting torch wheel whose CUDA is the combination's; where none is, the
    reason says what the target's platform offers instead."""
    torch = _torch_wheel(inputs)
    hint = _platform_hint(inputs) if isinstance(torch, _Failed) else ""
    if isinstance(torch, _Failed) and torch.status == "unsatisfiable" and hint:
        return replace(torch, reason=f"{torch.reason}; {hint}")
    return torch


def _platform_hint(inputs: _Inputs) -> str:
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


def _torch_wheel(inputs: _Inputs) -> _Chosen[ResolvedTorch] | _Failed:
    c = inputs.c
    spec = inputs.indexes[c.torch_index]
    wheels = _fitting_wheels(
        inputs, spec, "torch", c.torch, local_label=str(c.cuda) if spec.per_cuda else None
    )
    if isinstance(wheels, _Failed):
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
                found += _Found(rejected=(rejection,))
                problems.append(f"{filename} is {mismatch}")
                continue
            found += _Found(
                dependencies=tuple(applicable_requirements(requirements, inputs.target)),
                raw_dependencies=tuple(portable_requirements(requirements)),
            )
            torch = ResolvedTorch(
                version=str(version),
                cuda=cuda,
                cuda_source=source,
                filename=filename,
                url=file.url,
                sha256=_sha256(file),
                size=file.size,
                index=spec.name,
            )
            return _Chosen(value=torch, found=found)
    except (EnvbuilderError, ValueError) as e:
        return _unreadable(e, found)
    return _unsatisfiable(f"no torch {c.torch} build for {c.cuda}: " + "; ".join(problems), found)


def _xformers(inputs: _Inputs, torch: ResolvedTorch) -> _Chosen[_Xformers] | _Failed:
    """xformers' wheel, or its sdist and build group when the row asks for a source build."""
    c = inputs.c
    if c.xformers_source == "always":
        return _source_build(inputs, torch, "xformers-source = 'always'")
    wheel = _xformers_wheel(inputs, torch)
    if not isinstance(wheel, _Failed):
        return _Chosen(value=_Xformers(xformers=wheel.value), found=wheel.found)
    if wheel.status == "unsatisfiable" and inputs.target.family == "macos":
        # no CUDA on macOS: no source build either, whatever the row's policy
        return replace(
            wheel,
            reason=f"{wheel.reason}; xformers' kernels are CUDA kernels and macOS has no CUDA, "
            "so no build of it runs there: a macOS row is torch alone",
        )
    if wheel.status != "unsatisfiable" or c.xformers_source != "when-no-wheel-fits":
        return wheel
    # the wheel is not used: its notes and dependencies go, what was refused and where stays
    kept = _Found(rejected=wheel.found.rejected, indexes=wheel.found.indexes)
    built = _source_build(inputs, torch, f"no wheel fits: {wheel.reason}")
    if isinstance(built, _Failed):
        return replace(built, found=kept + built.found)
    return _Chosen(value=built.value, found=kept + built.found)


def _xformers_wheel(inputs: _Inputs, torch: ResolvedTorch) -> _Chosen[ResolvedXformers] | _Failed:
    """The best fitting xformers wheel, refused if its Requires-Dist or build record rule out
    the combination's torch."""
    c = inputs.c
    assert c.xformers is not None
    spec = inputs.indexes[c.xformers_index]
    wheels = _fitting_wheels(inputs, spec, "xformers", c.xformers)
    if isinstance(wheels, _Failed):
        return wheels
    found = wheels.found
    file = wheels.value[0]
    filename = file.filename
    try:
        xf_requirements = requirements_of(inputs.evidence.metadata(file))
        req = torch_requirement(xf_requirements, inputs.target)
        found += _Found(
            dependencies=tuple(
                applicable_requirements(xf_requirements, inputs.target, exclude=["torch"])
            ),
            raw_dependencies=tuple(portable_requirements(xf_requirements, exclude=["torch"])),
        )
        record = inputs.evidence.build_record(file)
        if record is None:
            record = BuildRecord(torch=None, cuda=None, arch_list=None)
            found += _Found(notes=(f"{filename} has no {BUILD_RECORD}: its build CUDA is unknown",))
        xformers = ResolvedXformers(
            version=c.xformers,
            filename=filename,
            url=file.url,
            sha256=_sha256(file),
            requires_torch=str(req.specifier) if req is not None else "",
            built_with=record,
            size=file.size,
            index=spec.name,
        )
    except (EnvbuilderError, ValueError) as e:
        return _unreadable(e, found)
    if req is not None and not req.specifier.contains(Version(torch.version), prereleases=True):
        refused = _unsatisfiable(
            f"xformers {c.xformers} requires torch{req.specifier} (its Requires-Dist), "
            f"which torch {torch.version} does not satisfy",
            found,
        )
        return replace(refused, xformers=xformers)
    checked = _check_build(inputs, xformers, torch)
    if isinstance(checked, _Failed):
        return replace(checked, found=found + checked.found, xformers=xformers)
    return _Chosen(value=xformers, found=found + checked)


def _check_build(
    inputs: _Inputs, xformers: ResolvedXformers, torch: ResolvedTorch
) -> _Found | _Failed:
    """What xformers' build record says about running it with ``torch``: notes, a CUDA
    runtime to add, or why it cannot run."""
    c = inputs.c
    notes: list[str] = []
    record = xformers.built_with
    built = f"torch {record.torch}" if record.torch else "an unrecorded torch"
    if record.torch:
        try:
            built_release = Version(record.torch).release[:2]
            if built_release != Version(torch.version).release[:2]:
                notes.append(
                    f"xformers {xformers.version} was built against torch {record.torch}; "
                    f"this combination runs it with torch {torch.version}"
                )
        except InvalidVersion:
            pass
    unneeded = "add-cuda-runtime = true: no runtime added: "
    built_v, torch_v = _version(record.cuda), _version(torch.cuda)
    match compare_cuda(record.cuda, torch.cuda):
        case "same":
            if c.add_cuda_runtime:
                notes.append(
                    f"{unneeded}xformers {xformers.version} was built with CUDA {built_v}, "
                    f"the CUDA of torch {torch.version}, whose runtime torch brings"
                )
        case "no-record":
            if c.add_cuda_runtime:
                notes.append(
                    f"{unneeded}xformers {xformers.version} records no build CUDA, "
                    "so no other runtime is known to be needed"
                )
        case "minor":
            notes.append(
                f"CUDA minor versions differ: xformers built with CUDA {built_v}, "
                f"torch built with CUDA {torch_v} (same major; minor-version compatible)"
            )
            if c.add_cuda_runtime:
                notes.append(
                    f"{unneeded}xformers {xformers.version} was built with CUDA {built_v}, "
                    f"the CUDA major of torch {torch.version} ({torch_v}), "
                    "whose runtime torch brings"
                )
        case "cpu-torch":
            return _unsatisfiable(
                f"xformers {xformers.version} is a CUDA {built_v} build ({built}), "
                f"but torch {torch.version} is a CPU build: its extension cannot run",
                _Found(notes=tuple(notes)),
            )
        case "major":
            assert record.cuda is not None and torch.cuda is not None
            built_cuda = record.cuda
            major = built_cuda.major
            problem = (
                f"xformers {xformers.version} was built for {built} with CUDA {built_v}, "
                f"but torch {torch.version} is built with CUDA {torch_v}: "
                f"xformers' C++/CUDA extension needs libcudart.so.{major}, which this torch does not bring"
            )
            try:
                runtime = _cuda_runtime(inputs, built_cuda)
            except (EnvbuilderError, ValueError) as e:
                return _unreadable(e, _Found(notes=tuple(notes)))
            if runtime is None:
                return _unsatisfiable(
                    f"{problem}; no CUDA {built_cuda.version} runtime wheel for {inputs.target.describe()} "
                    f"on the default index (looked for "
                    f"{', '.join(cuda_runtime_projects(major))}), so add-cuda-runtime "
                    "cannot add one",
                    _Found(notes=tuple(notes)),
                )
            if not c.add_cuda_runtime:
                return _unsatisfiable(
                    f"{problem}; set add-cuda-runtime = true to add {runtime}",
                    _Found(notes=tuple(notes)),
                )
            notes.append(f"{problem}; added {runtime} (add-cuda-runtime = true)")
            if inputs.target.family == "windows":
                notes.append(
                    f"on Windows the extension finds {runtime}'s DLLs only where PATH (or "
                    "os.add_dll_directory) names its nvidia/cuda_runtime/bin directory"
                )
            return _Found(notes=tuple(notes), extra_runtime=(runtime,))
    return _Found(notes=tuple(notes))


def _cuda_runtime(inputs: _Inputs, cuda: CudaTag) -> str | None:
    """The newest CUDA runtime wheel of the build's major.minor for the target on the
    default index, from the first of `cuda_runtime_projects` that has one."""
    for project in cuda_runtime_projects(cuda.major):
        best = _newest(inputs, project, cuda)
        if best is not None:
            return f"{project}=={best}"
    return None


def _newest(inputs: _Inputs, project: str, cuda: CudaTag) -> Version | None:
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


def _source_build(inputs: _Inputs, torch: ResolvedTorch, why: str) -> _Chosen[_Xformers] | _Failed:
    """Lock xformers' sdist and what building it needs; impossible is unsatisfiable."""
    c, target = inputs.c, inputs.target
    assert c.xformers is not None
    spec = inputs.indexes[c.xformers_index]
    found = _Found()
    if target.family != "linux":
        return _unsatisfiable(
            f"{why}; a source build compiles in a glibc Linux image, "
            f"and this row is for {target.platform}",
            found,
        )
    try:
        url, found = inputs.index_argument(spec)
        wanted = Version(c.xformers)
        sdists = sorted(
            (
                f
                for f in inputs.evidence.release_files(url, "xformers", spec.kind, c.xformers)
                if not f.filename.endswith(".whl")
                and not f.yanked
                and sdist_version(f.filename, "xformers") == wanted
            ),
            key=lambda f: (not f.filename.endswith(".tar.gz"), f.filename),
        )
        if not sdists:
            return _unsatisfiable(
                f"{why}; and xformers {c.xformers} has no sdist on index {spec.name!r} "
                "to build it from",
                found,
            )
        if torch.cuda is None:
            return _unsatisfiable(
                f"{why}; a source build compiles xformers' CUDA kernels, "
                f"but torch {torch.version} is a CPU build",
                found,
            )
        if not c.cuda_archs:
            return _unsatisfiable(
                f"{why}; a source build needs cuda-archs, and the row has none", found
            )
        for arch in c.cuda_archs:
            if (problem := arch_problem(torch.cuda, arch)) is not None:
                return _unsatisfiable(f"{why}; {problem}", found)
        file = sdists[0]
        info = inputs.evidence.sdist_info(file)
        requires = _requirements(info.requires_dist, file.filename)
        req = torch_requirement(requires, target)
        if req is not None and not req.specifier.contains(Version(torch.version), prereleases=True):
            return _unsatisfiable(
                f"{why}; and xformers {c.xformers}'s sdist requires torch{req.specifier}, "
                f"which torch {torch.version} does not satisfy",
                found,
            )
        build: list[str] = []
        for r in _requirements(info.build_requires, f"{file.filename} [build-system]"):
            if canonicalize_name(r.name) == "torch":  # the combination's own torch
                if not r.specifier.contains(Version(torch.version), prereleases=True):
                    return _unsatisfiable(
                        f"{why}; and xformers {c.xformers} builds only with torch{r.specifier} "
                        f"(its [build-system] requires), not torch {torch.version}",
                        found,
                    )
                continue
            build += applicable_requirements([r], target)
        named = {canonicalize_name(Requirement(b).name) for b in build}
        build += [tool for tool in BUILD_TOOLS if canonicalize_name(tool) not in named]
        compiler = _compiler(inputs, torch.cuda, why)
        if isinstance(compiler, str):
            return _unsatisfiable(compiler, found)
        build += compiler
        found += _Found(
            dependencies=tuple(applicable_requirements(requires, target, exclude=["torch"])),
            raw_dependencies=tuple(portable_requirements(requires, exclude=["torch"])),
        )
        archs = ";".join(c.cuda_archs)
        xformers = ResolvedXformers(
            version=c.xformers,
            filename=file.filename,
            url=file.url,
            sha256=_sha256(file),
            requires_torch=str(req.specifier) if req is not None else "",
            built_with=BuildRecord(torch=torch.version, cuda=torch.cuda, arch_list=archs),
            size=file.size,
            index=spec.name,
        )
        source_build = SourceBuild(
            sdist=SourceFile(
                filename=file.filename, url=file.url, sha256=_sha256(file), size=file.size
            ),
            why=why,
            cuda=torch.cuda,
            arch_list=c.cuda_archs,
            flags=build_flags(version=c.xformers, arch_list=c.cuda_archs),
            build_requirements_in=tuple(dict.fromkeys(build)),
        )
    except (EnvbuilderError, ValueError) as e:
        return _unreadable(e, found)
    note = (
        f"xformers {c.xformers} is built from {file.filename} for CUDA {torch.cuda.version}, "
        f"architectures {archs} (envbuilder build-wheel {c.id})"
    )
    chosen = _Xformers(xformers=xformers, source_build=source_build)
    return _Chosen(value=chosen, found=found + _Found(notes=(note,)))


def _compiler(inputs: _Inputs, cuda: CudaTag, why: str) -> list[str] | str:
    """The CUDA ``cuda`` compiler, header and CCCL wheels for the target, each the newest
    release of that major.minor on the default index; any missing, why it is unsatisfiable."""
    chosen: list[str] = []
    missing: list[str] = []
    for project in compiler_projects(cuda.major):
        best = _newest(inputs, project, cuda)
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


def _requirements(lines: Sequence[str], where: str) -> list[Requirement]:
    out: list[Requirement] = []
    for line in lines:
        try:
            out.append(Requirement(line))
        except InvalidRequirement as e:
            raise ValueError(f"{where}: invalid requirement {line!r} ({e})") from e
    return out


def _pinned(name: str, chosen: ResolvedTorch | ResolvedXformers) -> PinnedFile:
    return PinnedFile(
        name=name,
        version=chosen.version,
        filename=chosen.filename,
        url=chosen.url,
        sha256=chosen.sha256,
        size=chosen.size,
    )


def _sha256(file: DistributionFile) -> str:
    sha = file.hashes.get("sha256")
    if not sha:
        raise EnvbuilderError(f"{file.filename!r} has no sha256 on its index")
    return sha


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


def _version(cuda: CudaTag | None) -> str | None:
    """A CUDA as messages spell it, ``12.8``; None stays None."""
    return None if cuda is None else cuda.version
