"""Resolve combinations: decide torch and xformers from the evidence, then lock the closure.

For each combination the resolver reads the project pages of the indexes
it names, ranks the wheels of the pinned releases for the combination's
target, reads torch's CUDA (local label or pinned CUDA runtime) and
xformers' requirement on torch and build record (``xformers/cpp_lib.json``)
through HTTP range requests — never a whole wheel — and decides. A
combination that cannot work is a result with a reason, not a crash.
The closure of a decided combination is computed by uv (``closure``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from email.message import Message
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from envbuilder.closure import (
    ClosureError,
    IndexArgument,
    PinnedFile,
    assemble_lock,
    compile_closure,
    lock_inputs,
    locked_packages,
    parse_lock,
    read_lock_inputs,
    requirements_text,
    write_atomic,
)
from envbuilder.errors import EnvbuilderError
from envbuilder.model import (
    BuildRecord,
    Combination,
    IndexSpec,
    Rejection,
    ResolvedCombination,
    ResolvedTorch,
    ResolvedXformers,
)
from envbuilder.wheels import (
    Target,
    applicable_requirements,
    compare_cuda,
    cuda_from_local_label,
    cuda_from_requirements,
    cuda_tag_to_version,
    parse_build_record,
    rank_wheels,
    requirements_of,
    torch_requirement,
)
from envbuilder.wheels import (
    sdist_version as _sdist_version,
)

__all__ = ["ResolveSettings", "Resolver"]

logger = logging.getLogger(__name__)

BUILD_RECORD = "xformers/cpp_lib.json"


@dataclass(frozen=True, kw_only=True)
class ResolveSettings:
    out_dir: Path
    cache_dir: Path
    default_index_url: str
    uv: str
    offline: bool = False
    upgrade: bool = False
    jobs: int = 8
    ca_bundle: str | None = None


class _Unsatisfiable(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Decision:
    """What the evidence says, before the closure is locked."""

    combination: Combination
    target: Target
    torch: ResolvedTorch | None = None
    xformers: ResolvedXformers | None = None
    extra_runtime: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    indexes: list[IndexArgument] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)  # of torch and xformers, for the target

    def result(self, status: str, reason: str) -> ResolvedCombination:
        c = self.combination
        return ResolvedCombination(
            id=c.id,
            status=status,  # type: ignore[arg-type]
            reason=reason,
            python=c.python,
            cuda=c.cuda,
            platform=c.platform,
            torch=self.torch,
            xformers=self.xformers,
            extra_runtime=tuple(self.extra_runtime),
            notes=tuple(self.notes),
            rejected=tuple(self.rejected),
        )


class _Memo:
    """Compute each key once, even when several threads ask at the same time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[object, threading.Lock] = {}
        self._values: dict[object, object] = {}

    def get(self, key: object, compute: Callable[[], object]) -> object:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._values:
                self._values[key] = compute()
            return self._values[key]


