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

import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from email.message import Message
from pathlib import Path
from typing import Any, TypeVar

from packaging.pylock import Pylock
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from envbuilder import remotewheel, simple
from envbuilder.closure import (
    ClosureError,
    IndexArgument,
    PinnedFile,
    assemble_lock,
    compile_closure,
    lock_inputs,
    lock_requirements,
    select_for_target,
)
from envbuilder.errors import EnvbuilderError
from envbuilder.files import write_atomic
from envbuilder.http import HttpClient
from envbuilder.model import (
    BuildRecord,
    Combination,
    IndexSpec,
    Rejection,
    ResolvedCombination,
    ResolvedTorch,
    ResolvedXformers,
    Status,
    lock_filename,
)
from envbuilder.pylock import PylockError, packages, read_lock, tool_table
from envbuilder.simple import DistributionFile, ProjectPage
from envbuilder.target import CudaTag, Target
from envbuilder.wheels import (
    applicable_requirements,
    compare_cuda,
    cuda_from_local_label,
    cuda_from_requirements,
    parse_build_record,
    portable_requirements,
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

_T = TypeVar("_T")


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
    raw_dependencies: list[str] = field(default_factory=list)  # the same, markers kept
    started: float = field(default_factory=time.monotonic)

    def result(self, status: Status, reason: str) -> ResolvedCombination:
        c = self.combination
        return ResolvedCombination(
            id=c.id,
            status=status,
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
        self._locks: dict[Hashable, threading.Lock] = {}
        self._values: dict[Hashable, Any] = {}

    def get(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._values:
                self._values[key] = compute()
            value: _T = self._values[key]
            return value


class Resolver:
    """Resolves combinations against the indexes a matrix declares."""

    def __init__(
        self,
        *,
        indexes: dict[str, IndexSpec],
        client: HttpClient,
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

    def _page(self, url: str, project: str, kind: str) -> list[DistributionFile]:
        def fetch() -> ProjectPage:
            if kind == "find-links":
                return simple.fetch_find_links(self.client, url, project)
            return simple.fetch_project_page(self.client, url, project)

        page = self._memo.get(("page", url, canonicalize_name(project)), fetch)
        return list(page.files)

    def _release_files(
        self, url: str, project: str, kind: str, version: str
    ) -> list[DistributionFile]:
        """The files of one release (by public version); pages are grouped once per run."""

        def group() -> dict[str, list[DistributionFile]]:
            by_version: dict[str, list[DistributionFile]] = {}
            for file in self._page(url, project, kind):
                found = _file_release(file.filename, project)
                if found is not None:
                    by_version.setdefault(found, []).append(file)
            return by_version

        grouped = self._memo.get(("by-version", url, canonicalize_name(project)), group)
        return list(grouped.get(Version(version).public, []))

    def _metadata(self, file: DistributionFile) -> Message:
        key = ("metadata", file.url)
        return self._memo.get(key, lambda: remotewheel.read_core_metadata(self.client, file))

    def _build_record(self, file: DistributionFile) -> BuildRecord | None:
        def read() -> BuildRecord | None:
            data = remotewheel.read_member(self.client, file, BUILD_RECORD)
            if data is None:
                return None
            try:
                return parse_build_record(data)
            except ValueError as e:  # a broken record is this combination's error, not a crash
                raise EnvbuilderError(f"{file.filename!r}: unreadable {BUILD_RECORD}: {e}") from e

        return self._memo.get(("build-record", file.url), read)

    # -- decisions --

    def decide(self, combination: Combination) -> _Decision:
        """Choose torch and xformers for one combination, or raise _Unsatisfiable."""
        d = self._new_decision(combination)
        self._decide(d)
        return d

    def _new_decision(self, combination: Combination) -> _Decision:
        target = _target(combination.python, combination.platform)
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

    def _fitting_wheels(
        self,
        d: _Decision,
        spec: IndexSpec,
        project: str,
        version: str,
        *,
        local_label: str | None = None,
    ) -> tuple[DistributionFile, ...]:
        """The wheels of ``project==version`` on ``spec`` that fit the target, best first;
        rejections and notes go to the decision, and none fitting is unsatisfiable."""
        url = self._index_argument(d, spec)
        files = self._release_files(url, project, spec.kind, version)
        ranked = rank_wheels(
            files, project=project, version=version, target=d.target, local_label=local_label
        )
        d.rejected += ranked.rejected
        d.notes += ranked.notes
        if not ranked.candidates:
            page = self._page(url, project, spec.kind)
            reason = _nothing_fits(project, version, d.target, spec, url, page, ranked.rejected)
            raise _Unsatisfiable(reason)
        return tuple(ranked.candidates)

    def _decide_torch(self, d: _Decision) -> ResolvedTorch:
        c = d.combination
        spec = self.indexes[c.torch_index]
        candidates = self._fitting_wheels(
            d, spec, "torch", c.torch, local_label=c.cuda if spec.per_cuda else None
        )
        wanted_cuda = None if c.cuda in ("default", "cpu") else CudaTag.from_tag(c.cuda).version
        problems: list[str] = []
        for file in candidates:
            filename = file.filename
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
            d.raw_dependencies += portable_requirements(requirements)
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

    def _decide_xformers(self, d: _Decision) -> ResolvedXformers:
        c = d.combination
        assert c.xformers is not None and d.torch is not None
        torch = d.torch
        spec = self.indexes[c.xformers_index]
        candidates = self._fitting_wheels(d, spec, "xformers", c.xformers)
        file = candidates[0]
        filename = file.filename
        xf_requirements = requirements_of(self._metadata(file))
        req = torch_requirement(xf_requirements, d.target)
        d.dependencies += applicable_requirements(xf_requirements, d.target, exclude=["torch"])
        d.raw_dependencies += portable_requirements(xf_requirements, exclude=["torch"])
        requires = str(req.specifier) if req is not None else ""
        record = self._build_record(file)
        if record is None:
            record = BuildRecord(torch=None, cuda=None, arch_list=None)
            d.notes.append(f"{filename} has no {BUILD_RECORD}: its build CUDA is unknown")
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
            filename = file.filename
            if not filename.endswith(".whl") or file.yanked:
                continue
            version = parse_wheel_filename(filename)[1]
            if version.release[:2] == (int(major), int(minor)) and (best is None or version > best):
                best = version
        if best is None:
            raise _Unsatisfiable(f"no {project} {major}.{minor}.* on the default index to add")
        return f"{project}=={best}"

    # -- whole runs --

    def resolve_one(self, combination: Combination) -> ResolvedCombination:
        return self.resolve([combination])[0]

    def _decide_one(self, combination: Combination) -> tuple[_Decision, ResolvedCombination | None]:
        """Phase one: the decision, or the final answer when there is nothing to lock."""
        d = self._new_decision(combination)
        try:
            self._decide(d)
        except _Unsatisfiable as e:
            return d, self._done(d, d.result("unsatisfiable", e.reason))
        except EnvbuilderError as e:
            return d, self._done(d, d.result("error", str(e)))
        except ValueError as e:  # evidence the resolver cannot read, e.g. a broken build record
            return d, self._done(d, d.result("error", f"unreadable evidence: {e}"))
        return d, None

    def _done(self, d: _Decision, result: ResolvedCombination) -> ResolvedCombination:
        if self.on_done is not None:
            self.on_done(result, time.monotonic() - d.started)
        return result

    def _lock_group(self, members: Sequence[_Decision]) -> list[ResolvedCombination]:
        """Phase two: lock decisions that share their requirements with one uv resolution.

        A member whose existing lock was made from the same inputs keeps it; the
        others take their part of one universal closure.
        """
        results: dict[str, ResolvedCombination] = {}
        pending: list[tuple[_Decision, list[PinnedFile], dict[str, Any]]] = []
        for d in members:
            pinned = _pins(d)
            inputs = lock_inputs(_dependencies(d), d.target, d.indexes, pinned)
            existing = self._existing_lock(d, inputs)
            if existing is not None:
                results[d.combination.id] = self._write(d, *existing)
            else:
                pending.append((d, pinned, inputs))
        if not pending:
            return [results[d.combination.id] for d in members]
        requirements = list(
            dict.fromkeys(r for d, _, _ in pending for r in d.raw_dependencies + d.extra_runtime)
        )
        floor = min((d.target.python for d, _, _ in pending), key=_python_key)
        closure: Pylock | None = None
        failure = ""
        try:
            closure = compile_closure(
                requirements=requirements,
                python_floor=floor,
                indexes=pending[0][0].indexes,
                cache_dir=self.settings.cache_dir / "uv" / _digest(requirements),
                uv=self.settings.uv,
                offline=self.settings.offline,
                ca_bundle=self.settings.ca_bundle,
            )
        except ClosureError as e:
            failure = str(e)
        for d, pinned, inputs in pending:
            if closure is None:
                results[d.combination.id] = self._done(d, d.result("error", failure))
                continue
            try:
                text = assemble_lock(
                    select_for_target(closure, d.target),
                    pinned=pinned,
                    inputs=inputs,
                    target=d.target,
                )
            except ClosureError as e:
                results[d.combination.id] = self._done(d, d.result("error", str(e)))
                continue
            results[d.combination.id] = self._write(d, text)
        return [results[d.combination.id] for d in members]

    def _existing_lock(self, d: _Decision, inputs: Mapping[str, Any]) -> tuple[str, Pylock] | None:
        """The lock already written for this combination, if it was made from the same inputs."""
        if self.settings.upgrade:
            return None
        path = self.settings.out_dir / lock_filename(d.combination.id)
        if not path.exists():
            return None
        text = path.read_text(encoding="utf-8")
        try:
            lock = read_lock(text, source=path)
        except PylockError:
            return None
        if tool_table(lock) == inputs:
            return text, lock
        return None

    def _write(self, d: _Decision, text: str, lock: Pylock | None = None) -> ResolvedCombination:
        out = self.settings.out_dir
        c = d.combination
        lock_path = out / lock_filename(c.id)
        req_path = out / f"requirements.{c.id}.txt"
        try:
            if lock is None:
                lock = read_lock(text, source=lock_path)
            requirements = lock_requirements(c.id, packages(lock), d.indexes)
            sha = write_atomic(lock_path, text)
            write_atomic(req_path, requirements)
        except (ClosureError, PylockError) as e:
            return self._done(d, d.result("error", str(e)))
        resolved = replace(
            d.result("resolved", _resolved_reason(d)),
            lock=_relative(lock_path, out),
            lock_sha256=sha,
            requirements=_relative(req_path, out),
        )
        return self._done(d, resolved)

    def resolve(self, combinations: Sequence[Combination]) -> list[ResolvedCombination]:
        """Resolve combinations; the result keeps the input order.

        Combinations of one torch/xformers pairing (typically its Python
        versions) go through together: their decisions run in parallel, then
        one uv resolution locks them all, while other pairings proceed.
        """
        if not combinations:
            return []
        pairings: dict[tuple[object, ...], list[Combination]] = {}
        for c in combinations:
            pairings.setdefault(_pairing_key(c), []).append(c)
        workers = max(1, min(self.settings.jobs, len(combinations)))
        answers: dict[str, ResolvedCombination] = {}
        with (
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="decide") as deciders,
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lock") as lockers,
        ):

            def pairing(members: list[Combination]) -> list[ResolvedCombination]:
                decided = list(deciders.map(self._decide_one, members))
                groups: dict[tuple[object, ...], list[_Decision]] = {}
                for d, answer in decided:
                    if answer is None:
                        groups.setdefault(_closure_key(d), []).append(d)
                locked = {r.id: r for g in groups.values() for r in self._lock_group(g)}
                return [answer or locked[d.combination.id] for d, answer in decided]

            for results in lockers.map(pairing, list(pairings.values())):
                answers.update((r.id, r) for r in results)
        return [answers[c.id] for c in combinations]


@functools.cache
def _target(python: str, platform: str) -> Target:
    """Targets are shared: their tag lists are long to compute."""
    return Target(python=python, platform=platform)


def _pairing_key(c: Combination) -> tuple[object, ...]:
    return (c.torch, c.xformers, c.cuda, c.torch_index, c.xformers_index, c.add_cuda_runtime)


def _dependencies(d: _Decision) -> list[str]:
    return list(dict.fromkeys(d.dependencies + d.extra_runtime))


def _pins(d: _Decision) -> list[PinnedFile]:
    assert d.torch is not None
    pinned = [_pinned("torch", d.torch.version, d.torch)]
    if d.xformers is not None:
        pinned.append(_pinned("xformers", d.xformers.version, d.xformers))
    return pinned


def _closure_key(d: _Decision) -> tuple[object, ...]:
    """Decisions with the same key are locked from one universal resolution."""
    return (tuple(sorted(set(d.raw_dependencies + d.extra_runtime))), tuple(d.indexes))


def _digest(requirements: Sequence[str]) -> str:
    """One uv cache per closure: parallel uv processes sharing one cache wait on its locks."""
    return hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]


def _python_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _pinned(name: str, version: str, chosen: ResolvedTorch | ResolvedXformers) -> PinnedFile:
    return PinnedFile(
        name=name,
        version=version,
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


def _relative(path: Path, out_dir: Path) -> str:
    """The path relative to the output's parent (docs/contracts.md), whatever the cwd."""
    return path.resolve().relative_to(out_dir.resolve().parent).as_posix()


def _nothing_fits(
    project: str,
    version: str,
    target: Target,
    spec: IndexSpec,
    url: str,
    files: list[DistributionFile],
    rejected: Sequence[Rejection],
) -> str:
    where = f"index {spec.name!r} ({url})"
    if not rejected:
        versions = sorted(
            {v for f in files if (v := _file_version(f.filename, project)) is not None}
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
