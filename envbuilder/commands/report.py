"""``envbuilder report``: a Markdown issue draft for the project at fault in a failing cause.

Without CAUSE it lists the failing causes of the runs it reads, numbered; CAUSE is one
of those numbers, a cause's name (``diffusers-xformers-bool-mask``), a check's name,
or the text of a recorded cause.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.commands.repro import add_source_arguments, recorded_runs, run_of

if TYPE_CHECKING:
    from envbuilder.repro import KnownCause, RecordedRun

HELP = (
    "draft the upstream issue (Markdown) for a failing cause: title, summary, versions, "
    "the minimal script, expected vs actual, the measured workaround and fix; without "
    "CAUSE, list the causes"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "cause",
        nargs="?",
        metavar="CAUSE",
        help="a number from the listing (no CAUSE lists them), a cause's name, a check's "
        "name, or a recorded cause's text",
    )
    add_source_arguments(parser)
    parser.add_argument(
        "-o",
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the draft to FILE (default: stdout)",
    )


@dataclass(kw_only=True)
class Listed:
    """One failing cause across the runs read: a known one, or a recorded text."""

    text: str
    known: KnownCause | None
    checks: set[str] = field(default_factory=set)
    combinations: set[str] = field(default_factory=set)
    faults: set[str] = field(default_factory=set)


def listing(runs: list[RecordedRun]) -> tuple[list[Listed], set[str]]:
    """The failing causes of direct checks, known ones first (in `KNOWN` order), then by
    how many checks; and the checks that failed in the suite's own code (listed apart, never
    reported). A workaround check that fails is evidence about the workaround, reported with
    the cause it covers, never a cause of its own."""
    from envbuilder.repro import KNOWN, cause_of

    found: dict[str, Listed] = {}
    suite: set[str] = set()
    for run in runs:
        for check in run.checks:
            if not check.failed:
                continue
            if check.suite_error:
                suite.add(check.name)
                continue
            if check.workaround is not None:
                continue
            known = cause_of(check)
            text = known.key if known is not None else check.cause
            entry = found.setdefault(text, Listed(text=text, known=known))
            entry.checks.add(check.name)
            entry.combinations.add(run.facts.combination or run.facts.source)
            entry.faults.add(check.fault)
    order: dict[str, int] = {str(c.key): i for i, c in enumerate(KNOWN)}
    listed = sorted(
        found.values(),
        key=lambda e: (order.get(e.text, len(order)), -len(e.checks), e.text),
    )
    return listed, suite


def _line(index: int, entry: Listed) -> str:
    n = len(entry.checks)
    name = entry.text if entry.known is not None else f"(no reproducer) {entry.text}"
    return (
        f"{index:>3}. {name}: {n} check{'s' if n != 1 else ''} on"
        f" {len(entry.combinations)} combination(s), at fault: {', '.join(sorted(entry.faults))}"
    )


def _newest(runs: list[RecordedRun], cause: KnownCause) -> RecordedRun:
    from envbuilder.repro import sharing

    holding = [r for r in runs if sharing(r, cause)]
    return max(holding, key=lambda r: (r.facts.finished or "", len(r.checks)))


def _chosen(runs: list[RecordedRun], wanted: str, entries: list[Listed]) -> KnownCause:
    """The known cause ``wanted`` names, through the listing's number, a cause's name, a
    check's name or a recorded cause's text."""
    from envbuilder.errors import InputError
    from envbuilder.repro import by_key, choose, known_cause

    entry: Listed | None = None
    if wanted.isdigit():
        if not 1 <= int(wanted) <= len(entries):
            raise InputError(f"no cause {wanted} here: the listing has {len(entries)}")
        entry = entries[int(wanted) - 1]
    else:
        lowered = wanted.lower()
        exact = [e for e in entries if e.text == wanted]
        partial = [e for e in entries if lowered in e.text.lower()]
        entry = exact[0] if exact else partial[0] if len(partial) == 1 else None
    if entry is None and by_key(wanted) is not None:
        raise InputError(f"no check failed with cause {wanted!r} in these runs")
    if entry is None:
        return known_cause(choose(runs, wanted))  # a check's name, or an InputError
    if entry.known is None:
        raise InputError(
            f"no minimal reproducer for the cause {entry.text!r} (checks:"
            f" {', '.join(sorted(entry.checks)[:4])}), so no report to draft; the causes with"
            " one are listed first by `envbuilder report`"
        )
    return entry.known


def run(args: argparse.Namespace) -> int:
    from envbuilder.files import write_atomic
    from envbuilder.repro import draft, of_combination, sharing

    runs = recorded_runs(args)
    if args.combination is not None:
        runs = of_combination(runs, args.combination)
    entries, suite = listing(runs)
    if args.cause is None:
        for i, entry in enumerate(entries, start=1):
            print(_line(i, entry))
        if suite:
            print(
                f"     and {len(suite)} check(s) that errored in the suite's own code, a suite"
                f" bug reported nowhere upstream: {', '.join(sorted(suite))}"
            )
        if not entries:
            print("no failing checks in these runs")
        return 0
    cause = _chosen(runs, args.cause, entries)
    named = [c for r in runs for c in r.checks if c.name == args.cause and c.failed]
    run = run_of(runs, named[0]) if named else _newest(runs, cause)
    text = draft(cause, run, sharing(run, cause))
    print(
        f"envbuilder report: {cause.key} from {run.facts.source}"
        f" ({run.facts.combination or 'no combination'})",
        file=sys.stderr,
    )
    if args.out is None:
        sys.stdout.write(text)
        return 0
    write_atomic(args.out, text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
