"""Locking decided combinations: uv's closure, the target's part, the pylock and requirements.

Decisions that share their requirements are locked from one universal uv
resolution; a combination whose existing lock was made from the same
inputs keeps it (unless ``upgrade``). Each lock is written as
``pylock.<id>.toml`` with its ``requirements.<id>.txt``.

The conformance suite's own dependencies (``[suite]`` in ``matrix.toml``,
e.g. diffusers) are a second group beside each lock, never part of it:
``pylock.<id>-suite.toml`` and ``requirements.<id>.suite.txt`` hold what the
suite needs beyond the combination's lock, resolved by one universal uv
run per pairing with each member's lock as constraints, so that a package
both need has the lock's version. A suite group is kept while its
requirements and the lock it was constrained by are unchanged.

Solved closures are content-addressed: each lock is also stored in the
cache under the digest of its inputs (the pinned torch/xformers files,
the target, the dependency requirements, the indexes and the resolver's
version), so that any ``--out`` with that cache (a CI job on a fresh
checkout with its cache restored) reuses it instead of running uv.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.pylock import Pylock
from packaging.version import Version

from envbuilder import __version__
from envbuilder.credentials import Credentials
from envbuilder.files import write_atomic
from envbuilder.index.relay import UvRelay
from envbuilder.model import (
    ResolvedCombination,
    build_lock_filename,
    legacy_build_lock_filename,
    suite_lock_filename,
    suite_requirements_filename,
)
from envbuilder.pylock import LockedPackage, PylockError, packages, read_lock, tool_table
from envbuilder.resolve.closure import (
    GENERATED_BY,
    ClosureError,
    PinnedFile,
    assembled_lock,
    compile_closure,
    lock_inputs,
    lock_requirements,
    remember_interpreter,
    select_for_target,
)
from envbuilder.resolve.decisions import Decision

__all__ = [
    "CLOSURE_FORMAT",
    "LockSettings",
    "SolvedClosures",
    "build_lock_filename",
    "closure_digest",
    "lock_build_group",
    "lock_group",
    "suite_inputs",
]

CLOSURE_FORMAT = 2
"""Changes whenever the same inputs would give another closure (2: a closure needing
another release of a pinned project is solved again for the pinned releases), so
that no closure cached by an older resolver is reused."""

Done = Callable[[Decision, ResolvedCombination], ResolvedCombination]
"""Called with each final answer as it is made (progress); returns the answer."""


@dataclass(frozen=True, kw_only=True)
class LockSettings:
    out_dir: Path
    cache_dir: Path
    uv: str
    python: str | None = None  # the interpreter uv builds with, rather than one it searches for
    uv_downloads: int | None = 2
    """Connections each uv run opens to an index host (its concurrent downloads) unless
    the environment says otherwise. uv's default (50) suits one process; the closures
    run many at once, and their connections add up to what an index or a proxy limits.
    Through the relay, where they reach loopback, at least `relay.UV_DOWNLOADS`."""
    offline: bool = False
    upgrade: bool = False
    suite: tuple[str, ...] = ()
    """The conformance suite's own requirements (``[suite]``), locked as a group beside
    each lock; none, no group."""
    ca_bundle: str | None = None
    credentials: Credentials = field(default_factory=Credentials)
    relay: UvRelay | None = None
    """Where uv reads the indexes from: each page and core metadata file fetched once per
    run for every uv process (`UvRelay`); none, uv asks the indexes itself."""


class SolvedClosures:
    """uv's answers in one run, by their exact inputs: pairings whose closures ask uv the
    same question (one torch with two xformers releases needing nothing more) run it once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[tuple[object, ...], threading.Lock] = {}
        self._answers: dict[tuple[object, ...], Pylock | ClosureError] = {}
        self._prepared = threading.Lock()
        self._preparations: set[str] = set()

    def once(self, name: str, prepare: Callable[[], None]) -> None:
        """Run ``prepare`` the first time ``name`` is asked for in this run; other callers
        wait for it to finish."""
        with self._prepared:
            if name not in self._preparations:
                self._preparations.add(name)
                prepare()

    def solve(self, key: tuple[object, ...], compute: Callable[[], Pylock]) -> Pylock:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._answers:
                try:
                    self._answers[key] = compute()
                except ClosureError as e:
                    self._answers[key] = e
            answer = self._answers[key]
        if isinstance(answer, ClosureError):
            raise answer
        return answer


