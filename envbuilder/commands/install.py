"""``envbuilder install``: install one combination of the lockfile, exactly as locked.

The flow is `envbuilder.consumer.install.install`; this module is its command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
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
        "--dry-run",
        action="store_true",
        help="make every check, write the lock and print the commands to paste; install nothing",
    )
    add_lock_argument(parser)
    rare = parser.add_argument_group("rarely needed")
    rare.add_argument(
        "--installer",
        type=choice(("uv", "pip")),
        metavar="{uv,pip}",
        default=None,
        help="installer to use (default: uv where it is installed, else pip)",
    )
    rare.add_argument(
        "--with-suite",
        action="store_true",
        help="also install the suite group (the conformance suite's own dependencies, e.g."
        " diffusers), to run the suite in that environment; left out by default",
    )
    add_source_build_arguments(rare)
    parser.add_argument(
        "--verify",
        default=None,
        metavar="REPOSITORY",
        help="install only from a lockfile that the GPU matrix workflow of REPOSITORY (OWNER/NAME) "
        "attested (its Sigstore bundle, published beside it; needs the 'verify' extra) "
        "(default: $ENVBUILDER_VERIFY; unset: the lockfile's content hash only)",
    )
    from envbuilder.commands.verify import add_signer_arguments

    add_signer_arguments(parser)


def add_source_build_arguments(parser: argparse._ActionsContainer) -> None:
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
    from envbuilder.consumer.install import InstallRequest, install
    from envbuilder.reporter import Reporter

    reporter = Reporter(verbose=args.verbose)
    lock = args.lock
    if args.verify or args.settings.verify:
        from envbuilder.commands.verify import signer
        from envbuilder.consumer.provenance import verified_lockfile

        expected = signer(args.verify or args.settings.verify, args)
        attested = verified_lockfile(
            lock,
            args.settings,
            expected,
            trusted_root=args.trusted_root,
            with_locks=True,
            combination=args.id,
        )
        reporter.line(f"✓ {attested.path}: attested by {expected.identity}")
        lock = str(attested.path)  # the very bytes verified, not a second download
    request = InstallRequest(
        settings=args.settings,
        lock=lock,
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
        pip_indexes=pip_index_options(args.settings.environ),
    )
    return install(request, reporter)


def pip_index_options(environ: Mapping[str, str]) -> tuple[str, ...]:
    """pip's configured ``index-url`` and ``extra-index-url`` as installer options (empty
    where pip's configuration names none), for uv, which does not read pip's."""
    from envbuilder.index.pipconfig import pip_config_value

    options: list[str] = []
    url = pip_config_value("index-url", environ=environ)
    if url:
        options += ["--index-url", url]
    for extra in (pip_config_value("extra-index-url", environ=environ) or "").split():
        options += ["--extra-index-url", extra]
    return tuple(options)
