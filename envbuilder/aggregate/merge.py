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
not in the resolution, in the matrix  anything                   where the previous
                                                                    lockfile had it
not in the resolution nor the matrix   anything                   in ``retired``
=====================================  =========================  ==========================

A run that resolved a selection of the matrix leaves the other rows out of its resolution;
they were not removed, so (given *matrix*, the ids the matrix holds now) their entries stay
as the previous lockfile had them, their runs checked and judged again (`kept_entry`). Only
a row the matrix no longer holds retires. Without *matrix*, a previous entry the resolution
does not name is an error, never a silent retirement.

(A results file read in this merge is checked harder: the cases `results.bind` names are
rejected.) A carried run of a combination in the resolution must pass the claim checks a
results file passes (`claims.run_problems`, with the current lock's versions when it binds
to it): one that fails them is dropped, with the reason (`DroppedRun`), never kept. A run
that is already in the previous lockfile (`results.run_identity`) is kept
once, as this merge's results file gives it; nothing else of the previous lockfile is
dropped. A combination no longer resolved becomes retired; a retired one resolved again
takes its runs back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from packaging.utils import canonicalize_name

from envbuilder.aggregate.claims import run_problems
from envbuilder.aggregate.results import (
    Accepted,
    Rejected,
    accept,
    bind,
    carried_source,
    rejection_record,
    run_identity,
    run_order,
)
from envbuilder.errors import InputError
from envbuilder.lockfile.canonical import content_sha256
from envbuilder.lockfile.drivers import (
    DRIVER_SOURCE,
    MINIMUM_DRIVER,
    minimum_driver,
    required_cuda,
)
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
from envbuilder.lockfile.sourcebuilds import source_build_entry
from envbuilder.lockfile.verdicts import (
    combination_use_verdicts,
    combination_verdict,
    gpu_verdicts,
    judge,
    rejudged_run,
)
from envbuilder.model import Resolution, ResolvedCombination, verified_lock
from envbuilder.target import platform_arch

__all__ = ["GENERATED_BY", "DroppedRun", "Merged", "build_lockfile", "merge", "read_pins"]

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
        digest = verified_lock(pylock, combo.lock_sha256)
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


def _carried(runs: Iterable[Run], sealed: str, out_dir: Path) -> tuple[Run, ...]:
    """*runs* of the previous lockfile (``content_sha256`` *sealed*) with a ``source`` that
    means something beside the new lockfile in *out_dir* (`results.carried_source`)."""
    return tuple(
        replace(r, source=carried_source(r, lockfile_sha256=sealed, base=out_dir)) for r in runs
    )


def _known(previous: CompatLock | None, out_dir: Path) -> dict[str, _Known]:
    if previous is None:
        return {}
    found: dict[str, _Known] = {}
    sealed = content_sha256(previous.to_json())
    records: list[Entry | RetiredEntry] = [*previous.combinations, *previous.retired]
    for record in records:
        runs = _carried(
            record.runs + (record.stale_runs if isinstance(record, Entry) else ()),
            sealed,
            out_dir,
        )
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
class DroppedRun:
    """A run of the previous lockfile left out: its environment contradicts its combination."""

    combination: str
    run: Run
    reason: str

    def __str__(self) -> str:
        return (
            f"{self.run.source} (a run of {self.combination!r} in the previous lockfile): "
            f"its environment is not that of {self.combination!r}: {self.reason}"
        )


@dataclass(frozen=True, kw_only=True)
class Merged:
    """A merge's lockfile, the results files it rejected, and what it kept from where."""

    lock: CompatLock
    rejected: list[Rejected]
    carried: int  # runs kept from the previous lockfile
    repeated: int  # runs of the previous lockfile given again (a results file of this merge)
    dropped: tuple[DroppedRun, ...] = ()  # runs of the previous lockfile left out
    unselected: tuple[str, ...] = ()  # rows kept as the previous lockfile had them


def _kept_entry(entry: Entry, dropped: list[DroppedRun]) -> tuple[Entry, int]:
    """A previous *entry* this merge did not resolve (a row not selected), its runs put
    through the claim checks again (failures go to *dropped*) and judged anew; and how
    many runs it keeps. Its lock pointer, pins and build stay as they were."""
    combo = entry.resolved
    kept: dict[str, list[Run]] = {"runs": [], "stale": []}
    for group, given in (("runs", entry.runs), ("stale", entry.stale_runs)):
        for run in given:
            problems = run_problems(run, combo, locked=None, built=None)
            if problems:
                dropped.append(
                    DroppedRun(combination=combo.id, run=run, reason="; ".join(problems))
                )
                continue
            kept[group].append(rejudged_run(run, combo.extra_runtime))
    runs = sorted(kept["runs"], key=run_order)
    stale = sorted(kept["stale"], key=run_order)
    judged = judge(status=combo.status, resolver_reason=combo.reason, runs=runs, stale_runs=stale)
    last = judged.last
    if runs:
        lock_sha256 = entry.lock.sha256 if entry.lock is not None else None
        last = _evidence(runs, lock_sha256, judged.verdict, judged.uses)
    again = replace(
        entry,
        runs=tuple(runs),
        stale_runs=tuple(stale),
        last_verified=last,
        gpus=judged.gpus,
        uses=judged.uses,
        verdict=judged.verdict,
    )
    return again, len(runs) + len(stale)