def lock_group(
    members: Sequence[Decision],
    settings: LockSettings,
    done: Done,
    solved: SolvedClosures | None = None,
) -> list[ResolvedCombination]:
    """Lock decisions that share their requirements with one uv resolution.

    A member whose existing lock was made from the same inputs keeps it; the
    others take their part of one universal closure. Then each member's suite
    group (`_lock_suites`) is locked against its lock.
    """
    done = _locking_build_groups(done, settings, solved)
    results: dict[str, ResolvedCombination] = {}
    pending: list[tuple[Decision, list[PinnedFile], dict[str, Any]]] = []
    for d in members:
        pinned = d.pins()
        inputs = lock_inputs(d.closure_requirements(), d.target, d.indexes, pinned)
        existing = _existing_lock((settings.out_dir / d.combination.lock_file,), inputs, settings)
        if existing is not None:
            results[d.combination.id] = _write(d, *existing, inputs=inputs, settings=settings)
        elif settings.offline:
            results[d.combination.id] = d.result("error", _offline_miss(inputs, settings))
        else:
            pending.append((d, pinned, inputs))
    floor = min((d.target.python for d in members), key=_python_key)
    if pending and solved is not None:
        # New locks mean new suite and build groups: start their uv runs beside the locks'.
        early = [(tuple(settings.suite), floor, members[0].indexes)] if settings.suite else []
        early += [
            (tuple(d.source_build.build_requirements_in), d.target.python, d.indexes[:1])
            for d, _, _ in pending
            if d.source_build is not None
        ]
        for requirements, python, indexes in early:
            threading.Thread(
                target=_solve_quietly,
                args=(requirements, (), python, indexes, settings, solved),
                daemon=True,
            ).start()
    if pending:
        _lock_pending(pending, settings, solved, results)
    if settings.suite:
        _lock_suites(members, floor, settings, solved, results)
    return [done(d, results[d.combination.id]) for d in members]


def _lock_pending(
    pending: Sequence[tuple[Decision, list[PinnedFile], dict[str, Any]]],
    settings: LockSettings,
    solved: SolvedClosures | None,
    results: dict[str, ResolvedCombination],
) -> None:
    """Solve one universal closure for the members without a lock, and write each one's."""
    requirements = list(
        dict.fromkeys(r for d, _, _ in pending for r in d.raw_dependencies + d.extra_runtime)
    )
    floor = min((d.target.python for d, _, _ in pending), key=_python_key)
    indexes = pending[0][0].indexes
    pins = {p.name: p.version for _, pinned, _ in pending for p in pinned}

    def solve(constraints: tuple[str, ...]) -> Pylock:
        return _solve(requirements, constraints, floor, indexes, settings, solved)

    closure: Pylock | None = None
    failure = ""
    try:
        closure = solve(())
        if _needs_other_releases(closure, pins):
            # A dependency requires a pinned project back (triton 2.0.0 requires torch):
            # ask again for the pinned releases; uv names whatever cannot have them.
            closure = solve(tuple(f"{name}=={version}" for name, version in sorted(pins.items())))
    except ClosureError as e:
        failure = str(e)
    for d, pinned, inputs in pending:
        if closure is None:
            results[d.combination.id] = d.result("error", failure)
            continue
        try:
            text, lock = assembled_lock(
                select_for_target(closure, d.target), pinned=pinned, inputs=inputs, target=d.target
            )
        except ClosureError as e:
            results[d.combination.id] = d.result("error", str(e))
            continue
        results[d.combination.id] = _write(d, text, lock, inputs=inputs, settings=settings)


