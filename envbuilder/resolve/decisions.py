"""Decisions: torch and xformers for one combination, from the evidence, as values.

`decide` reads the indexes only through an `Evidence` source and returns
a `Decision`: what was chosen, every rejected file with its reason, the
notes, and its status — ``decided`` (ready to be locked), ``unsatisfiable``
(a reason why the combination cannot work) or ``error`` (the evidence
could not be read). Nothing here does I/O of its own: a fake evidence
source with no HTTP server is enough to test it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

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


class _Unsatisfiable(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Findings:
    """What the steps of one `decide` call found so far (local to that call)."""

    rejected: list[Rejection] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    indexes: list[IndexArgument] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)
    raw_dependencies: list[str] = field(default_factory=list)
    extra_runtime: list[str] = field(default_factory=list)
    torch: ResolvedTorch | None = None
    xformers: ResolvedXformers | None = None
    source_build: SourceBuild | None = None


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


def decide(
    combination: Combination,
    evidence: Evidence,
    *,
    indexes: Mapping[str, IndexSpec],
    default_index_url: str,
) -> Decision:
    """Choose torch and xformers for ``combination`` from the evidence."""
    target = target_of(combination.python, combination.platform)
    found = _Findings()
    default_spec = indexes.get("default", IndexSpec(name="default", url=None))
    found.indexes.append(
        IndexArgument(
            role="default", url=index_url(default_spec, str(combination.cuda), default_index_url)
        )
    )
    status: Literal["decided", "unsatisfiable", "error"] = "decided"
    reason = ""
    steps = _Steps(combination, target, evidence, indexes, default_index_url, found)
    try:
        found.torch = steps.torch()
        if combination.xformers is not None:
            steps.xformers()
    except _Unsatisfiable as e:
        status, reason = "unsatisfiable", e.reason
    except EnvbuilderError as e:
        status, reason = "error", str(e)
    except ValueError as e:  # evidence the resolver cannot read, e.g. a broken build record
        status, reason = "error", f"unreadable evidence: {e}"
    return Decision(
        combination=combination,
        target=target,
        status=status,
        reason=reason,
        torch=found.torch,
        xformers=found.xformers,
        extra_runtime=tuple(found.extra_runtime),
        notes=tuple(found.notes),
        rejected=tuple(found.rejected),
        indexes=tuple(found.indexes),
        dependencies=tuple(found.dependencies),
        raw_dependencies=tuple(found.raw_dependencies),
        source_build=found.source_build,
    )


@dataclass(frozen=True)
class _Steps:
    """The steps of one decision; they record what they find in ``found``."""

    c: Combination
    target: Target
    evidence: Evidence
    indexes: Mapping[str, IndexSpec]
    default_index_url: str
    found: _Findings

    def _index_argument(self, spec: IndexSpec) -> str:
        url = index_url(spec, str(self.c.cuda), self.default_index_url)
        if spec.url is not None:
            arg = IndexArgument(
                role="find-links" if spec.kind == "find-links" else "index", url=url
            )
            if arg not in self.found.indexes:
                self.found.indexes.append(arg)
        return url

    def _fitting_wheels(
        self, spec: IndexSpec, project: str, version: str, *, local_label: str | None = None
    ) -> tuple[DistributionFile, ...]:
        """The wheels of ``project==version`` on ``spec`` that fit the target, best first;
        none fitting is unsatisfiable."""
        url = self._index_argument(spec)
        files = self.evidence.release_files(url, project, spec.kind, version)
        ranked = rank_wheels(
            files, project=project, version=version, target=self.target, local_label=local_label
        )
        self.found.rejected += ranked.rejected
        self.found.notes += ranked.notes
        if not ranked.candidates:
            where = f"index {spec.name!r} ({url})"
            page = self.evidence.page(url, project, spec.kind)
            if not page:
                self.found.notes.append(f"index {spec.name!r} lists no files for {project}")
            if not ranked.rejected:
                raise _Unsatisfiable(_not_on_index(project, version, where, page))
            offered = describe_release(
                files, project=project, version=version, local_label=local_label
            )
            raise _Unsatisfiable(
                f"no {project} {version} wheel fits {self.target.describe()} on {where}: "
                + offered
                + _refused(ranked.rejected, self.target)
            )
        return tuple(ranked.candidates)

    def torch(self) -> ResolvedTorch:
        c = self.c
        spec = self.indexes[c.torch_index]
        candidates = self._fitting_wheels(
            spec, "torch", c.torch, local_label=str(c.cuda) if spec.per_cuda else None
        )
        wanted_cuda = c.cuda if isinstance(c.cuda, CudaTag) else None
        problems: list[str] = []
        for file in candidates:
            filename = file.filename
            version = parse_wheel_filename(filename)[1]
            requirements = requirements_of(self.evidence.metadata(file))
            found = cuda_from_local_label(version)
            if found is None:
                found = cuda_from_requirements(requirements, self.target)
            cuda, source, evidence = found
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
                self.found.rejected.append(
                    Rejection(project="torch", filename=filename, reason=mismatch)
                )
                problems.append(f"{filename} is {mismatch}")
                continue
            self.found.dependencies += applicable_requirements(requirements, self.target)
            self.found.raw_dependencies += portable_requirements(requirements)
            return ResolvedTorch(
                version=str(version),
                cuda=cuda,
                cuda_source=source,
                filename=filename,
                url=file.url,
                sha256=_sha256(file),
                size=file.size,
                index=spec.name,
            )
        raise _Unsatisfiable(f"no torch {c.torch} build for {c.cuda}: " + "; ".join(problems))

    def xformers(self) -> None:
        """xformers' wheel, or its sdist and build group when the row asks for a source build."""
        if self.c.xformers_source == "always":
            self._source_build("xformers-source = 'always'")
            return
        kept = (
            len(self.found.dependencies),
            len(self.found.raw_dependencies),
            len(self.found.notes),
        )
        try:
            self._xformers_wheel()
        except _Unsatisfiable as e:
            if self.c.xformers_source != "when-no-wheel-fits":
                raise
            del self.found.dependencies[kept[0] :]
            del self.found.raw_dependencies[kept[1] :]
            del self.found.notes[kept[2] :]  # about the wheel, which is not used
            self.found.xformers = None
            self._source_build(f"no wheel fits: {e.reason}")

    def _source_build(self, why: str) -> None:
        """Lock xformers' sdist and what building it needs; impossible is unsatisfiable."""
        c = self.c
        torch = self.found.torch
        assert c.xformers is not None and torch is not None
        spec = self.indexes[c.xformers_index]
        url = self._index_argument(spec)
        wanted = Version(c.xformers)
        sdists = sorted(
            (
                f
                for f in self.evidence.release_files(url, "xformers", spec.kind, c.xformers)
                if not f.filename.endswith(".whl")
                and not f.yanked
                and sdist_version(f.filename, "xformers") == wanted
            ),
            key=lambda f: (not f.filename.endswith(".tar.gz"), f.filename),
        )
        if not sdists:
            raise _Unsatisfiable(
                f"{why}; and xformers {c.xformers} has no sdist on index {spec.name!r} "
                "to build it from"
            )
        if torch.cuda is None:
            raise _Unsatisfiable(
                f"{why}; a source build compiles xformers' CUDA kernels, "
                f"but torch {torch.version} is a CPU build"
            )
        if not c.cuda_archs:
            raise _Unsatisfiable(f"{why}; a source build needs cuda-archs, and the row has none")
        for arch in c.cuda_archs:
            if (problem := arch_problem(torch.cuda, arch)) is not None:
                raise _Unsatisfiable(f"{why}; {problem}")
        file = sdists[0]
        info = self.evidence.sdist_info(file)
        requires = _requirements(info.requires_dist, file.filename)
        req = torch_requirement(requires, self.target)
        if req is not None and not req.specifier.contains(Version(torch.version), prereleases=True):
            raise _Unsatisfiable(
                f"{why}; and xformers {c.xformers}'s sdist requires torch{req.specifier}, "
                f"which torch {torch.version} does not satisfy"
            )
        build: list[str] = []
        for r in _requirements(info.build_requires, f"{file.filename} [build-system]"):
            if canonicalize_name(r.name) == "torch":  # the combination's own torch
                if not r.specifier.contains(Version(torch.version), prereleases=True):
                    raise _Unsatisfiable(
                        f"{why}; and xformers {c.xformers} builds only with torch{r.specifier} "
                        f"(its [build-system] requires), not torch {torch.version}"
                    )
                continue
            build += applicable_requirements([r], self.target)
        named = {canonicalize_name(Requirement(b).name) for b in build}
        build += [tool for tool in BUILD_TOOLS if canonicalize_name(tool) not in named]
        build += self._compiler(torch.cuda, why)
        self.found.dependencies += applicable_requirements(requires, self.target, exclude=["torch"])
        self.found.raw_dependencies += portable_requirements(requires, exclude=["torch"])
        archs = ";".join(c.cuda_archs)
        self.found.xformers = ResolvedXformers(
            version=c.xformers,
            filename=file.filename,
            url=file.url,
            sha256=_sha256(file),
            requires_torch=str(req.specifier) if req is not None else "",
            built_with=BuildRecord(torch=torch.version, cuda=torch.cuda, arch_list=archs),
            size=file.size,
            index=spec.name,
        )
        self.found.source_build = SourceBuild(
            sdist=SourceFile(
                filename=file.filename, url=file.url, sha256=_sha256(file), size=file.size
            ),
            why=why,
            cuda=torch.cuda,
            arch_list=c.cuda_archs,
            flags=build_flags(version=c.xformers, arch_list=c.cuda_archs),
            build_requirements_in=tuple(dict.fromkeys(build)),
        )
        self.found.notes.append(
            f"xformers {c.xformers} is built from {file.filename} for CUDA {torch.cuda.version}, "
            f"architectures {archs} (envbuilder build-wheel {c.id})"
        )

    def _compiler(self, cuda: CudaTag, why: str) -> list[str]:
        """The CUDA ``cuda`` compiler, header and CCCL wheels for the target, each the newest
        release of that major.minor on the default index; any missing is unsatisfiable."""
        major, minor = cuda.major, cuda.minor
        url = self.found.indexes[0].url
        chosen: list[str] = []
        missing: list[str] = []
        for project in compiler_projects(major):
            best: Version | None = None
            for file in self.evidence.page(url, project, "simple"):
                if file.yanked or (version := file_version(file.filename, project)) is None:
                    continue
                tags = parse_wheel_filename(file.filename)[3]
                fits = any(t in self.target.tag_priority for t in tags)
                if fits and version.release[:2] == (major, minor):
                    best = version if best is None or version > best else best
            if best is None:
                missing.append(project)
            else:
                chosen.append(f"{project}=={best}")
        if missing:
            raise _Unsatisfiable(
                f"{why}; and no CUDA {major}.{minor} compiler wheels for "
                f"{self.target.describe()} on the default index: none of "
                f"{', '.join(f'{m} {major}.{minor}.*' for m in missing)}"
            )
        return chosen

    def _xformers_wheel(self) -> None:
        c = self.c
        torch = self.found.torch
        assert c.xformers is not None and torch is not None
        spec = self.indexes[c.xformers_index]
        file = self._fitting_wheels(spec, "xformers", c.xformers)[0]
        filename = file.filename
        xf_requirements = requirements_of(self.evidence.metadata(file))
        req = torch_requirement(xf_requirements, self.target)
        self.found.dependencies += applicable_requirements(
            xf_requirements, self.target, exclude=["torch"]
        )
        self.found.raw_dependencies += portable_requirements(xf_requirements, exclude=["torch"])
        requires = str(req.specifier) if req is not None else ""
        record = self.evidence.build_record(file)
        if record is None:
            record = BuildRecord(torch=None, cuda=None, arch_list=None)
            self.found.notes.append(f"{filename} has no {BUILD_RECORD}: its build CUDA is unknown")
        xformers = ResolvedXformers(
            version=c.xformers,
            filename=filename,
            url=file.url,
            sha256=_sha256(file),
            requires_torch=requires,
            built_with=record,
            size=file.size,
            index=spec.name,
        )
        self.found.xformers = xformers
        if req is not None and not req.specifier.contains(Version(torch.version), prereleases=True):
            raise _Unsatisfiable(
                f"xformers {c.xformers} requires torch{req.specifier} (its Requires-Dist), "
                f"which torch {torch.version} does not satisfy"
            )
        self._check_build(xformers, torch)

    def _check_build(self, xformers: ResolvedXformers, torch: ResolvedTorch) -> None:
        record = xformers.built_with
        built = f"torch {record.torch}" if record.torch else "an unrecorded torch"
        if record.torch:
            try:
                built_release = Version(record.torch).release[:2]
                if built_release != Version(torch.version).release[:2]:
                    self.found.notes.append(
                        f"xformers {xformers.version} was built against torch {record.torch}; "
                        f"this combination runs it with torch {torch.version}"
                    )
            except InvalidVersion:
                pass
        unneeded = "add-cuda-runtime = true: no runtime added: "
        built_v, torch_v = _version(record.cuda), _version(torch.cuda)
        match compare_cuda(record.cuda, torch.cuda):
            case "same":
                if self.c.add_cuda_runtime:
                    self.found.notes.append(
                        f"{unneeded}xformers {xformers.version} was built with CUDA {built_v}, "
                        f"the CUDA of torch {torch.version}, whose runtime torch brings"
                    )
            case "no-record":
                if self.c.add_cuda_runtime:
                    self.found.notes.append(
                        f"{unneeded}xformers {xformers.version} records no build CUDA, "
                        "so no other runtime is known to be needed"
                    )
            case "minor":
                self.found.notes.append(
                    f"CUDA minor versions differ: xformers built with CUDA {built_v}, "
                    f"torch built with CUDA {torch_v} (same major; minor-version compatible)"
                )
                if self.c.add_cuda_runtime:
                    self.found.notes.append(
                        f"{unneeded}xformers {xformers.version} was built with CUDA {built_v}, "
                        f"the CUDA major of torch {torch.version} ({torch_v}), "
                        "whose runtime torch brings"
                    )
            case "cpu-torch":
                raise _Unsatisfiable(
                    f"xformers {xformers.version} is a CUDA {built_v} build ({built}), "
                    f"but torch {torch.version} is a CPU build: its extension cannot run"
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
                runtime = self._cuda_runtime(built_cuda)
                if runtime is None:
                    raise _Unsatisfiable(
                        f"{problem}; no CUDA {built_cuda.version} runtime wheel for {self.target.describe()} "
                        f"on the default index (looked for "
                        f"{', '.join(cuda_runtime_projects(major))}), so add-cuda-runtime "
                        "cannot add one"
                    )
                if not self.c.add_cuda_runtime:
                    raise _Unsatisfiable(f"{problem}; set add-cuda-runtime = true to add {runtime}")
                self.found.extra_runtime.append(runtime)
                self.found.notes.append(f"{problem}; added {runtime} (add-cuda-runtime = true)")

    def _cuda_runtime(self, cuda: CudaTag) -> str | None:
        """The newest CUDA runtime wheel of the build's major.minor for the target on the
        default index, from the first of `cuda_runtime_projects` that has one."""
        url = self.found.indexes[0].url
        for project in cuda_runtime_projects(cuda.major):
            best: Version | None = None
            for file in self.evidence.page(url, project, "simple"):
                if file.yanked or (version := file_version(file.filename, project)) is None:
                    continue
                tags = parse_wheel_filename(file.filename)[3]
                fits = any(t in self.target.tag_priority for t in tags)
                if fits and version.release[:2] == (cuda.major, cuda.minor):
                    best = version if best is None or version > best else best
            if best is not None:
                return f"{project}=={best}"
        return None


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
