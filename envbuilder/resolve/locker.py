"""Locking decided combinations: uv's closure, the target's part, the pylock and requirements.

Decisions that share their requirements are locked from one universal uv
resolution; a combination whose existing lock was made from the same
inputs keeps it (unless ``upgrade``). Each lock is written as
``pylock.<id>.toml`` with its ``requirements.<id>.txt``.

Solved closures are content-addressed: each lock is also stored in the
cache under the digest of its inputs (the pinned torch/xformers files,
the target, the dependency requirements, the indexes and the resolver's
version), so that any ``--out`` with that cache (a CI job on a fresh
checkout with its cache restored) reuses it instead of running uv.
"""

from __future__ import annotations

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
from envbuilder.model import ResolvedCombination, lock_filename
from envbuilder.pylock import PylockError, packages, read_lock, tool_table
from envbuilder.resolve.closure import (
    ClosureError,
    PinnedFile,
    assemble_lock,
    compile_closure,
    lock_inputs,
    lock_requirements,
    select_for_target,
)
from envbuilder.resolve.decisions import Decision

__all__ = ["CLOSURE_FORMAT", "LockSettings", "SolvedClosures", "closure_digest", "lock_group"]

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
    run many at once, and their connections add up to what an index or a proxy limits."""
    offline: bool = False
    upgrade: bool = False
    ca_bundle: str | None = None
    credentials: Credentials = field(default_factory=Credentials)


class SolvedClosures:
    """uv's answers in one run, by their exact inputs: pairings whose closures ask uv the
    same question (one torch with two xformers releases needing nothing more) run it once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[tuple[object, ...], threading.Lock] = {}
        self._answers: dict[tuple[object, ...], Pylock | ClosureError] = {}

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
    others take their part of one universal closure.
    """
    results: dict[str, ResolvedCombination] = {}
    pending: list[tuple[Decision, list[PinnedFile], dict[str, Any]]] = []
    for d in members:
        pinned = d.pins()
        inputs = lock_inputs(d.closure_requirements(), d.target, d.indexes, pinned)
        existing = _existing_lock(d, inputs, settings)
        if existing is not None:
            results[d.combination.id] = done(
                d, _write(d, *existing, inputs=inputs, settings=settings)
            )
        elif settings.offline:
            results[d.combination.id] = done(d, d.result("error", _offline_miss(inputs, settings)))
        else:
            pending.append((d, pinned, inputs))
    if not pending:
        return [results[d.combination.id] for d in members]
    requirements = list(
        dict.fromkeys(r for d, _, _ in pending for r in d.raw_dependencies + d.extra_runtime)
    )
    floor = min((d.target.python for d, _, _ in pending), key=_python_key)
    indexes = pending[0][0].indexes
    pins = {p.name: p.version for _, pinned, _ in pending for p in pinned}

    def solve(constraints: tuple[str, ...]) -> Pylock:
        def compute() -> Pylock:
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
            )

        if solved is None:
            return compute()
        return solved.solve((tuple(requirements), constraints, floor, indexes), compute)

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
            results[d.combination.id] = done(d, d.result("error", failure))
            continue
        try:
            text = assemble_lock(
                select_for_target(closure, d.target), pinned=pinned, inputs=inputs, target=d.target
            )
        except ClosureError as e:
            results[d.combination.id] = done(d, d.result("error", str(e)))
            continue
        results[d.combination.id] = done(d, _write(d, text, inputs=inputs, settings=settings))
    return [results[d.combination.id] for d in members]


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
    d: Decision, inputs: Mapping[str, Any], settings: LockSettings
) -> tuple[str, Pylock] | None:
    """The lock made from the same inputs: the one in ``--out``, else the cache's."""
    if settings.upgrade:
        return None
    for path in (
        settings.out_dir / lock_filename(d.combination.id),
        _cached_path(inputs, settings),
    ):
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
    lock_path = out / lock_filename(c.id)
    req_path = out / f"requirements.{c.id}.txt"
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