@dataclass(frozen=True, kw_only=True)
class _Inputs:
    """Where a merge's files are, and what each combination of its resolution locks and builds."""

    out_dir: Path  # the lockfile's directory: paths inside it are relative to this
    locks_base: Path  # the resolution's `lock` paths are relative to this
    locked: Mapping[str, Mapping[str, str]]  # per combination id, its lock's versions
    builds: Mapping[str, SourceBuildEntry | None]  # per combination id, its source build
    built: Mapping[str, Mapping[str, str]]  # per combination id, its wheel's libraries' sha256


def _inputs(
    combos: Mapping[str, ResolvedCombination],
    *,
    resolution_path: Path,
    out: Path,
    build_records: Sequence[Path],
) -> _Inputs:
    """What the claim checks and the entries need of *combos*' locks and source builds."""
    out_dir = out.parent
    locks_base = resolution_path.parent.parent  # `lock` paths are relative to the output's parent
    locked = {
        c.id: _locked_versions(locks_base / c.lock)
        for c in combos.values()
        if c.status == "resolved" and c.lock
    }
    builds = {
        c.id: source_build_entry(c, build_records, relative_to=out_dir) for c in combos.values()
    }
    built = {cid: dict(b.wheel_libraries) for cid, b in builds.items() if b and b.wheel_libraries}
    return _Inputs(
        out_dir=out_dir, locks_base=locks_base, locked=locked, builds=builds, built=built
    )


def _resolved_entries(
    resolution: Resolution,
    accepted: Accepted,
    known: Mapping[str, _Known],
    inputs: _Inputs,
    dropped: list[DroppedRun],
) -> tuple[list[Entry], int]:
    """An entry per combination of *resolution*, by id: its runs from this merge's results
    files, and those of the previous lockfile (*known*) not already among them, each bound
    to its current lock or an older one (the module's table) once it passes the claim
    checks (failures go to *dropped*); and how many runs it kept from the previous lockfile."""
    locked, built = inputs.locked, inputs.built
    carried = 0
    entries: list[Entry] = []
    for combo in sorted(resolution.combinations, key=lambda c: c.id):
        current = list(accepted.current.get(combo.id, ()))
        stale = list(accepted.stale.get(combo.id, ()))
        earlier = known.get(combo.id)
        for run in _new_to(combo.id, current + stale, earlier.runs if earlier else ()):
            try:
                binding = bind(run.lock_sha256, combo)
            except ValueError:  # tied to no lock this combination can have now: history
                binding = "stale"
            on_lock = binding == "current"
            problems = run_problems(
                run,
                combo,
                locked=locked.get(combo.id) if on_lock else None,
                built=built.get(combo.id) if on_lock else None,
            )
            if problems:
                dropped.append(
                    DroppedRun(combination=combo.id, run=run, reason="; ".join(problems))
                )
                continue
            carried += 1
            (current if on_lock else stale).append(rejudged_run(run, combo.extra_runtime))
        entries.append(
            _entry(
                combo,
                sorted(current, key=run_order),
                sorted(stale, key=run_order),
                locks_base=inputs.locks_base,
                out_dir=inputs.out_dir,
                source_build=inputs.builds[combo.id],
            )
        )
    return entries, carried


def _unselected_entries(
    unselected: Sequence[Entry],
    previous: CompatLock | None,
    out_dir: Path,
    dropped: list[DroppedRun],
) -> tuple[list[Entry], int]:
    """The previous lockfile's *unselected* entries carried beside the new lockfile in
    *out_dir* and kept (`_kept_entry`: failures go to *dropped*); and how many runs they keep."""
    sealed = content_sha256(previous.to_json()) if previous is not None else ""
    carried = 0
    entries: list[Entry] = []
    for entry in unselected:
        carried_entry = replace(
            entry,
            runs=_carried(entry.runs, sealed, out_dir),
            stale_runs=_carried(entry.stale_runs, sealed, out_dir),
        )
        again, count = _kept_entry(carried_entry, dropped)
        carried += count
        entries.append(again)
    return entries, carried


