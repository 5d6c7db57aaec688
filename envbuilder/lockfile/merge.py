"""Merging the resolution and conformance results into the lockfile (``envbuilder lock``).

Evidence accumulates: the merge can start from the previous lockfile (``--previous``), whose
runs, stale runs and retired combinations are carried into the new one. Every run, carried
or read from a results file, is judged anew from its checks, and bound to where it belongs
now:

=====================================  =========================  ==========================
the run's combination                  the run's ``lock_sha256``  the run is kept
=====================================  =========================  ==========================
in the resolution, resolved            the current lock's         in ``runs``: it counts
in the resolution, resolved            another one, or null       in ``stale_runs``
in the resolution, unsatisfiable       null                       in ``runs`` (evidence for
                                                                    the resolver's reason)
in the resolution, otherwise           anything                   in ``stale_runs``
not in the resolution                  anything                   in ``retired``
=====================================  =========================  ==========================

(A results file read in this merge is checked harder: the cases `results.bind` names are
rejected.) A run that is already in the previous lockfile (`results.run_identity`) is kept
once, as this merge's results file gives it; nothing else of the previous lockfile is
dropped. A combination no longer resolved becomes retired; a retired one resolved again
takes its runs back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from packaging.utils import canonicalize_name

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
    LastVerified,
    LockPointer,
    PackagePin,
    RetiredEntry,
    Run,
    SourceBuildEntry,
    UseVerdict,
    Verdict,
)
from envbuilder.lockfile.results import (
    Rejected,
    accept,
    bind,
    rejection_record,
    run_identity,
    run_order,
)
from envbuilder.lockfile.sourcebuilds import source_build_entry
from envbuilder.lockfile.verdicts import (
    combination_use_verdicts,
    combination_verdict,
    gpu_verdicts,
    judge,
    rejudged_run,
)
from envbuilder.model import Resolution, ResolvedCombination

__all__ = ["GENERATED_BY", "Merged", "build_lockfile", "merge", "read_pins"]

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


def _locked_versions(pylock: Path) -> dict[str, str]:
    """Each package's version in a lock, for the packages it pins one version of; empty when
    the lock cannot be read (building its entry then says why)."""
    try:
        pins = read_pins(pylock)
    except (OSError, InputError):
        return {}
    versions: dict[str, set[str]] = {}
    for pin in pins:
        if pin.version:
            versions.setdefault(canonicalize_name(pin.name), set()).add(pin.version)
    return {name: next(iter(v)) for name, v in versions.items() if len(v) == 1}


def _age_key(run: Run) -> tuple[float, str, str]:
    """Runs by when they finished (as times, not text), then by content: the last is newest."""
    try:
        moment: datetime | None = datetime.fromisoformat(run.finished)
    except ValueError:
        moment = None
    stamp = moment.astimezone(UTC).timestamp() if moment and moment.tzinfo else float("-inf")
    return (stamp, run.finished, run.source_sha256)


def _evidence(
    runs: Sequence[Run], lock_sha256: str | None, verdict: Verdict, uses: tuple[UseVerdict, ...]
) -> LastVerified:
    """*runs* (on one lock) as dated evidence: the newest one's date and suite."""
    newest = max(runs, key=_age_key)
    return LastVerified(
        lock_sha256=lock_sha256,
        date=newest.date,
        suite_version=newest.suite_version,
        verdict=verdict,
        uses=uses,
        runs=tuple(r.source for r in runs),
    )


