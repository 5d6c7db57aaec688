"""``envbuilder repro``: write the minimal standalone script of a failing check's cause."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.commands._lockfile_args import add_lock_argument

if TYPE_CHECKING:
    from envbuilder.repro import Recorded, RecordedRun

HELP = (
    "write the minimal standalone script (torch, xformers, diffusers only) that shows a "
    "failing check's cause, printing its versions and exiting 1 only on that failure"
)


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the check records come from: the lockfile (as every consumer command reads it),
    or results files; and which combination's runs."""
    add_lock_argument(parser)
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        metavar="FILE|DIR",
        help="read the checks from this results file, or every results file in this directory, "
        "instead of the lockfile (for maintainers: results/)",
    )
    parser.add_argument(
        "--combination",
        default=None,
        metavar="ID",
        help="only this combination's runs (default: the newest run where the check failed)",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "check",
        metavar="CHECK",
        help="the check's name as `query --long` lists it (a glob matching exactly one check)",
    )
    add_source_arguments(parser)
    parser.add_argument(
        "-o",
        "--out",
        type=str,
        default=None,
        metavar="FILE|DIR",
        help="script to write; a directory gets repro_<cause>.py in it (default: stdout)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write the script of the check's cause even when the check did not fail there",
    )


def recorded_runs(args: argparse.Namespace) -> list[RecordedRun]:
    """The runs ``--results`` names, else those of the lockfile consumer commands read."""
    from envbuilder.repro import from_lockfile, results_in

    if args.results is not None:
        return results_in(args.results)
    from envbuilder.consumer.published import lockfile_choice
    from envbuilder.lockfile.read import load_lockfile

    path, source = lockfile_choice(args.lock, args.settings)
    if source:
        print(source, file=sys.stderr)
    return from_lockfile(load_lockfile(path))


def run_of(runs: list[RecordedRun], check: Recorded) -> RecordedRun:
    return next(r for r in runs if r.facts is check.run)


def run(args: argparse.Namespace) -> int:
    from envbuilder.errors import EnvbuilderError, InputError
    from envbuilder.files import write_atomic
    from envbuilder.repro import choose, default_filename, known_cause, render, sharing

    runs = recorded_runs(args)
    check = choose(runs, args.check, args.combination)
    where = f"{check.run.source} ({check.run.combination or 'no combination'})"
    if not check.failed and not args.force:
        why = f" ({check.reason})" if check.reason else ""
        raise EnvbuilderError(
            f"{check.name} did not fail in {where}: it is {check.status!r} there{why}, so there "
            "is no failure to reproduce; give --force to write its cause's script anyway, or "
            "--combination/--results for a run where it failed"
        )
    cause = known_cause(check, by_name=not check.failed)
    checks = sharing(run_of(runs, check), cause) or [check]
    print(
        f"envbuilder repro: {check.name}: {check.status} in {where}; cause {cause.key}, "
        f"shared by {len(checks)} failed check(s) of that run: one script for them all",
        file=sys.stderr,
    )
    out = None if args.out is None else Path(args.out)
    if out is not None and args.out.endswith(("/", os.sep)) and not out.is_dir():
        raise InputError(
            f"-o {args.out!r}: no such directory; create it first, or name a file to write"
        )
    if out is not None and out.is_dir():
        out = out / default_filename(cause)
    text = render(cause, checks, filename=None if out is None else out.name)
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    write_atomic(out, text)
    print(f"wrote {out}; run it with: python {out}", file=sys.stderr)
    return 0