def _solve(
    requirements: Sequence[str],
    constraints: tuple[str, ...],
    floor: str,
    indexes: tuple[Any, ...],
    settings: LockSettings,
    solved: SolvedClosures | None,
) -> Pylock:
    def compute() -> Pylock:
        if solved is not None and settings.python is not None and not settings.offline:
            # The closures start together: have uv learn the interpreter once, not in each.
            python, cache = settings.python, settings.cache_dir / "uv"
            solved.once(
                "interpreter",
                lambda: remember_interpreter(uv=settings.uv, python=python, cache_dir=cache),
            )
        return compile_closure(
            requirements=requirements,
            constraints=constraints,
            python_floor=floor,
            indexes=indexes,
            cache_dir=settings.cache_dir / "uv",
            uv=settings.uv,
            python=settings.python,
            downloads=settings.uv_downloads,
            offline=settings.offline,
            ca_bundle=settings.ca_bundle,
            credentials=settings.credentials,
            relay=settings.relay,
        )

    if solved is None:
        return compute()
    return solved.solve((tuple(requirements), constraints, floor, indexes), compute)


def _solve_quietly(*args: Any) -> None:
    """`_solve` for its answer in ``solved`` only; a failure is stored there too."""
    with contextlib.suppress(ClosureError):
        _solve(*args)


def suite_inputs(d: Decision, lock_sha256: str, suite: Sequence[str]) -> dict[str, Any]:
    """What a suite group was computed from: it is kept while this is unchanged."""
    return {
        "generated-by": GENERATED_BY,
        "group": "suite",
        "requirements": list(suite),
        "lock-sha256": lock_sha256,
        "python": d.target.python,
        "platform": d.target.platform,
        "indexes": [f"{i.role} {i.url}" for i in d.indexes],
    }


_SuiteMember = tuple[Decision, tuple[LockedPackage, ...], dict[str, Any]]
"""A member whose suite group is to be solved: its decision, its lock's packages and the
group's inputs."""


def _lock_suites(
    members: Sequence[Decision],
    floor: str,
    settings: LockSettings,
    solved: SolvedClosures | None,
    results: dict[str, ResolvedCombination],
) -> None:
    """Lock each resolved member's suite group: kept when its inputs are unchanged; else
    the suite's own closure where it agrees with the member's lock; else taken from one
    universal uv run over the members' pythons, whose constraints pin every package of
    each member's lock for that member's Python. When that run fails, each member is
    asked alone, so that only the members that cannot have the suite fail."""
    pending = _suites_to_solve(members, settings, results)
    if not pending:
        return
    pending = _suites_alone(pending, floor, settings, solved, results)
    _suites_constrained(_one_python_each(pending), settings, solved, results)


def _suites_to_solve(
    members: Sequence[Decision],
    settings: LockSettings,
    results: dict[str, ResolvedCombination],
) -> list[_SuiteMember]:
    """The resolved members whose suite group must be solved; the others' answers (a group
    kept, an offline miss, a lock that cannot be read) go into ``results``."""
    pending: list[_SuiteMember] = []
    for d in members:
        r = results[d.combination.id]
        if r.status != "resolved" or r.lock_sha256 is None:
            continue
        inputs = suite_inputs(d, r.lock_sha256, settings.suite)
        existing = _existing_lock(
            (settings.out_dir / suite_lock_filename(d.combination.id),), inputs, settings
        )
        if existing is not None:
            results[d.combination.id] = _write_suite(
                d, r, *existing, settings=settings, inputs=inputs
            )
            continue
        if settings.offline:
            results[d.combination.id] = _suite_failed(d, settings, _offline_miss(inputs, settings))
            continue
        try:
            main = packages(read_lock(_lock_text(r, settings), source=r.lock or "its lock"))
        except (OSError, PylockError) as e:
            results[d.combination.id] = _suite_failed(d, settings, str(e))
            continue
        pending.append((d, main, inputs))
    return pending


