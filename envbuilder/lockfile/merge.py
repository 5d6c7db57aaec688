"""Merging the resolution and conformance results into the lockfile (``envbuilder lock``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from envbuilder.errors import InputError
from envbuilder.files import sha256_file
from envbuilder.lockfile.drivers import (
    DRIVER_SOURCE,
    MINIMUM_DRIVER,
    minimum_driver,
    required_cuda,
)
from envbuilder.lockfile.host import platform_arch
from envbuilder.lockfile.model import (
    CompatLock,
    DriverTable,
    Entry,
    LockPointer,
    PackagePin,
    Run,
)
from envbuilder.lockfile.results import Rejected, accept, rejection_record
from envbuilder.lockfile.verdicts import (
    combination_use_verdicts,
    combination_verdict,
    gpu_verdicts,
    last_verified,
    overall,
)
from envbuilder.model import Resolution, ResolvedCombination

__all__ = ["GENERATED_BY", "build_lockfile", "read_pins"]

GENERATED_BY = "envbuilder lock (nox -s lock); generated, do not edit"


def _rel(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()


def read_pins(pylock: Path) -> tuple[PackagePin, ...]:
    """The packages a PEP 751 lock pins, with each wheel's filename and sha256."""
    from envbuilder.pylock import packages, read_lock

    pins = [
        PackagePin(
            name=package.name,
            version=package.version,
            marker=package.marker,
            wheels=tuple(sorted((w.filename, w.sha256 or "") for w in package.wheels)),
        )
        for package in packages(read_lock(pylock.read_bytes(), source=pylock), source=pylock)
    ]
    return tuple(sorted(pins, key=lambda p: (p.name, p.marker or "")))


def _without_url(record: Any) -> dict[str, Any] | None:
    """A resolver record minus download URLs (the pylock holds those)."""
    if record is None:
        return None
    data: dict[str, Any] = asdict(record)
    data.pop("url", None)
    return data


def _entry(
    combo: ResolvedCombination,
    runs: Sequence[Run],
    stale_runs: Sequence[Run],
    *,
    locks_base: Path,
    out_dir: Path,
) -> Entry:
    pointer: LockPointer | None = None
    pins: tuple[PackagePin, ...] = ()
    if combo.status == "resolved":
        if not combo.lock or not combo.lock_sha256:
            raise InputError(f"resolution: {combo.id!r} is resolved but names no lock file")
        pylock = locks_base / combo.lock
        try:
            digest = sha256_file(pylock)
        except FileNotFoundError as e:
            raise InputError(
                f"{pylock}: lock of {combo.id!r} not found; run `nox -s resolve`"
            ) from e
        if digest != combo.lock_sha256:
            raise InputError(
                f"{pylock}: sha256 {digest} is not the {combo.lock_sha256} that resolution.json "
                "records; the locks and the resolution disagree: run `nox -s resolve` again"
            )
        requirements = locks_base / combo.requirements if combo.requirements else None
        pointer = LockPointer(
            path=_rel(pylock, out_dir),
            sha256=digest,
            requirements=_rel(requirements, out_dir) if requirements else None,
        )
        pins = read_pins(pylock)
    gpus = gpu_verdicts(runs)
    last = last_verified(stale_runs)
    uses = combination_use_verdicts(
        status=combo.status, resolver_reason=combo.reason, gpus=gpus, last=last
    )
    # with runs, the worst use; without, one reason (the per-use ones may name several verdicts)
    verdict = (
        overall(uses)
        if gpus
        else combination_verdict(
            status=combo.status, resolver_reason=combo.reason, gpus=gpus, last=last
        )
    )
    torch, xformers = (
        (combo.requested.torch, combo.requested.xformers) if combo.requested else (None, None)
    )
    torch_build = _without_url(combo.torch)
    xformers_build = _without_url(combo.xformers)
    release = required_cuda(torch_build, xformers_build)
    return Entry(
        id=combo.id,
        python=combo.python,
        cuda=combo.cuda,
        platform=combo.platform,
        arch=platform_arch(combo.platform),
        cuda_release=release,
        minimum_driver=minimum_driver(release) if release else None,
        torch=combo.torch.version if combo.torch else torch,
        xformers=combo.xformers.version if combo.xformers else xformers,
        status=combo.status,
        resolver_reason=combo.reason,
        lock=pointer,
        packages=pins,
        torch_build=torch_build,
        xformers_build=xformers_build,
        extra_runtime=combo.extra_runtime,
        notes=combo.notes,
        runs=tuple(runs),
        stale_runs=tuple(stale_runs),
        last_verified=last,
        gpus=gpus,
        uses=uses,
        verdict=verdict,
    )


def build_lockfile(
    resolution: Resolution,
    *,
    resolution_path: Path,
    results: Sequence[Path],
    out: Path,
) -> tuple[CompatLock, list[Rejected]]:
    """Merge *resolution* and the *results* files into a lockfile to be written at *out*.

    Pure apart from reading the inputs; the caller decides what rejections mean
    and writes the file. Paths inside are relative to *out*'s directory.
    """
    out_dir = out.parent
    locks_base = resolution_path.parent.parent  # `lock` paths are relative to the output's parent
    combos: Mapping[str, ResolvedCombination] = resolution.by_id()
    accepted = accept(results, combos, base=out_dir)
    rejected = list(accepted.rejected)
    entries = tuple(
        _entry(
            c,
            accepted.current.get(c.id, ()),
            accepted.stale.get(c.id, ()),
            locks_base=locks_base,
            out_dir=out_dir,
        )
        for c in sorted(resolution.combinations, key=lambda c: c.id)
    )
    lock = CompatLock(
        generated_by=GENERATED_BY,
        resolution={
            "path": _rel(resolution_path, out_dir),
            "matrix": resolution.matrix,
            "matrix_sha256": resolution.matrix_sha256,
        },
        combinations=entries,
        drivers=DriverTable(source=DRIVER_SOURCE, minimum=MINIMUM_DRIVER),
        rejected_results=tuple(
            sorted((rejection_record(r, out_dir) for r in rejected), key=lambda r: r.file)
        ),
    )
    return lock, rejected