def _entry(
    combo: ResolvedCombination,
    runs: Sequence[Run],
    stale_runs: Sequence[Run],
    *,
    locks_base: Path,
    out_dir: Path,
    source_build: SourceBuildEntry | None = None,
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
    judged = judge(
        status=combo.status, resolver_reason=combo.reason, runs=runs, stale_runs=stale_runs
    )
    gpus, uses, verdict, last = judged.gpus, judged.uses, judged.verdict, judged.last
    if runs:  # the verdict is made of them: they date it
        lock_sha256 = combo.lock_sha256 if combo.status == "resolved" else None
        last = _evidence(runs, lock_sha256, verdict, uses)
    release = required_cuda(
        combo.torch.cuda if combo.torch else None,
        combo.xformers.built_with.cuda if combo.xformers else None,
    )
    return Entry(
        resolved=combo,
        arch=platform_arch(combo.platform),
        cuda_release=release,
        minimum_driver=minimum_driver(release) if release else None,
        lock=pointer,
        packages=pins,
        runs=tuple(runs),
        stale_runs=tuple(stale_runs),
        last_verified=last,
        gpus=gpus,
        uses=uses,
        verdict=verdict,
        source_build=source_build,
    )


@dataclass(frozen=True, kw_only=True)
class _Known:
    """What the previous lockfile holds for one combination id (an entry or a retired one)."""

    runs: tuple[Run, ...]  # current, stale and retired alike: they are bound anew
    python: str | None
    cuda: str | None
    platform: str | None
    torch: str | None
    xformers: str | None
    extra_runtime: tuple[str, ...]


def _known(previous: CompatLock | None) -> dict[str, _Known]:
    if previous is None:
        return {}
    found: dict[str, _Known] = {}
    records: list[Entry | RetiredEntry] = [*previous.combinations, *previous.retired]
    for record in records:
        runs = record.runs + (record.stale_runs if isinstance(record, Entry) else ())
        earlier = found.get(record.id)
        if earlier is not None:  # listed twice: keep both lists of runs
            found[record.id] = replace(earlier, runs=earlier.runs + runs)
        elif runs:
            found[record.id] = _Known(
                runs=runs,
                python=record.python,
                cuda=record.cuda,
                platform=record.platform,
                torch=record.torch,
                xformers=record.xformers,
                extra_runtime=record.extra_runtime,
            )
    return found


def _new_to(combination: str, fresh: Iterable[Run], carried: Iterable[Run]) -> list[Run]:
    """The *carried* runs that are not already among *fresh* (nor repeated among themselves)."""
    taken = {run_identity(combination, r) for r in fresh}
    kept: list[Run] = []
    for run in carried:
        identity = run_identity(combination, run)
        if identity not in taken:
            taken.add(identity)
            kept.append(run)
    return kept


def _retired(combination: str, runs: Sequence[Run], known: _Known | None) -> RetiredEntry:
    """A combination no longer resolved: all its *runs*, dated by its newest lock's."""
    extra_runtime = known.extra_runtime if known else ()
    judged = sorted((rejudged_run(r, extra_runtime) for r in runs), key=run_order)
    newest = max(judged, key=_age_key)
    mine = [r for r in judged if r.lock_sha256 == newest.lock_sha256]
    gpus = gpu_verdicts(mine)
    verdict = combination_verdict(status="resolved", resolver_reason="", gpus=gpus)
    uses = combination_use_verdicts(status="resolved", resolver_reason="", gpus=gpus)
    return RetiredEntry(
        id=combination,
        python=known.python if known else None,
        cuda=known.cuda if known else None,
        platform=known.platform if known else None,
        torch=known.torch if known else None,
        xformers=known.xformers if known else None,
        extra_runtime=extra_runtime,
        runs=tuple(judged),
        last_verified=_evidence(mine, newest.lock_sha256, verdict, uses),
    )


@dataclass(frozen=True, kw_only=True)
class Merged:
    """A merge's lockfile, the results files it rejected, and what it kept from where."""

    lock: CompatLock
    rejected: list[Rejected]
    carried: int  # runs kept from the previous lockfile
    repeated: int  # runs of the previous lockfile given again (a results file of this merge)


def merge(
    resolution: Resolution,
    *,
    resolution_path: Path,
    results: Sequence[Path],
    out: Path,
    previous: CompatLock | None = None,
    build_records: Sequence[Path] = (),
) -> Merged:
    """Merge *resolution*, the *results* files and the *previous* lockfile's runs into a
    lockfile to be written at *out* (the module's table says where each run goes).

    Pure apart from reading the inputs; the caller decides what rejections mean
    and writes the file. Paths inside are relative to *out*'s directory; a carried
    run keeps the source its lockfile recorded. A source build's record is the first
    ``build-record.<id>.json`` found in *build_records* (`sourcebuilds`).
    """
    out_dir = out.parent
    locks_base = resolution_path.parent.parent  # `lock` paths are relative to the output's parent
    combos: Mapping[str, ResolvedCombination] = resolution.by_id()
    locked = {
        c.id: _locked_versions(locks_base / c.lock)
        for c in combos.values()
        if c.status == "resolved" and c.lock
    }
    builds = {
        c.id: source_build_entry(c, build_records, relative_to=out_dir) for c in combos.values()
    }
    built = {cid: dict(b.wheel_libraries) for cid, b in builds.items() if b and b.wheel_libraries}
    accepted = accept(results, combos, base=out_dir, locked=locked, built=built)
    known = _known(previous)
    carried = 0
    entries: list[Entry] = []
    for combo in sorted(resolution.combinations, key=lambda c: c.id):
        current = list(accepted.current.get(combo.id, ()))
        stale = list(accepted.stale.get(combo.id, ()))
        earlier = known.get(combo.id)
        for run in _new_to(combo.id, current + stale, earlier.runs if earlier else ()):
            carried += 1
            try:
                binding = bind(run.lock_sha256, combo)
            except ValueError:  # tied to no lock this combination can have now: history
                binding = "stale"
            (current if binding == "current" else stale).append(
                rejudged_run(run, combo.extra_runtime)
            )
        entries.append(
            _entry(
                combo,
                sorted(current, key=run_order),
                sorted(stale, key=run_order),
                locks_base=locks_base,
                out_dir=out_dir,
                source_build=builds[combo.id],
            )
        )
    retired: list[RetiredEntry] = []
    for cid in sorted((set(accepted.retired) | set(known)) - set(combos)):
        fresh = list(accepted.retired.get(cid, ()))
        earlier = known.get(cid)
        kept = _new_to(cid, fresh, earlier.runs if earlier else ())
        carried += len(kept)
        retired.append(_retired(cid, fresh + kept, earlier))
    lock = CompatLock(
        generated_by=GENERATED_BY,
        resolution={
            "path": _rel(resolution_path, out_dir),
            "matrix": resolution.matrix,
            "matrix_sha256": resolution.matrix_sha256,
        },
        combinations=tuple(entries),
        drivers=DriverTable(source=DRIVER_SOURCE, minimum=MINIMUM_DRIVER),
        rejected_results=tuple(
            sorted((rejection_record(r, out_dir) for r in accepted.rejected), key=lambda r: r.file)
        ),
        retired=tuple(retired),
    )
    return Merged(
        lock=lock,
        rejected=list(accepted.rejected),
        carried=carried,
        repeated=sum(len(k.runs) for k in known.values()) - carried,
    )


def build_lockfile(
    resolution: Resolution,
    *,
    resolution_path: Path,
    results: Sequence[Path],
    out: Path,
    previous: CompatLock | None = None,
) -> tuple[CompatLock, list[Rejected]]:
    """`merge`'s lockfile and rejections."""
    merged = merge(
        resolution, resolution_path=resolution_path, results=results, out=out, previous=previous
    )
    return merged.lock, merged.rejected
