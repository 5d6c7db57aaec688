"""``envbuilder export``: an installable lock for one combination of the lockfile."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envbuilder.commands._lockfile_args import add_lock_argument, choice
from envbuilder.consumer.export import FORMATS

HELP = (
    "write one combination's installable lock (pylock.toml, a --require-hashes requirements "
    "file, or a constraints file to layer your own requirements on)"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="combination id (see `envbuilder query`)")
    parser.add_argument(
        "--format",
        type=choice(FORMATS),
        metavar="{" + ",".join(FORMATS) + "}",
        default=None,
        help="pylock (uv pip install -r), requirements (pip install --require-hashes -r) or "
        "constraints (pip/uv install -c FILE -r your-requirements.txt) (default: pylock; "
        "requirements from the lockfile this envbuilder carries, which names no file URL)",
    )
    parser.add_argument(
        "-o",
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="file to write; uv needs a pylock named pylock.toml or pylock.<name>.toml (default: stdout)",
    )
    parser.add_argument(
        "--with-suite",
        action="store_true",
        help="add the combination's suite group (the conformance suite's own dependencies,"
        " e.g. diffusers), locked against the same lock; left out by default",
    )
    add_lock_argument(parser)


def run(args: argparse.Namespace) -> int:
    from packaging.pylock import is_valid_pylock_path

    from envbuilder.consumer.export import carried, exported
    from envbuilder.consumer.published import lockfile_choice
    from envbuilder.errors import InputError
    from envbuilder.files import write_atomic
    from envbuilder.lockfile.read import load_lockfile

    lockfile, source = lockfile_choice(
        args.lock, args.settings, with_locks=True, combination=args.id
    )
    if source:
        print(source, file=sys.stderr)
    fmt = args.format
    if fmt is None:
        entry = load_lockfile(lockfile).by_id().get(args.id)
        fmt = "requirements" if entry is not None and carried(lockfile, entry) else "pylock"
    if args.out is not None and fmt == "pylock" and not is_valid_pylock_path(args.out):
        raise InputError(
            f"--out {str(args.out)!r}: a PEP 751 lock must be named pylock.toml or "
            "pylock.<name>.toml with no dots in <name> (uv recognises it only by that name), "
            f"e.g. pylock.{args.id.replace('.', '_')}.toml"
        )
    data = exported(lockfile, args.id, fmt, with_suite=args.with_suite)
    if args.out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        write_atomic(args.out, data)
        print(f"wrote {args.out} ({fmt}, {args.id})", file=sys.stderr)
    return 0
