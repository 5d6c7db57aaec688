"""``envbuilder publish``: the static site for the lockfile."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuilder.commands._lockfile_args import add_lock_argument

HELP = "write the static site: lockfile, JSON Schema, Markdown table and HTML page"


def configure(parser: argparse.ArgumentParser) -> None:
    add_lock_argument(parser)
    parser.add_argument(
        "-o",
        "--out",
        type=Path,
        default=Path("site"),
        metavar="DIR",
        help="site directory (default: site/)",
    )


def run(args: argparse.Namespace) -> int:
    from envbuilder.consumer.published import lockfile_choice
    from envbuilder.publish import build_site
    from envbuilder.reporter import Reporter

    report = Reporter(verbose=args.verbose)
    with report.step(f"publish {args.out}"):
        lockfile, source = lockfile_choice(args.lock, args.settings, with_locks=True)
        if source:
            report.line(f"  {source}")
        files = build_site(lockfile, args.out)
        for path in files:
            report.line(f"  {path} ({path.stat().st_size} bytes)")
    report.summary((args.out / "compat.md").read_text(encoding="utf-8"))
    return 0
