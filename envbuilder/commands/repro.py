"""``envbuilder repro``: write a standalone script that rebuilds one failing conformance check."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HELP = (
    "write a standalone Python script (torch, xformers, diffusers only) that rebuilds a "
    "failing conformance check's exact case and says whether it still fails"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "check",
        metavar="CHECK",
        help="the check's name as in the results (a glob matching exactly one check)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        metavar="FILE",
        help="results file to take the check from (default: the newest under results/ "
        "where it failed, else where it passed)",
    )
    parser.add_argument(
        "-o",
        "--out",
        type=str,
        default=None,
        metavar="FILE",
        help="script to write; a directory gets repro_<check>.py in it (default: stdout)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write the script even when the check did not fail in those results",
    )


def run(args: argparse.Namespace) -> int:
    from envbuilder.errors import EnvbuilderError, InputError
    from envbuilder.files import write_atomic
    from envbuilder.repro import choose, default_filename, generate, load, results_in

    files = [load(args.results)] if args.results is not None else results_in(Path("results"))
    recorded = choose(files, args.check)
    print(
        f"envbuilder repro: {recorded.name}: {recorded.status} in {recorded.results.path}",
        file=sys.stderr,
    )
    if not recorded.failed and not args.force:
        why = f" ({recorded.reason})" if recorded.reason else ""
        raise EnvbuilderError(
            f"{recorded.name} did not fail in {recorded.results.path}: it is "
            f"{recorded.status!r} there{why}, so there is no failure to reproduce; give "
            "--force to write its script anyway (it would report NOT REPRODUCED), or "
            "--results FILE for a run where it failed"
        )
    out = None if args.out is None else Path(args.out)
    if out is not None and args.out.endswith(("/", os.sep)) and not out.is_dir():
        raise InputError(
            f"-o {args.out!r}: no such directory; create it first, or name a file to write"
        )
    if out is not None and out.is_dir():
        out = out / default_filename(recorded.name)
    _, text = generate(recorded, filename=None if out is None else out.name)
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    write_atomic(out, text)
    print(f"wrote {out}; run it with: python {out}", file=sys.stderr)
    return 0
