"""The ``envbuilder`` command line: one parser, one exit path.

Each subcommand lives in ``envbuilder.commands.<name>`` and exposes
``HELP`` (one line), ``configure(parser)`` and ``run(args) -> int``.
Commands import their heavy dependencies inside ``run`` so that
``envbuilder --help`` stays fast.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from envbuilder import __version__
from envbuilder.credentials import RedactingFilter, redact_text
from envbuilder.errors import EnvbuilderError
from envbuilder.extras import check_command
from envbuilder.settings import Settings
from envbuilder.textsafe import PrintableStream

__all__ = ["COMMANDS", "CONSUMER_COMMANDS", "build_parser", "main", "parse"]

#: subcommand name -> module; the order is the order of ``--help`` within its heading
#: (`CONSUMER_COMMANDS` first; every other command is the maintainers').
COMMANDS: dict[str, str] = {
    "resolve": "envbuilder.commands.resolve",
    "matrix": "envbuilder.commands.matrix",
    "build": "envbuilder.commands.build",
    "conformance": "envbuilder.commands.conformance",
    "lock": "envbuilder.commands.lock",
    "query": "envbuilder.commands.query",
    "export": "envbuilder.commands.export",
    "build-wheel": "envbuilder.commands.build_wheel",
    "install": "envbuilder.commands.install",
    "verify": "envbuilder.commands.verify",
    "doctor": "envbuilder.commands.doctor",
    "publish": "envbuilder.commands.publish",
    "snapshot": "envbuilder.commands.snapshot",
    "repro": "envbuilder.commands.repro",
    "report": "envbuilder.commands.report",
}


#: the commands for people who use a lockfile, listed first by ``--help``
CONSUMER_COMMANDS = ("query", "install", "export", "doctor", "repro", "report", "verify")

#: commands that act on every selected combination and ask for a selector or --all rather
#: than taking none to mean everything (an image build per combination is expensive)
ASK_FOR_SELECTION = frozenset({"build"})


def _add_global_options(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """``--debug`` and ``-v``: accepted before the subcommand and after it (``prefix`` keeps
    the two apart, and `main` adds them up)."""
    parser.add_argument(
        "--debug",
        dest=f"{prefix}debug",
        action="store_true",
        help="show tracebacks for errors (or set ENVBUILDER_DEBUG=1)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        dest=f"{prefix}verbose",
        action="count",
        default=0,
        help="more detail (-vv for debug logs)",
    )


def build_parser() -> argparse.ArgumentParser:
    modules = {name: importlib.import_module(path) for name, path in COMMANDS.items()}
    parser = argparse.ArgumentParser(
        prog="envbuilder",
        description=_command_list({name: m.HELP for name, m in modules.items()}),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"envbuilder {__version__}")
    _add_global_options(parser)
    sub = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        required=True,
        help="one of the commands above; `envbuilder COMMAND --help` for its options",
    )
    for name, module in modules.items():
        # no help= here: the description lists the commands under their two headings
        p = sub.add_parser(name, description=module.HELP, allow_abbrev=False)
        _add_global_options(p, prefix="sub_")
        module.configure(p)
        if name in ASK_FOR_SELECTION:
            _ask_for_selection(p)
        p.set_defaults(_module=module, _parser=p)
    return parser


def _command_list(helps: dict[str, str]) -> str:
    """What envbuilder does, then the commands under two headings, the consumers' first,
    each help wrapped beside its name as argparse wraps options (to the terminal's width)."""
    import shutil
    import textwrap

    width = max(shutil.get_terminal_size().columns - 2, 40)
    column = max(len(name) for name in helps) + 4
    consumer = [n for n in CONSUMER_COMMANDS if n in helps]
    sections = (
        ("commands for your environment (they read the lockfile; no checkout needed):", consumer),
        ("maintainer commands (the pipeline that makes and publishes the lockfile):",
         [n for n in helps if n not in consumer]),
    )  # fmt: skip
    lines = textwrap.wrap(
        "Which torch + xformers stack is verified for your GPU, and install it exactly; for "
        "maintainers, the pipeline that measures and publishes the answer.",
        width,
    )
    for title, names in sections:
        lines += ["", title]
        for name in names:
            wrapped = textwrap.wrap(
                helps[name],
                width,
                initial_indent=f"  {name}".ljust(column),
                subsequent_indent=" " * column,
                break_long_words=False,
                break_on_hyphens=False,
            )
            lines += wrapped
    return "\n".join(lines)


def _ask_for_selection(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if action.dest == "selectors":
            action.help = "cu121, py3.11, torch2.5, an id, a glob (or --all)"
    parser.add_argument("--all", action="store_true", help="every resolved combination")


def _first_command(argv: Sequence[str]) -> str | None:
    """The subcommand as typed: the first word that is not a global option."""
    for word in argv:
        if word in ("-h", "--help", "--version"):
            return None
        if not word.startswith("-"):
            return word
    return None


def parse(argv: Sequence[str], parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """Parse ``argv``; a mistyped subcommand gets a did-you-mean, an error its subcommand's usage."""
    parser = parser or build_parser()
    typed = _first_command(argv)
    if typed is not None and typed not in COMMANDS:
        near = difflib.get_close_matches(typed, list(COMMANDS), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        parser.error(f"unknown command {typed!r}{hint} (commands: {', '.join(COMMANDS)})")
    args, extra = parser.parse_known_args(argv)
    chosen: argparse.ArgumentParser = args._parser
    if extra:
        chosen.error(f"unrecognized arguments: {' '.join(extra)}{_option_hint(chosen, extra)}")
    if args.command in ASK_FOR_SELECTION:
        if args.all and args.selectors:
            chosen.error("give SELECTORs or --all, not both")
        if not args.all and not args.selectors:
            chosen.error(
                "which combinations? give one or more SELECTORs (an id, cu121, py3.11, "
                "torch2.5, a glob) or --all for every resolved one"
            )
    args.debug = args.debug or args.sub_debug
    args.verbose = args.verbose + args.sub_verbose
    return args


def _option_hint(parser: argparse.ArgumentParser, extra: Sequence[str]) -> str:
    """``; did you mean '--python'?`` for the first mistyped option that is near one."""
    known = [o for action in parser._actions for o in action.option_strings]
    for word in extra:
        if word.startswith("--"):
            near = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.6)
            if near:
                return f"; did you mean {near[0]!r}?"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # --help, usage or an error message into a closed pipe
        return _reader_gone()


def _main(argv: Sequence[str] | None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    args.settings = Settings.from_environment(os.environ, debug=args.debug)
    debug = args.settings.debug
    level = logging.WARNING
    if args.verbose >= 2 or debug:
        level = logging.DEBUG
    elif args.verbose == 1:
        level = logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    streams = sys.stdout, sys.stderr
    if args.command not in _OWN_ESCAPES:
        sys.stdout, sys.stderr = PrintableStream(sys.stdout), PrintableStream(sys.stderr)
    on_term = _terminate_as_interrupt()
    try:
        return _run(args, debug)
    finally:
        sys.stdout, sys.stderr = streams
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)


class Terminated(KeyboardInterrupt):
    """SIGTERM (CI cancelling a job, `timeout`): cleaned up after like Ctrl-C."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def _terminate_as_interrupt() -> signal._HANDLER | None:
    """Make SIGTERM raise `Terminated` (so every cleanup that Ctrl-C runs runs); the
    handler it replaces, or None where signals cannot be handled (not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    return signal.SIG_DFL if previous is None else previous


def describe_os_error(error: OSError) -> str:
    """An `OSError` as one line: the path, what the system said, and where more is."""
    what = error.strerror or str(error)
    paths = " -> ".join(str(p) for p in (error.filename, error.filename2) if p is not None)
    where = f"{redact_text(paths)}: " if paths else ""
    return f"{where}{what} (nothing half-written was left; --debug shows the traceback)"


#: Commands that draw with escape sequences of their own (resolve's progress bar).
_OWN_ESCAPES = frozenset({"resolve"})


#: What a shell reports for a command that SIGPIPE ended (128 + 13).
SIGPIPE_STATUS = 141


def _reader_gone() -> int:
    """``envbuilder query | head -1``: the reader left; stop quietly, as `cat` does.

    Standard output is pointed at /dev/null so that the interpreter's last flush at exit
    does not raise again and print "Exception ignored … BrokenPipeError"."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real descriptor behind stdout (a test's capture)
        pass
    return SIGPIPE_STATUS


def _run(args: argparse.Namespace, debug: bool) -> int:
    try:
        check_command(args.command, args)
        rc: int = args._module.run(args)
        sys.stdout.flush()  # a reader that went away is found here, not at exit
    except BrokenPipeError:
        return _reader_gone()
    except EnvbuilderError as e:
        if debug:
            raise
        print(f"envbuilder {args.command}: error: {redact_text(str(e))}", file=sys.stderr)
        return e.return_code
    except OSError as e:
        # A file or directory the user named, or the environment points at (an --out that is
        # read-only or full, XDG_CACHE_HOME naming a file, --matrix given a directory): the
        # system's words and the path, not a traceback. --debug shows the traceback.
        if debug:
            raise
        print(f"envbuilder {args.command}: error: {describe_os_error(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        code = 128 + signal.SIGTERM if isinstance(e, Terminated) else 130
        print("envbuilder: interrupted; nothing more was written", file=sys.stderr)
        main_thread = threading.main_thread()
        if any(t is not main_thread and not t.daemon for t in threading.enumerate()):
            # Worker threads may sit in a network read for up to its timeout, and the
            # interpreter would wait for them at exit: leave now. Every file is written
            # atomically, so none is left half-written.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    return rc
