"""``envbuilder snapshot``: write the lockfile snapshot the wheel carries (envbuilder/data/)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "write the lockfile snapshot the wheel carries (envbuilder/data/), for a release"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lockfile", metavar="LOCKFILE|URL", help="the published lockfile")
    parser.add_argument(
        "out",
        nargs="?",
        type=Path,
        metavar="DIR",
        help="the directory to replace (default: the installed package's data directory)",
    )
    parser.add_argument(
        "--with-locks",
        action="store_true",
        help="carry the pylocks too (refused when they name a package index's host)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="a URL host the files may name besides the reserved ones (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    from envbuilder.consumer.published import lockfile_argument
    from envbuilder.consumer.snapshot import data_directory, newest_evidence, write_snapshot
    from envbuilder.lockfile.read import load_lockfile
    from envbuilder.reporter import Reporter

    report = Reporter(verbose=args.verbose)
    out = args.out if args.out is not None else data_directory()
    with report.step(f"snapshot {out}"):
        lockfile = lockfile_argument(args.lockfile, args.settings, with_locks=args.with_locks)
        written = write_snapshot(
            lockfile, out, with_locks=args.with_locks, allow_hosts=frozenset(args.allow_host)
        )
        day = newest_evidence(load_lockfile(lockfile)) or "no runs"
        report.line(f"  {len(written)} files, newest evidence {day}")
    return 0
