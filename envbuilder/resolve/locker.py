"""Locking decided combinations: uv's closure, the target's part, the pylock and requirements.

Decisions that share their requirements are locked from one universal uv
resolution; a combination whose existing lock was made from the same
inputs keeps it (unless ``upgrade``). Each lock is written as
``pylock.<id>.toml`` with its ``requirements.<id>.txt``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.pylock import Pylock

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

__all__ = ["LockSettings", "lock_group"]

Done = Callable[[Decision, ResolvedCombination], ResolvedCombination]
"""Called with each final answer as it is made (progress); returns the answer."""


@dataclass(frozen=True, kw_only=True)
class LockSettings:
    out_dir: Path
    cache_dir: Path
    uv: str
    offline: bool = False
    upgrade: bool = False
    ca_bundle: str | None = None


def lock_group(
    members: Sequence[Decision], settings: LockSettings, done: Done
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
            results[d.combination.id] = done(d, _write(d, *existing, out=settings.out_dir))
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
            cache_dir=settings.cache_dir / "uv" / _digest(requirements),
            uv=settings.uv,
            offline=settings.offline,
            ca_bundle=settings.ca_bundle,
        )
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
        results[d.combination.id] = done(d, _write(d, text, out=settings.out_dir))
    return [results[d.combination.id] for d in members]


def _existing_lock(
    d: Decision, inputs: Mapping[str, Any], settings: LockSettings
) -> tuple[str, Pylock] | None:
    """The lock already written for this combination, if it was made from the same inputs."""
    if settings.upgrade:
        return None
    path = settings.out_dir / lock_filename(d.combination.id)
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


def _write(d: Decision, text: str, lock: Pylock | None = None, *, out: Path) -> ResolvedCombination:
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
        return d.result("error", str(e))
    return replace(
        d.result("resolved", d.resolved_reason()),
        lock=_relative(lock_path, out),
        lock_sha256=sha,
        requirements=_relative(req_path, out),
    )


def _digest(requirements: Sequence[str]) -> str:
    """One uv cache per closure: parallel uv processes sharing one cache wait on its locks."""
    return hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]


def _python_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _relative(path: Path, out_dir: Path) -> str:
    """The path relative to the output's parent (docs/contracts.md), whatever the cwd."""
    return path.resolve().relative_to(out_dir.resolve().parent).as_posix()