def _suites_alone(
    pending: Sequence[_SuiteMember],
    floor: str,
    settings: LockSettings,
    solved: SolvedClosures | None,
    results: dict[str, ResolvedCombination],
) -> list[_SuiteMember]:
    """Write the groups the suite's own closure gives; return the members whose locks it
    disagrees with (all of them when it cannot be solved)."""
    # First the suite on its own, one uv run that pairings from the same Python floor
    # share: where what it shares with a member's lock has the lock's versions (the
    # newest, usually, on both sides), that member's group is its part beyond the lock.
    try:
        alone = _solve(settings.suite, (), floor, pending[0][0].indexes, settings, solved)
    except ClosureError:
        return list(pending)
    disagreeing = []
    for d, main, inputs in pending:
        try:
            group = _beyond(select_for_target(alone, d.target), main)
        except ClosureError:
            disagreeing.append((d, main, inputs))
            continue
        results[d.combination.id] = _suite_write(d, group, inputs, settings, results)
    return disagreeing


def _one_python_each(pending: Sequence[_SuiteMember]) -> list[list[_SuiteMember]]:
    """``pending`` in runs whose members' Pythons differ, in order: one uv run answers one
    Python per target; members sharing a Python (another platform) take another run."""
    runs: list[list[_SuiteMember]] = []
    for item in pending:
        run = next(
            (g for g in runs if all(o[0].target.python != item[0].target.python for o in g)), None
        )
        if run is None:
            runs.append([item])
        else:
            run.append(item)
    return runs


def _suites_constrained(
    runs: Sequence[Sequence[_SuiteMember]],
    settings: LockSettings,
    solved: SolvedClosures | None,
    results: dict[str, ResolvedCombination],
) -> None:
    """Solve each run's suite with its members' locks as constraints and write each
    member's group; a run of several that fails is asked again member by member."""
    queue = [list(run) for run in runs]
    while queue:
        run = queue.pop(0)
        constraints = tuple(
            f"{p.name}=={p.version} ; python_version == '{d.target.python}'"
            for d, main, _ in run
            for p in main
            if p.version is not None
        )
        floor = min((d.target.python for d, _, _ in run), key=_python_key)
        closure: Pylock | None = None
        failure = ""
        try:
            closure = _solve(
                settings.suite, constraints, floor, run[0][0].indexes, settings, solved
            )
        except ClosureError as e:
            failure = str(e)
            if len(run) > 1:
                # One Python's failure (a suite release requiring a newer Python) is that
                # member's alone: ask again for each.
                queue += [[item] for item in run]
                continue
        for d, main, inputs in run:
            cid = d.combination.id
            if closure is None:
                results[cid] = _suite_failed(d, settings, failure)
                continue
            try:
                group = _beyond(select_for_target(closure, d.target), main)
            except ClosureError as e:
                results[cid] = _suite_failed(d, settings, str(e))
                continue
            results[cid] = _suite_write(d, group, inputs, settings, results)


def _suite_write(
    d: Decision,
    group: Sequence[LockedPackage],
    inputs: Mapping[str, Any],
    settings: LockSettings,
    results: Mapping[str, ResolvedCombination],
) -> ResolvedCombination:
    try:
        text, lock = assembled_lock(group, pinned=(), inputs=inputs, target=d.target, group="suite")
    except ClosureError as e:
        return _suite_failed(d, settings, str(e))
    return _write_suite(d, results[d.combination.id], text, lock, settings=settings, inputs=inputs)


def _beyond(
    selected: Sequence[LockedPackage], main: Sequence[LockedPackage]
) -> list[LockedPackage]:
    """What the suite needs beyond the lock; a package both need must have the lock's version."""
    locked = {p.name: p.version for p in main}
    extra: list[LockedPackage] = []
    for p in selected:
        if p.name not in locked:
            extra.append(p)
        elif p.version is None or Version(p.version) != Version(locked[p.name] or "0"):
            raise ClosureError(
                f"the suite needs {p.name} {p.version}, but the lock has {p.name} {locked[p.name]}"
            )
    return extra


