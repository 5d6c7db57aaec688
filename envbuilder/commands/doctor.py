"""``envbuilder doctor``: check the user's environment against the lockfile: ``--python``
(a version or a path), else the active venv, else the active conda env, else the first
``python3`` on PATH (`envbuilder.consumer.interpreter`); it needs nothing of envbuilder
installed. The first line names the interpreter chosen.

With a GPU, torch and xformers are imported once, in a child process, beside the file
check (hashes from the stamp of the last run) and the reading of the lockfile; the
compile checks run again only when something they depend on changed (the finding says
what), and ``--fast`` (a start-up check) imports nothing: the driver is asked for the GPU
and the GPU checks' last results are reported where they still hold.

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
from envbuilder.consumer.advice import wrapped
from envbuilder.errors import InputError
from envbuilder.reporter import terminal_size

HELP = (
    "check your environment against the lockfile (versions, file hashes, xformers, GPU smoke "
    "test): the active venv or conda env, or --python's"
)

#: The file stamp's name inside ``--cache-dir``.
FILE_STAMP = "files-stamp.json"

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
        "--fast",
        action="store_true",
        help="a start-up check: load torch's and xformers' libraries without importing them, "
        "ask the driver for the GPU, and report the GPU checks' last results where nothing "
        "they depend on changed since (a warning where something did)",
    )
    parser.add_argument(
        "--recheck",
        action="store_true",
        help="run the GPU compile checks even where their last result still holds",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="the doctor's directory for the file stamp, the GPU checks' results and torch's "
        "compile caches (default: .envbuilder-doctor in the environment, else the user's "
        "cache directory; the file stamp stays in the environment)",
    )
    parser.add_argument(
        "--full-probe",
        action="store_true",
        help="import torch and xformers even where no GPU is present (by default only their "
        "libraries are loaded there; with a GPU the import and smoke test always run)",
    )


def run(args: argparse.Namespace) -> int:
    from envbuilder.consumer.doctor import (
        check_environment,
        inspect_environment,
        installed,
        start_probe,
        summary,
    )
    from envbuilder.consumer.interpreter import choose, parse_python
    from envbuilder.consumer.published import lockfile_choice
    from envbuilder.lockfile.read import load_lockfile

    if args.fast and args.full_probe:
        raise InputError("--fast and --full-probe contradict each other: give one")
    if args.cache_dir is not None:
        args.cache_dir.mkdir(parents=True, exist_ok=True)
    chosen = choose(parse_python(args.python) if args.python else None)
    # the probe (a child process) runs beside reading the lockfile and the file check
    running = None
    if not args.no_probe:
        running = start_probe(
            str(chosen.executable),
            full=args.full_probe,
            fast=args.fast,
            cache=args.cache_dir,
            recheck=args.recheck or args.rehash,
        )
    path, source = lockfile_choice(args.lock, args.settings)
    if source:
        print(wrapped(source, max(terminal_size(SCREEN_COLUMNS, 40).columns, 40)), file=sys.stderr)
    lock = load_lockfile(path)
    if chosen.executable.absolute() == Path(sys.executable).absolute():
        env = installed()
    else:
        env = inspect_environment(str(chosen.executable))
    stamp = args.cache_dir / FILE_STAMP if args.cache_dir is not None else None
    entry, findings = check_environment(
        lock,
        env=env,
        probe=running,
        hashes=not args.no_hashes,
        rehash=args.rehash,
        stamp=stamp,
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
        lines = [f"interpreter: {chosen.describe()}"]
        lines.append(f"envbuilder doctor: {env.executable} against {path}")
        lines += [f"  {_MARK[f.status]} {f.name}: {f.detail}" for f in findings]
        lines += summary(findings)
        lines.append(
            verdict_line(ok, entry.id if entry else None, entry.verdict.verdict if entry else None)
        )
        width = terminal_size(SCREEN_COLUMNS, 40).columns
        print("\n".join(wrapped(line, max(width, 40)) for line in lines))
    return 0 if ok else 1


#: the width where output is not a terminal (as `query`'s)
SCREEN_COLUMNS = 200


def verdict_line(ok: bool, combination: str | None, verdict: str | None) -> str:
    """The last line: whether every check held, and for which row with which verdict."""
    if combination is None:
        return "✕ no combination of the lockfile matches this environment"
    held = "✓ every check holds" if ok else "✕ not every check holds"
    return f"{held} for {combination} (its verdict in the lockfile: {verdict})"
