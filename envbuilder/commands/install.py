"""``envbuilder install``: install one combination of the lockfile, exactly as locked.

The flow is `envbuilder.lockfile.install.install`; this module is its command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuilder.commands._lockfile_args import add_lock_argument, add_selection_arguments, choice

HELP = "install a verified combination from the lockfile into this or another environment"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "id", nargs="?", metavar="ID", help="combination id; or choose with the options below"
    )
    add_selection_arguments(
        parser,
        python_help="the interpreter to install into, or with --venv what to create the venv "
        "from: a Python version (3.12) or an interpreter (.venv/bin/python, a venv directory, "
        "python3.12 on PATH) (default: $VIRTUAL_ENV, else $CONDA_PREFIX, else the first "
        "python3 on PATH)",
    )
    parser.add_argument(
        "--venv",
        type=Path,
        metavar="DIR",
        help="virtual environment to install into, created when absent (with uv, from "
        "--python, else a Python of the combination's version)",
    )
    parser.add_argument(
        "--allow-unverified", action="store_true", help="also install unverified or broken ones"
    )
    parser.add_argument(
        "--installer",
        type=choice(("uv", "pip")),
        metavar="{uv,pip}",
        default="uv",
        help="installer to use (default: uv)",
    )
    parser.add_argument(
        "--with-suite",
        action="store_true",
        help="also install the suite group (the conformance suite's own dependencies, e.g."
        " diffusers), to run the suite in that environment; left out by default",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="make every check, write the lock and print the commands to paste; install nothing",
    )
    add_lock_argument(parser)
    add_source_build_arguments(parser)


def add_source_build_arguments(parser: argparse.ArgumentParser) -> None:
    """``install``'s options for a source build's wheel."""
    parser.add_argument(
        "--wheel",
        type=Path,
        default=None,
        metavar="PATH",
        help="a source build's xformers wheel (its sha256 must be the lockfile's build "
        "record's) (default: the build cache)",
    )
    parser.add_argument(
        "--build-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="built wheels by build key, as build-wheel writes them (default: source-builds "
        "in the user cache)",
    )


def run(args: argparse.Namespace) -> int:
    from envbuilder.lockfile.install import InstallRequest, install
    from envbuilder.reporter import Reporter

    request = InstallRequest(
        settings=args.settings,
        lock=args.lock,
        id=args.id,
        python=args.python,
        venv=args.venv,
        cuda=args.cuda,
        torch=args.torch,
        xformers=args.xformers,
        gpu=args.gpu,
        use=args.use,
        allow_unverified=args.allow_unverified,
        installer=args.installer,
        with_suite=args.with_suite,
        dry_run=args.dry_run,
        wheel=args.wheel,
        build_cache=args.build_cache,
    )
    return install(request, Reporter(verbose=args.verbose))