def _suite_failed(d: Decision, settings: LockSettings, message: str) -> ResolvedCombination:
    return d.result("error", f"suite group ({', '.join(settings.suite)}) not locked: {message}")


def _lock_text(r: ResolvedCombination, settings: LockSettings) -> str:
    assert r.lock is not None
    return (settings.out_dir.resolve().parent / r.lock).read_text(encoding="utf-8")


def _locking_build_groups(
    done: Done, settings: LockSettings, solved: SolvedClosures | None
) -> Done:
    """``done`` after locking the build group of each resolved source build."""

    def locked(d: Decision, result: ResolvedCombination) -> ResolvedCombination:
        if result.status == "resolved" and d.source_build is not None:
            result = lock_build_group(d, result, settings, solved)
        return done(d, result)

    return locked


def lock_build_group(
    d: Decision,
    result: ResolvedCombination,
    settings: LockSettings,
    solved: SolvedClosures | None = None,
) -> ResolvedCombination:
    """Lock a source build's build group for the target beside the combination's lock.

    The group (the sdist's build requirements with the CUDA compiler, headers
    and CCCL wheels) is resolved from the default index alone, and kept when
    its inputs are unchanged, like the combination's own lock. The answer's
    ``source_build`` gains the lock's paths and sha256 and the build key's
    inputs known before a build: the sdist, torch's wheel and the compiler's.
    """
    build = d.source_build
    assert build is not None and d.torch is not None
    c = d.combination
    indexes = d.indexes[:1]  # the default index: compiler wheels are never on a torch index
    inputs = {
        **lock_inputs(build.build_requirements_in, d.target, indexes),
        "group": "build",
    }
    out = settings.out_dir
    lock_path = out / build_lock_filename(c.id)
    legacy = out / legacy_build_lock_filename(c.id)  # renamed: PEP 751 allows no dot in <name>
    req_path = out / f"requirements.{c.id}.build.txt"
    kept: tuple[str, Pylock] | None = None
    if not settings.upgrade:
        for path in (lock_path, legacy, _cached_path(inputs, settings)):
            try:
                candidate = path.read_text(encoding="utf-8")
                found = read_lock(candidate, source=path)
                if tool_table(found) == inputs:
                    kept = candidate, found
                    break
            except (OSError, UnicodeDecodeError, PylockError):
                continue
    try:
        if kept is None:
            if settings.offline:
                return replace(result, status="error", reason=_offline_miss(inputs, settings))
            closure = _solve(
                tuple(build.build_requirements_in), (), d.target.python, indexes, settings, solved
            )
            kept = assembled_lock(
                select_for_target(closure, d.target), pinned=(), inputs=inputs, target=d.target
            )
        text, lock = kept
        locked = packages(lock)
        requirements = lock_requirements(f"{c.id} (build)", locked, indexes)
        sha = write_atomic(lock_path, text)
        write_atomic(req_path, requirements)
        legacy.unlink(missing_ok=True)
    except (ClosureError, PylockError) as e:
        return replace(result, status="error", reason=f"the build group: {e}")
    _store(_cached_path(inputs, settings), text)
    compiler = sorted(
        f"{p.name}=={p.version} sha256={p.archive.sha256}"
        for p in locked
        if p.archive is not None and p.name.startswith("nvidia-")
    )
    key_inputs = {
        "sdist_sha256": build.sdist.sha256,
        "torch_sha256": d.torch.sha256,
        "toolchain": compiler,
        "arch_list": list(build.arch_list),
        "flags": list(build.flags),
    }
    return replace(
        result,
        source_build=replace(
            build,
            build_lock=_relative(lock_path, out),
            build_lock_sha256=sha,
            build_requirements=_relative(req_path, out),
            key_inputs=key_inputs,
        ),
    )


