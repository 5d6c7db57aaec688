"""``envbuilder doctor``: check the running environment against the lockfile.

Exit status: 0 when every check passed (warnings allowed), 1 when one failed,
2 for bad input (a missing, damaged or edited lockfile).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from envbuilder.lockfile.cli_args import add_lock_argument

HELP = (
    "check this environment against the lockfile (versions, file hashes, xformers, GPU smoke test)"
)

_MARK = {"pass": "✓", "warn": "!", "skip": "-", "fail": "✕"}


def configure(parser: argparse.ArgumentParser) -> None:
    add_lock_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--no-hashes", action="store_true", help="skip hashing installed files against RECORD"
    )
    parser.add_argument(
        "--rehash",
        action="store_true",
        help="hash every installed file, ignoring the stamp of files verified by an earlier run",
    )
    parser.add_argument(
        "--no-probe",
        action="store_true",
        help="skip importing torch/xformers and the GPU smoke test",
    )


def run(args: argparse.Namespace) -> int:
    from envbuilder.lockfile.doctor import check_environment, run_probe
    from envbuilder.lockfile.read import default_lockfile, load_lockfile

    path: Path = args.lock or default_lockfile(args.settings)
    lock = load_lockfile(path)
    probe = None if args.no_probe else run_probe()
    entry, findings = check_environment(
        lock, probe=probe, hashes=not args.no_hashes, rehash=args.rehash
    )
    ok = not any(f.status == "fail" for f in findings)
    if args.json:
        out = {
            "lockfile": str(path),
            "python": sys.executable,
            "combination": entry.id if entry else None,
            "verdict": entry.verdict.verdict if entry else None,
            "uses": {u.use: u.verdict.verdict for u in entry.uses} if entry else None,
            "ok": ok,
            "findings": [asdict(f) for f in findings],
            "probe": probe,
        }
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"envbuilder doctor: {sys.executable} against {path}")
        for f in findings:
            print(f"  {_MARK[f.status]} {f.name}: {f.detail}")
        verdict = entry.verdict.verdict if entry else "not in the lockfile"
        print(f"{'PASS' if ok else 'FAIL'}: lockfile verdict {verdict}")
    return 0 if ok else 1
