"""``python -m envbuilder.conformance --out results.json [...]``: run the suite here."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from envbuilder.conformance.runner import (
    NoChecksSelected,
    RunOptions,
    pattern_problems,
    run_suite,
    summarize,
    unmatched_patterns,
)

__all__ = ["main"]

_SHA256 = re.compile(r"[0-9a-f]{64}")
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m envbuilder.conformance",
        description="Run the torch.compile + attention conformance suite in this environment.",
    )
    p.add_argument(
        "--out", type=Path, required=True, help="results file (JSON), written atomically"
    )
    p.add_argument(
        "--checks",
        action="append",
        default=[],
        metavar="PATTERN",
        help="run only checks matching this glob or dotted prefix (repeatable)",
    )
    p.add_argument("--device", help="cpu or cuda:N (default: cuda:0 when visible, else cpu)")
    p.add_argument("--quick", action="store_true", help="a smaller run (about 2 minutes on a GPU)")
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="check processes run at once (default: 10 on a GPU, where the groups are split"
        " across processes by their measured costs, longest first; 1 on the CPU); "
        "the performance group always runs alone, first",
    )
    p.add_argument(
        "--no-fork-server",
        dest="fork_server",
        action="store_false",
        help="start each group as a fresh interpreter instead of forking it from a process "
        "that imported torch once",
    )
    p.add_argument("--combination", help="the combination id this environment was built from")
    p.add_argument("--lock-sha256", help="sha256 of the combination's pylock file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.device is not None and not _DEVICE.fullmatch(args.device):
        parser.error(f"--device {args.device!r}: expected 'cpu', 'cuda' or 'cuda:N'")
    if args.lock_sha256 is not None and not _SHA256.fullmatch(args.lock_sha256):
        parser.error(f"--lock-sha256 {args.lock_sha256!r}: expected 64 lowercase hex digits")
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more")
    if args.out.is_dir():
        parser.error(f"--out {str(args.out)!r} is a directory; give a file name")
    if problems := pattern_problems(args.checks):
        parser.error("; ".join(problems))
    device = "cuda:0" if args.device == "cuda" else args.device
    opts = RunOptions(
        out=args.out,
        checks=tuple(args.checks),
        device=device,
        quick=args.quick,
        combination=args.combination,
        lock_sha256=args.lock_sha256,
        jobs=args.jobs,
        fork_server=args.fork_server,
    )
    try:
        results = run_suite(opts, echo=lambda line: print(line, flush=True))
    except NoChecksSelected as e:
        print(f"python -m envbuilder.conformance: error: {e}", file=sys.stderr)
        return 2
    print(summarize(results), flush=True)
    for pattern in unmatched_patterns(args.checks, results):
        print(f"warning: --checks {pattern!r} matched no check", file=sys.stderr)
    print(f"wrote {args.out} and {opts.jsonl}", flush=True)
    return 1 if results.failed_direct_gates else 0


if __name__ == "__main__":
    sys.exit(main())