def closure_digest(inputs: Mapping[str, Any]) -> str:
    """The cache key of a solved closure: its inputs and the resolver that solved it."""
    key = {"format": CLOSURE_FORMAT, "resolver": __version__, "inputs": inputs}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _cached_path(inputs: Mapping[str, Any], settings: LockSettings) -> Path:
    return settings.cache_dir / "closures" / f"{closure_digest(inputs)}.toml"


def _offline_miss(inputs: Mapping[str, Any], settings: LockSettings) -> str:
    return (
        f"offline: no closure for this combination in the cache "
        f"({_cached_path(inputs, settings)}); run once online to fill it"
    )


def _existing_lock(
    paths: Sequence[Path], inputs: Mapping[str, Any], settings: LockSettings
) -> tuple[str, Pylock] | None:
    """The lock made from the same inputs: the first of ``paths`` (in ``--out``), else the
    cache's."""
    if settings.upgrade:
        return None
    for path in (*paths, _cached_path(inputs, settings)):
        try:
            text = path.read_text(encoding="utf-8")
            lock = read_lock(text, source=path)
        except (OSError, UnicodeDecodeError, PylockError):
            continue
        if tool_table(lock) == inputs:
            return text, lock
    return None


def _write(
    d: Decision,
    text: str,
    lock: Pylock | None = None,
    *,
    inputs: Mapping[str, Any],
    settings: LockSettings,
) -> ResolvedCombination:
    c = d.combination
    out = settings.out_dir
    lock_path = out / c.lock_file
    req_path = out / c.requirements_file
    try:
        if lock is None:
            lock = read_lock(text, source=lock_path)
        requirements = lock_requirements(c.id, packages(lock), d.indexes)
        sha = write_atomic(lock_path, text)
        write_atomic(req_path, requirements)
    except (ClosureError, PylockError) as e:
        return d.result("error", str(e))
    _store(_cached_path(inputs, settings), text)
    return replace(
        d.result("resolved", d.resolved_reason()),
        lock=_relative(lock_path, out),
        lock_sha256=sha,
        requirements=_relative(req_path, out),
    )


def _write_suite(
    d: Decision,
    resolved: ResolvedCombination,
    text: str,
    lock: Pylock | None = None,
    *,
    settings: LockSettings,
    inputs: Mapping[str, Any],
) -> ResolvedCombination:
    """Write the suite group beside the lock; the answer names it."""
    c = d.combination
    out = settings.out_dir
    lock_path = out / suite_lock_filename(c.id)
    req_path = out / suite_requirements_filename(c.id)
    try:
        if lock is None:
            lock = read_lock(text, source=lock_path)
        requirements = lock_requirements(c.id, packages(lock), d.indexes, group="suite")
        sha = write_atomic(lock_path, text)
        write_atomic(req_path, requirements)
    except (ClosureError, PylockError) as e:
        return _suite_failed(d, settings, str(e))
    _store(_cached_path(inputs, settings), text)
    return replace(
        resolved,
        suite_lock=_relative(lock_path, out),
        suite_lock_sha256=sha,
        suite_requirements=_relative(req_path, out),
    )


def _store(path: Path, text: str) -> None:
    """Keep a solved closure in the cache; a cache that cannot be written only costs speed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError:
        pass


def _needs_other_releases(closure: Pylock, pins: Mapping[str, str]) -> bool:
    """Whether uv's closure holds a release of a pinned project other than the pinned one."""
    return any(
        p.name in pins and (p.version is None or p.version != Version(pins[p.name]))
        for p in closure.packages
    )


def _python_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _relative(path: Path, out_dir: Path) -> str:
    """The path relative to the output's parent (docs/contracts.md), whatever the cwd."""
    return path.resolve().relative_to(out_dir.resolve().parent).as_posix()
