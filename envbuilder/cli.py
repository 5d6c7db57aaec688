"""The ``envbuilder`` command line: one parser, one exit path.

Each subcommand lives in ``envbuilder.commands.<name>`` and exposes
``HELP`` (one line), ``configure(parser)`` and ``run(args) -> int``.
Commands import their heavy dependencies inside ``run`` so that
``envbuilder --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import threading
from collections.abc import Sequence

from envbuilder import __version__
from envbuilder.credentials import RedactingFilter, redact_text
from envbuilder.errors import EnvbuilderError
from envbuilder.extras import check_command
from envbuilder.settings import Settings

__all__ = ["COMMANDS", "main"]

#: subcommand name -> module; the order is the order of ``--help``.
COMMANDS: dict[str, str] = {
    "resolve": "envbuilder.commands.resolve",
    "matrix": "envbuilder.commands.matrix",
    "build": "envbuilder.commands.build",
    "conformance": "envbuilder.commands.conformance",
    "lock": "envbuilder.commands.lock",
    "query": "envbuilder.commands.query",
    "export": "envbuilder.commands.export",
    "install": "envbuilder.commands.install",
    "doctor": "envbuilder.commands.doctor",
    "publish": "envbuilder.commands.publish",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="envbuilder",
        description="Resolve, build, test and publish torch + xformers environments.",
    )
    parser.add_argument("--version", action="version", version=f"envbuilder {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show tracebacks for errors (or set ENVBUILDER_DEBUG=1)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(COMMANDS[name])
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        p.add_argument(
            "-v", "--verbose", action="count", default=0, help="more detail (-vv for debug logs)"
        )
        module.configure(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.settings = Settings.from_environment(os.environ, debug=args.debug)
    debug = args.settings.debug
    level = logging.WARNING
    if getattr(args, "verbose", 0) >= 2 or debug:
        level = logging.DEBUG
    elif getattr(args, "verbose", 0) == 1:
        level = logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    try:
        check_command(args.command, args)
        rc: int = args._module.run(args)
    except EnvbuilderError as e:
        if debug:
            raise
        print(f"envbuilder {args.command}: error: {redact_text(str(e))}", file=sys.stderr)
        return e.return_code
    except KeyboardInterrupt:
        print("envbuilder: interrupted; nothing more was written", file=sys.stderr)
        main_thread = threading.main_thread()
        if any(t is not main_thread and not t.daemon for t in threading.enumerate()):
            # Worker threads may sit in a network read for up to its timeout, and the
            # interpreter would wait for them at exit: leave now. Every file is written
            # atomically, so none is left half-written.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        return 130
    return rc