class Resolver:
    """Resolves combinations against the indexes a matrix declares."""

    def __init__(
        self,
        *,
        indexes: dict[str, IndexSpec],
        client: object,
        settings: ResolveSettings,
        on_done: Callable[[ResolvedCombination, float], None] | None = None,
    ) -> None:
        self.indexes = indexes
        self.client = client
        self.settings = settings
        self.on_done = on_done
        self._memo = _Memo()

    # -- evidence from the indexes (memoised: many combinations share pages and files) --

    def _index_url(self, spec: IndexSpec, cuda: str) -> str:
        if spec.url is None:
            return self.settings.default_index_url
        url = spec.url_for(cuda)
        assert url is not None
        return url

    def _page(self, url: str, project: str, kind: str) -> list[object]:
        from envbuilder import simple

        def fetch() -> object:
            if kind == "find-links":
                return simple.fetch_find_links(self.client, url, project)  # type: ignore[arg-type]
            return simple.fetch_project_page(self.client, url, project)  # type: ignore[arg-type]

        page = self._memo.get(("page", url, canonicalize_name(project)), fetch)
        return list(page.files)  # type: ignore[attr-defined]

    def _release_files(self, url: str, project: str, kind: str, version: str) -> list[object]:
        """The files of one release (by public version); pages are grouped once per run."""

        def group() -> object:
            by_version: dict[str, list[object]] = {}
            for file in self._page(url, project, kind):
                found = _file_release(getattr(file, "filename", ""), project)
                if found is not None:
                    by_version.setdefault(found, []).append(file)
            return by_version

        grouped = self._memo.get(("by-version", url, canonicalize_name(project)), group)
        return list(grouped.get(Version(version).public, []))  # type: ignore[attr-defined]

    def _metadata(self, file: object) -> Message:
        from envbuilder import remotewheel

        key = ("metadata", getattr(file, "url", None))
        return self._memo.get(key, lambda: remotewheel.read_core_metadata(self.client, file))  # type: ignore[arg-type, return-value]

    def _build_record(self, file: object) -> BuildRecord | None:
        from envbuilder import remotewheel

        def read() -> BuildRecord | None:
            data = remotewheel.read_member(self.client, file, BUILD_RECORD)  # type: ignore[arg-type]
            if data is None:
                return None
            try:
                return parse_build_record(data)
            except ValueError as e:  # a broken record is this combination's error, not a crash
                name = getattr(file, "filename", file)
                raise EnvbuilderError(f"{name!r}: unreadable {BUILD_RECORD}: {e}") from e

        return self._memo.get(("build-record", getattr(file, "url", None)), read)  # type: ignore[return-value]

    # -- decisions --

    def decide(self, combination: Combination) -> _Decision:
        """Choose torch and xformers for one combination, or raise _Unsatisfiable."""
        d = self._new_decision(combination)
        self._decide(d)
        return d

    def _new_decision(self, combination: Combination) -> _Decision:
        target = Target(python=combination.python, platform=combination.platform)
        d = _Decision(combination=combination, target=target)
        default_spec = self.indexes.get("default", IndexSpec(name="default", url=None))
        default_url = self._index_url(default_spec, combination.cuda)
        d.indexes.append(IndexArgument(role="default", url=default_url))
        return d

    def _decide(self, d: _Decision) -> None:
        d.torch = self._decide_torch(d)
        if d.combination.xformers is not None:
            d.xformers = self._decide_xformers(d)

    def _index_argument(self, d: _Decision, spec: IndexSpec) -> str:
        url = self._index_url(spec, d.combination.cuda)
        if spec.url is not None:
            role = "find-links" if spec.kind == "find-links" else "index"
            arg = IndexArgument(role=role, url=url)
            if arg not in d.indexes:
                d.indexes.append(arg)
        return url

    def _decide_torch(self, d: _Decision) -> ResolvedTorch:
        c = d.combination
        spec = self.indexes[c.torch_index]
        url = self._index_argument(d, spec)
        files = self._release_files(url, "torch", spec.kind, c.torch)
        local = c.cuda if spec.per_cuda else None
        ranked = rank_wheels(
            files, project="torch", version=c.torch, target=d.target, local_label=local
        )  # type: ignore[type-var]
        d.rejected += ranked.rejected
        d.notes += ranked.notes
        if not ranked.candidates:
            raise _Unsatisfiable(
                _nothing_fits(
                    "torch",
                    c.torch,
                    d.target,
                    spec,
                    url,
                    self._page(url, "torch", spec.kind),
                    ranked.rejected,
                )
            )
        wanted_cuda = None if c.cuda in ("default", "cpu") else cuda_tag_to_version(c.cuda)
        problems: list[str] = []
        for file in ranked.candidates:
            filename: str = file.filename  # type: ignore[attr-defined]
            version = parse_wheel_filename(filename)[1]
            requirements = requirements_of(self._metadata(file))
            found = cuda_from_local_label(version)
            if found is None:
                found = cuda_from_requirements(requirements, d.target)
            cuda, source, evidence = found
            mismatch = None
            if c.cuda == "cpu" and cuda is not None:
                mismatch = (
                    f"a CUDA {cuda} build ({evidence}), but the combination asks for a CPU build"
                )
            elif wanted_cuda is not None and cuda != wanted_cuda:
                built = f"CUDA {cuda}" if cuda else "a CPU build"
                mismatch = f"{built} ({evidence}), but the combination asks for {c.cuda}"
            if mismatch:
                d.rejected.append(Rejection(project="torch", filename=filename, reason=mismatch))
                problems.append(f"{filename} is {mismatch}")
                continue
            d.dependencies += applicable_requirements(requirements, d.target)
            return ResolvedTorch(
                version=str(version),
                cuda=cuda,
                cuda_source=source,
                filename=filename,
                url=file.url,  # type: ignore[attr-defined]
                sha256=_sha256(file),
                size=getattr(file, "size", None),
                index=spec.name,
            )
        raise _Unsatisfiable(f"no torch {c.torch} build for {c.cuda}: " + "; ".join(problems))

    def _decide_xformers(self, d: _Decision) -> ResolvedXformers:
        c = d.combination
        assert c.xformers is not None and d.torch is not None
        torch = d.torch
        spec = self.indexes[c.xformers_index]
        url = self._index_argument(d, spec)
        files = self._release_files(url, "xformers", spec.kind, c.xformers)
        ranked = rank_wheels(files, project="xformers", version=c.xformers, target=d.target)  # type: ignore[type-var]
        d.rejected += ranked.rejected
        d.notes += ranked.notes
        if not ranked.candidates:
            raise _Unsatisfiable(
                _nothing_fits(
                    "xformers",
                    c.xformers,
                    d.target,
                    spec,
                    url,
                    self._page(url, "xformers", spec.kind),
                    ranked.rejected,
                )
            )
        file = ranked.candidates[0]
        filename: str = file.filename  # type: ignore[attr-defined]
        xf_requirements = requirements_of(self._metadata(file))
        req = torch_requirement(xf_requirements, d.target)
        d.dependencies += applicable_requirements(xf_requirements, d.target, exclude=["torch"])
        requires = str(req.specifier) if req is not None else ""
        record = self._build_record(file)
        if record is None:
            record = BuildRecord(torch=None, cuda=None, arch_list=None)
            d.notes.append(f"{filename} has no {BUILD_RECORD}: its build CUDA is unknown")
        xformers = ResolvedXformers(
            version=c.xformers,
            filename=filename,
            url=file.url,  # type: ignore[attr-defined]
            sha256=_sha256(file),
            requires_torch=requires,
            built_with=record,
            size=getattr(file, "size", None),
            index=spec.name,
        )
        d.xformers = xformers
        if req is not None and not req.specifier.contains(Version(torch.version), prereleases=True):
            raise _Unsatisfiable(
                f"xformers {c.xformers} requires torch{req.specifier} (its Requires-Dist), "
                f"which torch {torch.version} does not satisfy"
            )
        self._check_build(d, xformers, torch)
        return xformers

    def _check_build(self, d: _Decision, xformers: ResolvedXformers, torch: ResolvedTorch) -> None:
        record = xformers.built_with
        built = f"torch {record.torch}" if record.torch else "an unrecorded torch"
        if record.torch:
            try:
                built_release = Version(record.torch).release[:2]
                if built_release != Version(torch.version).release[:2]:
                    d.notes.append(
                        f"xformers {xformers.version} was built against torch {record.torch}; "
                        f"this combination runs it with torch {torch.version}"
                    )
            except InvalidVersion:
                pass
        match compare_cuda(record.cuda, torch.cuda):
            case "same" | "no-record":
                return
            case "minor":
                d.notes.append(
                    f"CUDA minor versions differ: xformers built with CUDA {record.cuda}, "
                    f"torch built with CUDA {torch.cuda} (same major; minor-version compatible)"
                )
            case "cpu-torch":
                raise _Unsatisfiable(
                    f"xformers {xformers.version} is a CUDA {record.cuda} build ({built}), "
                    f"but torch {torch.version} is a CPU build: its extension cannot run"
                )
            case "major":
                assert record.cuda is not None and torch.cuda is not None
                major = record.cuda.split(".")[0]
                problem = (
                    f"xformers {xformers.version} was built for {built} with CUDA {record.cuda}, "
                    f"but torch {torch.version} is built with CUDA {torch.cuda}: "
                    f"xformers' C++/CUDA extension needs libcudart.so.{major}, which this torch does not bring"
                )
                if not d.combination.add_cuda_runtime:
                    raise _Unsatisfiable(
                        problem + "; set add-cuda-runtime = true to add that CUDA runtime"
                    )
                runtime = self._cuda_runtime(d, record.cuda)
                d.extra_runtime.append(runtime)
                d.notes.append(f"{problem}; added {runtime} (add-cuda-runtime = true)")

    def _cuda_runtime(self, d: _Decision, cuda: str) -> str:
        """The newest CUDA runtime wheel of the build's major.minor on the default index."""
        major, minor = cuda.split(".")[:2]
        project = f"nvidia-cuda-runtime-cu{major}"
        url = d.indexes[0].url
        files = self._page(url, project, "simple")
        best: Version | None = None
        for file in files:
            filename: str = file.filename  # type: ignore[attr-defined]
            if not filename.endswith(".whl") or getattr(file, "yanked", False):
                continue
            version = parse_wheel_filename(filename)[1]
            if version.release[:2] == (int(major), int(minor)) and (best is None or version > best):
                best = version
        if best is None:
            raise _Unsatisfiable(f"no {project} {major}.{minor}.* on the default index to add")
        return f"{project}=={best}"

    # -- whole runs --

    def resolve_one(self, combination: Combination) -> ResolvedCombination:
        start = time.monotonic()
        d = self._new_decision(combination)
        try:
            self._decide(d)
        except _Unsatisfiable as e:
            result = d.result("unsatisfiable", e.reason)
        except EnvbuilderError as e:
            result = d.result("error", str(e))
        else:
            result = self._lock(d)
        if self.on_done is not None:
            self.on_done(result, time.monotonic() - start)
        return result

    def _lock(self, d: _Decision) -> ResolvedCombination:
        """Lock the closure: uv resolves the chosen wheels' dependencies, envbuilder adds the wheels."""
        c = d.combination
        assert d.torch is not None
        pinned = [_pinned("torch", d.torch.version, d.torch)]
        if d.xformers is not None:
            pinned.append(_pinned("xformers", d.xformers.version, d.xformers))
        dependencies = list(dict.fromkeys(d.dependencies + d.extra_runtime))
        out = self.settings.out_dir
        lock_path = out / f"pylock.{c.id}.toml"
        req_path = out / f"requirements.{c.id}.txt"
        inputs = lock_inputs(dependencies, d.target, d.indexes, pinned)
        text = doc = None
        if not self.settings.upgrade and lock_path.exists():
            existing = lock_path.read_text(encoding="utf-8")
            doc = parse_lock(existing)
            if doc is not None and read_lock_inputs(doc) == inputs:
                text = existing  # stable: same decision, same indexes -> keep the lock
        try:
            if text is None or doc is None:
                closure = compile_closure(
                    requirements=dependencies,
                    target=d.target,
                    indexes=d.indexes,
                    cache_dir=self.settings.cache_dir / "uv",
                    uv=self.settings.uv,
                    offline=self.settings.offline,
                    ca_bundle=self.settings.ca_bundle,
                )
                text = assemble_lock(closure, pinned=pinned, inputs=inputs, target=d.target)
                doc = parse_lock(text)
                assert doc is not None
            packages = locked_packages(doc)
            sha = write_atomic(lock_path, text)
            write_atomic(req_path, requirements_text(c.id, packages, d.indexes))
        except ClosureError as e:
            return d.result("error", str(e))
        resolved = d.result("resolved", _resolved_reason(d))
        return replace(
            resolved,
            lock=_relative(lock_path, out),
            lock_sha256=sha,
            requirements=_relative(req_path, out),
        )

    def resolve(self, combinations: Sequence[Combination]) -> list[ResolvedCombination]:
        """Resolve in parallel; the result keeps the input order."""
        if not combinations:
            return []
        workers = max(1, min(self.settings.jobs, len(combinations)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="resolve") as pool:
            return list(pool.map(self.resolve_one, combinations))


def _pinned(name: str, version: str, chosen: ResolvedTorch | ResolvedXformers) -> PinnedFile:
    return PinnedFile(
        name=name,
        version=version,
        filename=chosen.filename,
        url=chosen.url,
        sha256=chosen.sha256,
        size=chosen.size,
    )


def _sha256(file: object) -> str:
    hashes = getattr(file, "hashes", {}) or {}
    sha = hashes.get("sha256")
    if not sha:
        raise EnvbuilderError(f"{getattr(file, 'filename', file)!r} has no sha256 on its index")
    return str(sha)


def _relative(path: Path, out_dir: Path) -> str:
    """The path relative to the output's parent (docs/contracts.md), whatever the cwd."""
    return path.resolve().relative_to(out_dir.resolve().parent).as_posix()


def _nothing_fits(
    project: str,
    version: str,
    target: Target,
    spec: IndexSpec,
    url: str,
    files: list[object],
    rejected: Sequence[Rejection],
) -> str:
    where = f"index {spec.name!r} ({url})"
    if not rejected:
        versions = sorted(
            {
                v
                for f in files
                if (v := _file_version(getattr(f, "filename", ""), project)) is not None
            }
        )
        near = [str(v) for v in versions if v.release[:2] == Version(version).release[:2]][-5:]
        hint = f"; releases there near it: {', '.join(near)}" if near else ""
        return f"{project} {version} is not on {where}{hint}"
    reasons = sorted({r.reason for r in rejected})
    return f"no {project} {version} wheel fits {target.describe()} on {where}: " + "; ".join(
        reasons[:4]
    )


def _file_release(filename: str, project: str) -> str | None:
    """The public version of a wheel or sdist of ``project``, else None."""
    version = _file_version(filename, project)
    if version is None:
        version = _sdist_version(filename, project)
    return version.public if version is not None else None


def _file_version(filename: str, project: str) -> Version | None:
    if not filename.endswith(".whl"):
        return None
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except (ValueError, InvalidVersion):
        return None
    return version if name == canonicalize_name(project) else None


def _resolved_reason(d: _Decision) -> str:
    assert d.torch is not None
    torch_cuda = f"CUDA {d.torch.cuda}" if d.torch.cuda else "CPU"
    text = f"torch {d.torch.version} ({torch_cuda}, from {d.torch.cuda_source})"
    if d.xformers is not None:
        built = d.xformers.built_with
        text += f"; xformers {d.xformers.version} built with torch {built.torch}, CUDA {built.cuda}"
        if d.xformers.requires_torch:
            text += f"; requires torch{d.xformers.requires_torch}"
    if d.extra_runtime:
        text += "; added " + ", ".join(d.extra_runtime)
    return text
