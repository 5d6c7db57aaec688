"""``envbuilder lock``: merge the resolution and conformance results into the lockfile."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envbuilder.aggregate.merge import Merged
    from envbuilder.lockfile.model import CompatLock
    from envbuilder.model import Resolution
    from envbuilder.reporter import Reporter
    from envbuilder.settings import Settings

HELP = "merge resolution and conformance results into the compatibility lockfile"


def configure(parser: argparse.ArgumentParser) -> None:
    _add_inputs(parser)
    parser.add_argument(
        "-o",
        "--out",
        type=Path,
        default=Path("compat.lock.json"),
        metavar="FILE",
        help="the lockfile to write (default: compat.lock.json)",
    )
    _add_source_build_options(parser)
    parser.add_argument(
        "--skip-rejected",
        action="store_true",
        help="write the lockfile even when results files are rejected (they are listed in it)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when the lockfile on disk is not what the inputs give",
    )


def _add_inputs(parser: argparse.ArgumentParser) -> None:
    """What is merged: the resolution, the results, the previous lockfile and the matrix."""
    parser.add_argument(
        "--resolution",
        type=Path,
        default=Path("locks/resolution.json"),
        metavar="FILE",
        help="the resolver's output (default: locks/resolution.json)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        nargs="*",
        action="extend",
        default=None,
        metavar="PATH",
        help="results files or directories of *.json; repeatable, every one is read "
        "(default: results/ when it exists)",
    )
    parser.add_argument(
        "--previous",
        default=None,
        metavar="FILE|URL",
        help="start from this lockfile (the last published one, or its https URL): its runs "
        "of combinations this merge does not measure are kept, as current while their lock "
        "is unchanged, as stale evidence otherwise; its retired combinations stay retired",
    )
    parser.add_argument(
        "--matrix",
        type=Path,
        default=None,
        metavar="FILE",
        help="the matrix whose rows are kept: a previous entry the resolution does not name "
        "(not selected this time) stays as it was unless the matrix no longer holds it, then "
        "it retires (default: the matrix the resolution names, when that file exists)",
    )


def _add_source_build_options(parser: argparse.ArgumentParser) -> None:
    """Where the records of source builds are read, and where their wheels are gathered."""
    parser.add_argument(
        "--build-records",
        type=Path,
        nargs="*",
        action="extend",
        default=None,
        metavar="DIR",
        help="directories holding build-record.<id>.json of source builds, first found wins; "
        "repeatable (default: the resolution's directory, where build-wheel writes them, then "
        "results/build-records/, where the records of measured wheels are committed)",
    )
    parser.add_argument(
        "--release-wheels",
        type=Path,
        default=None,
        metavar="DIR",
        help="the release's wheel assets: after writing, every built wheel the lockfile's build "
        "records name must be here with its recorded sha256, this run's builds or copied from "
        "--earlier-wheels; exit 1 when one is found nowhere",
    )
    parser.add_argument(
        "--earlier-wheels",
        type=Path,
        default=None,
        metavar="DIR",
        help="the previous release's wheel assets, for --release-wheels: the wheels this run "
        "did not rebuild are copied from here, their sha256 checked",
    )


def _previous(value: str | None, settings: Settings) -> CompatLock | None:
    """The lockfile ``--previous`` names, read and its content hash checked (None: none)."""
    from envbuilder.consumer.published import is_url, lockfile_argument
    from envbuilder.errors import InputError
    from envbuilder.lockfile.read import load_lockfile

    if value is None:
        return None
    if not is_url(value) and not Path(value).is_file():
        raise InputError(
            f"--previous {value}: no such file; give the last published lockfile (a file or "
            "its https URL), or leave --previous out to start from the results alone"
        )
    path = lockfile_argument(value, settings, option="--previous")
    try:
        return load_lockfile(path)
    except InputError as e:
        raise InputError(f"--previous: {e}") from e


def _matrix_ids(value: Path | None, resolution: Resolution) -> frozenset[str] | None:
    """The ids of the matrix's rows (``--matrix``, else the resolution's matrix when that file
    exists); None when neither is there."""
    from envbuilder.resolve.matrix import load_matrix

    path = value if value is not None else Path(resolution.matrix)
    if value is None and not path.is_file():
        return None
    return frozenset(c.id for c in load_matrix(path).combinations)


def run(args: argparse.Namespace) -> int:
    from envbuilder.aggregate.merge import merge
    from envbuilder.lockfile.canonical import seal
    from envbuilder.model import load_resolution
    from envbuilder.reporter import Reporter

    report = Reporter(verbose=args.verbose)
    resolution = load_resolution(args.resolution)
    files = _results_files(args.results)
    previous = _previous(args.previous, args.settings)
    merged = merge(
        resolution,
        resolution_path=args.resolution,
        results=files,
        out=args.out,
        previous=previous,
        build_records=_build_record_dirs(args.build_records, args.resolution),
        matrix=_matrix_ids(args.matrix, resolution),
    )
    _refuse_rejected(merged, files, args, report)
    lock = merged.lock
    data = seal(lock.to_json())
    _report_entries(lock, report)
    counts = Counter(e.verdict.verdict for e in lock.combinations)
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    if args.check:
        return _check(args.out, data, summary, report)
    _write(args.out, data)
    report.line(_written(args, merged, len(files), summary))
    if args.release_wheels is not None:
        return _release_wheels(lock, args.release_wheels, args.earlier_wheels, report)
    return 0


def _results_files(paths: list[Path] | None) -> list[Path]:
    """Every results file under *paths* (default: ``results/`` when it exists), each once;
    a path that does not exist is bad input."""
    from envbuilder.aggregate.results import find_results
    from envbuilder.errors import InputError

    if paths is None:
        paths = [Path("results")] if Path("results").is_dir() else []
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise InputError(f"results path(s) not found: {', '.join(map(str, missing))}")
    return sorted(set(find_results(paths)))  # a path named twice is one file


def _build_record_dirs(given: list[Path] | None, resolution: Path) -> list[Path]:
    """``--build-records``, each an existing directory; by default the resolution's
    directory, then the committed records of measured wheels."""
    from envbuilder.errors import InputError

    if given is None:
        from envbuilder.lockfile.sourcebuilds import BUILD_RECORDS_DIR

        return [resolution.parent, BUILD_RECORDS_DIR]
    missing = [p for p in given if not p.is_dir()]
    if missing:
        raise InputError(f"--build-records: no such directory: {', '.join(map(str, missing))}")
    return given


def _refuse_rejected(
    merged: Merged, files: list[Path], args: argparse.Namespace, report: Reporter
) -> None:
    """List the rejected results files and the dropped runs; stop, writing nothing, when a
    file was rejected unless ``--skip-rejected`` records them and goes on."""
    from envbuilder.errors import InputError
    from envbuilder.textsafe import one_line

    for r in merged.rejected:
        report.line(f"✕ rejected {one_line(str(r))}")
    for d in merged.dropped:
        report.line(f"✕ dropped {one_line(str(d))}")
    if merged.rejected and not args.skip_rejected:
        raise InputError(
            f"{len(merged.rejected)} of {len(files)} results file(s) rejected (listed above); "
            f"nothing written. Fix or remove them, or pass --skip-rejected to record them in "
            f"{args.out} and go on"
        )


def _report_entries(lock: CompatLock, report: Reporter) -> None:
    """One line per combination with its verdict (per use where the uses differ, its stale
    evidence, its source build), its reason with -v, then the retired combinations."""
    from envbuilder.textsafe import one_line

    for entry in lock.combinations:
        flag = " (conflicting results)" if any(g.conflict for g in entry.gpus) else ""
        report.line(f"  {entry.verdict.verdict:<25} {entry.id}{flag}")
        if len({u.verdict.verdict for u in entry.uses}) > 1:
            per_use = ", ".join(f"{u.use} {u.verdict.verdict}" for u in entry.uses)
            report.line(f"  {'':<25} per use: {per_use}")
        if entry.stale_runs and not entry.runs and entry.last_verified:
            described = one_line(entry.last_verified.describe())
            report.line(f"  {'':<25} stale evidence: {described}")
        if entry.source_build is not None:
            from envbuilder.lockfile.sourcebuilds import describe

            report.line(f"  {'':<25} {describe(entry.source_build, entry.id)}")
        report.detail(one_line(entry.verdict.reason))  # GPU names and reasons from results
    for record in lock.retired:
        report.line(f"  {'retired':<25} {record.id}: {record.last_verified.describe()}")


def _check(out: Path, data: bytes, summary: str, report: Reporter) -> int:
    """``--check``: 0 when *out* holds *data* byte for byte, else 1; nothing is written."""
    current = out.read_bytes() if out.exists() else b""
    if current != data:
        report.line(f"✕ {out} is out of date ({summary}); run `nox -s lock`")
        return 1
    report.line(f"✓ {out} is up to date")
    return 0


def _write(out: Path, data: bytes) -> None:
    """*data* to *out* atomically; a failure says that nothing was changed."""
    from envbuilder.errors import OutputError
    from envbuilder.files import write_atomic

    try:
        write_atomic(out, data)
    except OSError as e:
        raise OutputError(
            f"cannot write {out} ({e.strerror or e}); nothing was changed "
            f"({'the old file is intact' if out.exists() else 'no file was left behind'}): "
            "free some space or pass a writable --out"
        ) from e


def _written(args: argparse.Namespace, merged: Merged, files: int, summary: str) -> str:
    """The closing line: what was written, from how many results files, what was kept from
    the previous lockfile and the matrix, and the retired combinations."""
    lock, rejected = merged.lock, merged.rejected
    runs = sum(len(e.runs) for e in lock.combinations)
    stale = sum(len(e.stale_runs) for e in lock.combinations)
    carried = ""
    if args.previous is not None:
        from envbuilder.credentials import redact_text

        again = f" ({merged.repeated} of its runs given again)" if merged.repeated else ""
        dropped = f", {len(merged.dropped)} dropped (listed above)" if merged.dropped else ""
        carried = (
            f" and {merged.carried} run(s) kept from {redact_text(args.previous)}{again}{dropped}"
        )
    if merged.unselected:
        carried += (
            f"; {len(merged.unselected)} combination(s) not in this resolution but in the "
            "matrix kept as they were"
        )
    retired = ""
    if lock.retired:
        kept = sum(len(r.runs) for r in lock.retired)
        retired = (
            f"; {len(lock.retired)} retired combination(s) (not in the resolution) kept "
            f"with {kept} run(s)"
        )
    return (
        f"✓ wrote {args.out}: {len(lock.combinations)} combinations ({summary}), "
        f"{runs} runs{f' and {stale} stale (on an older lock)' if stale else ''} from "
        f"{files - len(rejected)} results file(s){carried}, {len(rejected)} rejected"
        f"{retired}"
    )


def _release_wheels(lock: CompatLock, into: Path, earlier: Path | None, report: Reporter) -> int:
    """Gather the built wheels the release attaches (`gather_release_wheels`); 1 when one
    the lockfile names is found nowhere with its sha256."""
    from envbuilder.consumer.published_wheel import gather_release_wheels

    wheels = gather_release_wheels(lock, into, earlier)
    for name in wheels.missing:
        report.line(
            f"✕ {name}: a build record in the lockfile names it, and neither this run's "
            f"builds ({into}) nor the earlier release's assets ({earlier or 'none given'}) hold "
            "it with its sha256"
        )
    report.line(
        f"{'✕' if wheels.missing else '✓'} release wheels in {into}: {len(wheels.present)} "
        f"built now, {len(wheels.carried)} carried from the earlier release (sha256 checked), "
        f"{len(wheels.missing)} missing"
    )
    return 1 if wheels.missing else 0
