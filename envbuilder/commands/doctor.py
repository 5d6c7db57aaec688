"""``envbuilder doctor``: check the user's environment against the lockfile: ``--python``
(a version or a path), else the active venv, else the active conda env, else the first
``python3`` on PATH (`envbuilder.lockfile.interpreter`); it needs nothing of envbuilder
installed. The first line names the interpreter chosen.

Exit status: 0 when every check passed (warnings allowed), 1 when one failed,
2 for bad input (a missing, damaged or edited lockfile).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from envbuilder.commands._lockfile_args import add_lock_argument, add_python_argument

HELP = (
    "check your environment against the lockfile (versions, file hashes, xformers, GPU smoke "
    "test): the active venv or conda env, or --python's"
)

_MARK = {"pass": "✓", "warn": "!", "skip": "-", "fail": "✕"}


def configure(parser: argparse.ArgumentParser) -> None:
    add_lock_argument(parser)
    add_python_argument(
        parser,
        "the environment to check, where envbuilder need not be installed: a Python version "
        "(3.12) or an interpreter (.venv/bin/python, a venv directory, python3.12 on PATH) "
        "(default: $VIRTUAL_ENV, else $CONDA_PREFIX, else the first python3 on PATH)",
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
    parser.add_argument(
        "--full-probe",
        action="store_true",
        help="import torch and xformers even where no GPU is present (by default only their "
        "libraries are loaded there; with a GPU the import and smoke test always run)",
    )


def run(args: argparse.Namespace) -> int:
    from envbuilder.lockfile.doctor import (
        check_environment,
        inspect_environment,
        installed,
        start_probe,
        summary,
    )
    from envbuilder.lockfile.interpreter import choose, parse_python
    from envbuilder.lockfile.published import lockfile_choice
    from envbuilder.lockfile.read import load_lockfile

    path, source = lockfile_choice(args.lock, args.settings)
    if source:
        print(source, file=sys.stderr)
    lock = load_lockfile(path)
    chosen = choose(parse_python(args.python) if args.python else None)
    if chosen.executable.absolute() == Path(sys.executable).absolute():
        env = installed()
    else:
        env = inspect_environment(str(chosen.executable))
    # the probe runs beside the file hashing
    running = None if args.no_probe else start_probe(str(chosen.executable), full=args.full_probe)
    entry, findings = check_environment(
        lock, env=env, probe=running, hashes=not args.no_hashes, rehash=args.rehash
    )
    probe = running.report() if running is not None else None
    ok = not any(f.status == "fail" for f in findings)
    if args.json:
        out = {
            "lockfile": str(path),
            "python": env.executable,
            "interpreter": {
                "executable": str(chosen.executable),
                "version": chosen.version,
                "chosen_by": chosen.source,
            },
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
        print(f"interpreter: {chosen.describe()}")
        print(f"envbuilder doctor: {env.executable} against {path}")
        for f in findings:
            print(f"  {_MARK[f.status]} {f.name}: {f.detail}")
        for line in summary(findings):
            print(line)
        verdict = entry.verdict.verdict if entry else "not in the lockfile"
        print(f"{'PASS' if ok else 'FAIL'}: lockfile verdict {verdict}")
    return 0 if ok else 1
