"""``envbuilder query``: the lockfile's combinations that match, best first."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

from envbuilder.lockfile.cli_args import add_lock_argument, add_selection_arguments

if TYPE_CHECKING:
    from envbuilder.lockfile.model import LastVerified

HELP = "list the lockfile's combinations matching --python/--cuda/--torch/--gpu, best first (--use: by one use's verdict)"


def configure(parser: argparse.ArgumentParser) -> None:
    add_lock_argument(parser)
    add_selection_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _last_verified(last: LastVerified | None) -> dict[str, object] | None:
    """Stale evidence, shown while the current lock has no runs of its own."""
    if last is None:
        return None
    return {
        "date": last.date,
        "lock_sha256": last.lock_sha256,
        "suite_version": last.suite_version,
        "verdict": last.verdict.verdict,
        "uses": {u.use: u.verdict.verdict for u in last.uses},
        "text": last.describe(),
    }


def run(args: argparse.Namespace) -> int:
    from envbuilder.lockfile.query import Query, select
    from envbuilder.lockfile.read import default_lockfile, load_lockfile

    path = args.lock or default_lockfile()
    lock = load_lockfile(path)
    matches = select(
        lock,
        Query(
            python=args.python,
            cuda=args.cuda,
            torch=args.torch,
            xformers=args.xformers,
            gpu=args.gpu,
            use=args.use,
        ),
    )
    if args.json:
        out = [
            {
                "id": m.entry.id,
                "python": m.entry.python,
                "cuda": m.entry.cuda,
                "torch": m.entry.torch,
                "xformers": m.entry.xformers,
                "compute_capability": m.compute_capability,
                "use": m.use,
                "verdict": m.verdict.verdict,
                "reason": m.verdict.reason,
                "workarounds": list(m.verdict.workarounds),
                "failing_checks": list(m.verdict.failing_checks),
                "choices": [asdict(c) for c in m.verdict.choices],
                "uses": {u.use: u.verdict.verdict for u in m.uses},
                "lock": m.entry.lock.path if m.entry.lock else None,
                "last_verified": _last_verified(m.entry.last_verified)
                if not m.entry.runs
                else None,
            }
            for m in matches
        ]
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if matches else 1
    if not matches:
        print(f"no combination in {path} matches", file=sys.stderr)
        return 1
    width = max(len(m.entry.id) for m in matches)
    if args.use:
        print(f"verdicts for {args.use}:")
    for m in matches:
        print(f"{m.verdict.verdict:<25} {m.entry.id:<{width}}  {m.verdict.reason}")
    return 0