def _retired_entries(
    accepted: Accepted, known: Mapping[str, _Known], placed: Set[str]
) -> tuple[list[RetiredEntry], int]:
    """A retired entry per combination id with runs, from this merge's results files or the
    previous lockfile (*known*), that has no entry (not in *placed*); and how many runs they
    kept from the previous lockfile."""
    carried = 0
    retired: list[RetiredEntry] = []
    for cid in sorted((set(accepted.retired) | set(known)) - placed):
        fresh = list(accepted.retired.get(cid, ()))
        earlier = known.get(cid)
        kept = _new_to(cid, fresh, earlier.runs if earlier else ())
        carried += len(kept)
        retired.append(_retired(cid, fresh + kept, earlier))
    return retired, carried


def _lockfile(
    resolution: Resolution,
    *,
    resolution_path: Path,
    out_dir: Path,
    entries: Iterable[Entry],
    retired: Sequence[RetiredEntry],
    rejected: Iterable[Rejected],
) -> CompatLock:
    """The lockfile of these *entries* (in id order), *retired* ones and *rejected* files."""
    return CompatLock(
        generated_by=GENERATED_BY,
        resolution={
            "path": _rel(resolution_path, out_dir),
            "matrix": resolution.matrix,
            "matrix_sha256": resolution.matrix_sha256,
        },
        combinations=tuple(sorted(entries, key=lambda e: e.id)),
        drivers=DriverTable(source=DRIVER_SOURCE, minimum=MINIMUM_DRIVER),
        rejected_results=tuple(
            sorted((rejection_record(r, out_dir) for r in rejected), key=lambda r: r.file)
        ),
        retired=tuple(retired),
    )


def merge(
    resolution: Resolution,
    *,
    resolution_path: Path,
    results: Sequence[Path],
    out: Path,
    previous: CompatLock | None = None,
    build_records: Sequence[Path] = (),
    matrix: frozenset[str] | None = None,
) -> Merged:
    """Merge *resolution*, the *results* files and the *previous* lockfile's runs into a
    lockfile to be written at *out* (the module's table says where each run goes; *matrix*
    is the ids the matrix holds, which tells a row not selected from one removed).

    Pure apart from reading the inputs; the caller decides what rejections mean
    and writes the file. Paths inside are relative to *out*'s directory; a carried
    run's source names the lockfile its path is relative to (`results.carried_source`). A source build's record is the first
    ``build-record.<id>.json`` found in *build_records* (`sourcebuilds`).
    """
    combos: Mapping[str, ResolvedCombination] = resolution.by_id()
    inputs = _inputs(combos, resolution_path=resolution_path, out=out, build_records=build_records)
    out_dir = inputs.out_dir
    accepted = accept(results, combos, base=out_dir, locked=inputs.locked, built=inputs.built)
    known = _known(previous, out_dir)
    dropped: list[DroppedRun] = []
    entries, carried = _resolved_entries(resolution, accepted, known, inputs, dropped)
    unselected = _unselected(previous, combos, matrix)
    kept, kept_runs = _unselected_entries(unselected, previous, out_dir, dropped)
    left = {e.id for e in unselected}
    retired, retired_runs = _retired_entries(accepted, known, set(combos) | left)
    carried += kept_runs + retired_runs
    lock = _lockfile(
        resolution,
        resolution_path=resolution_path,
        out_dir=out_dir,
        entries=[*entries, *kept],
        retired=retired,
        rejected=accepted.rejected,
    )
    return Merged(
        lock=lock,
        rejected=list(accepted.rejected),
        carried=carried,
        repeated=sum(len(k.runs) for k in known.values()) - carried - len(dropped),
        dropped=tuple(dropped),
        unselected=tuple(sorted(left)),
    )


def _unselected(
    previous: CompatLock | None,
    combos: Mapping[str, ResolvedCombination],
    matrix: frozenset[str] | None,
) -> list[Entry]:
    """The previous lockfile's entries of rows the matrix still holds but this resolution
    does not name (not selected this time); an error when *matrix* is unknown."""
    if previous is None:
        return []
    absent = [e for e in previous.combinations if e.id not in combos]
    if matrix is None:
        if absent:
            names = ", ".join(sorted({e.id for e in absent}))
            raise InputError(
                f"the previous lockfile has combination(s) this resolution does not name "
                f"({names}); without the matrix, a row not selected cannot be told from one "
                "removed: pass the matrix (--matrix) so that only removed rows retire"
            )
        return []
    seen: set[str] = set()
    kept: list[Entry] = []
    for entry in absent:
        if entry.id in matrix and entry.id not in seen:
            seen.add(entry.id)
            kept.append(entry)
    return kept


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
