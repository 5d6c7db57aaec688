"""``envbuilder doctor``: check an environment against the lockfile (``--python PATH``:
another one, which needs nothing of envbuilder installed).

Exit status: 0 when every check passed (warnings allowed), 1 when one failed,
2 for bad input (a missing, damaged or edited lockfile).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from envbuilder.lockfile.cli_args import add_lock_argument

HELP = (
    "check an environment against the lockfile (versions, file hashes, xformers, GPU smoke "
    "test): this one, or --python PATH's"
)

_MARK = {"pass": "✓", "warn": "!", "skip": "-", "fail": "✕"}


def configure(parser: argparse.ArgumentParser) -> None:
    add_lock_argument(parser)
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="check the environment of this interpreter (e.g. .venv/bin/python) instead of "
        "the running one; envbuilder need not be installed there",
    )
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
    from envbuilder.lockfile.doctor import (
        check_environment,
        inspect_environment,
        installed,
        run_probe,
        summary,
    )
    from envbuilder.lockfile.published import lockfile_argument
    from envbuilder.lockfile.read import load_lockfile

    path = lockfile_argument(args.lock, args.settings)
    lock = load_lockfile(path)
    env = inspect_environment(args.python) if args.python else installed()
    probe = None if args.no_probe else run_probe(env.executable if args.python else sys.executable)
    entry, findings = check_environment(
        lock, env=env, probe=probe, hashes=not args.no_hashes, rehash=args.rehash
    )
    ok = not any(f.status == "fail" for f in findings)
    if args.json:
        out = {
            "lockfile": str(path),
            "python": env.executable,
            "combination": entry.id if entry else None,
            "verdict": entry.verdict.verdict if entry else None,
            "uses": {u.use: u.verdict.verdict for u in entry.uses} if entry else None,
            "ok": ok,
            "findings": [asdict(f) for f in findings],
            "summary": summary(findings),
            "probe": probe,
        }
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"envbuilder doctor: {env.executable} against {path}")
        for f in findings:
            print(f"  {_MARK[f.status]} {f.name}: {f.detail}")
        for line in summary(findings):
            print(line)
        verdict = entry.verdict.verdict if entry else "not in the lockfile"
        print(f"{'PASS' if ok else 'FAIL'}: lockfile verdict {verdict}")
    return 0 if ok else 1
