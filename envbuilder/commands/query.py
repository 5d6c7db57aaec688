"""``envbuilder query``: the lockfile's combinations that match, best first.

The command reads the options, finds the lockfile and asks `consumer.query.answer`; the
answer is laid out by `consumer.query_text` (one screen: the terminal's width, at most
`query_text.SCREEN_LINES` lines) or, with ``--json``, by `consumer.query_json` (everything).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from envbuilder.commands._lockfile_args import add_lock_argument, add_selection_arguments

if TYPE_CHECKING:
    from envbuilder.consumer.host import Host
    from envbuilder.consumer.interpreter import Interpreter
    from envbuilder.consumer.query import Answer, Query
    from envbuilder.consumer.query_text import ThisMachine

HELP = "list the lockfile's combinations matching --python/--cuda/--torch/--gpu, best first (--use: by one use's verdict; --here: for this machine)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "id",
        nargs="?",
        metavar="ID",
        help="one combination: its verdict per use (or for --use), each with the failing "
        "checks grouped by cause",
    )
    add_lock_argument(parser)
    add_selection_arguments(parser)
    parser.add_argument(
        "--arch",
        metavar="ARCH",
        help="CPU architecture of the host: x86_64 or aarch64 (amd64, arm64 accepted)",
    )
    parser.add_argument(
        "--driver",
        metavar="VERSION",
        help="the host's NVIDIA driver version, e.g. 550.54.15: a combination whose CUDA "
        "release needs a newer one is kept with a warning where NVIDIA's minor-version "
        "compatibility runs it, and rejected otherwise",
    )
    parser.add_argument(
        "--here",
        action="store_true",
        help="for this machine: detect Python, architecture, GPU and driver (NVML or "
        "nvidia-smi); explicit options override what is detected",
    )
    parser.add_argument(
        "--long",
        action="store_true",
        help="under each combination, its failing checks grouped by cause (the component at "
        "fault, a command that reproduces one)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="list every combination, even when they do not fit one screen",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _python(args: argparse.Namespace) -> str | None:
    """The Python version ``--python`` names: a version as given, an interpreter's asked."""
    from envbuilder.consumer.interpreter import interpreter_version, parse_python

    if not args.python:
        return None
    request = parse_python(args.python)
    return request.version or interpreter_version(request.path)  # type: ignore[arg-type]


def _interpreter(args: argparse.Namespace) -> tuple[Interpreter | None, str]:
    """``--here``: the user's interpreter and the line that names it (none found is said,
    and no Python is then assumed)."""
    from envbuilder.consumer.interpreter import choose, parse_python
    from envbuilder.errors import MissingToolError

    try:
        chosen = choose(parse_python(args.python) if args.python else None)
    except MissingToolError as e:
        return None, f"interpreter: none ({e}); judged for every Python"
    return chosen, f"interpreter: {chosen.describe()}"


def _query(args: argparse.Namespace, host: Host | None) -> Query:
    from envbuilder.consumer.query import Query

    gpu = args.gpu
    if gpu is None and host is not None and host.gpus:
        gpu = host.gpus[0].compute_capability or host.gpus[0].name
    return Query(
        gpu_name=args.gpu or (host.gpus[0].name if host is not None and host.gpus else None),
        no_gpu=host is not None and not host.gpus and args.gpu is None,
        suggest=True,
        python=(host.python or None) if host is not None else _python(args),
        cuda=args.cuda,
        torch=args.torch,
        xformers=args.xformers,
        gpu=gpu,
        use=args.use,
        arch=args.arch or (host.arch if host else None),
        driver=args.driver or (host.driver if host else None),
        os=(host.os or None) if host else None,
    )


def run(args: argparse.Namespace) -> int:
    from envbuilder.consumer.advice import fit
    from envbuilder.consumer.host import detect_host
    from envbuilder.consumer.published import lockfile_choice
    from envbuilder.consumer.query import answer
    from envbuilder.consumer.query_json import json_answer
    from envbuilder.consumer.query_text import Layout, text_answer, wrap_sentence
    from envbuilder.lockfile.read import load_lockfile

    now = datetime.now(UTC)
    path, source = lockfile_choice(args.lock, args.settings)
    if source:  # on stderr: stdout stays one screen (or JSON)
        print(wrap_sentence(source, _screen()[0]), file=sys.stderr)
    lock = load_lockfile(path)
    chosen, chosen_line = _interpreter(args) if args.here else (None, "")
    host = detect_host(python=chosen.version if chosen else "") if args.here else None
    query = _query(args, host)
    result = answer(lock, query)
    if args.id is not None:
        result = _only(result, args.id, lock.by_id())
    if args.json:
        document = json_answer(
            lock, result, query, now, path=path, url=_lock_url(args), interpreter=chosen, host=host
        )
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if result.matches else 1
    width, height = _screen()
    if not result.matches:
        print(fit(f"no combination in {path} matches", width), file=sys.stderr)
    lines = text_answer(
        lock,
        result,
        query,
        now,
        layout=Layout(width=width, height=height, long=args.long, everything=args.all),
        combination=args.id,
        here=_this_machine(args, host, chosen_line),
        host_decides=_host_decides(args),
    )
    print("\n".join(lines))
    return 0 if result.matches else 1


def _lock_url(args: argparse.Namespace) -> str | None:
    """The URL the lockfile came from: ``--lock URL``, else the configured one where
    neither ``--lock`` nor a configured file chose."""
    from envbuilder.consumer.published import is_url

    url: str | None = args.lock if args.lock and is_url(args.lock) else None
    if args.lock is None and args.settings.lockfile is None and args.settings.lock_url:
        url = args.settings.lock_url
    return url


def _host_decides(args: argparse.Namespace) -> bool:
    """Whether the host decides the rejections (a Grace GPU implies aarch64), which makes
    them news; a plain filter's misses are not."""
    from envbuilder.gpus import gpu_arch

    return bool(args.here or args.arch or args.driver or gpu_arch(args.gpu or ""))


def _this_machine(
    args: argparse.Namespace, host: Host | None, interpreter_line: str
) -> ThisMachine | None:
    """``--here``: the host judged for, and the options given that override it."""
    from envbuilder.consumer.query_text import ThisMachine

    if host is None:
        return None
    given = (("arch", args.arch), ("gpu", args.gpu), ("driver", args.driver))
    return ThisMachine(
        host=host,
        interpreter_line=interpreter_line,
        overridden=tuple(f"--{k} {v}" for k, v in given if v),
    )


def _screen() -> tuple[int, int]:
    """The terminal's width, and the lines one answer may take: at most `SCREEN_LINES`
    (`SCREEN_COLUMNS` wide where output is not a terminal)."""
    from envbuilder.consumer.query_text import SCREEN_COLUMNS, SCREEN_LINES
    from envbuilder.reporter import terminal_size

    size = terminal_size(SCREEN_COLUMNS, SCREEN_LINES)
    return max(size.columns, 40), max(min(size.lines, SCREEN_LINES), 10)


def _only(result: Answer, combination: str, known: Mapping[str, object]) -> Answer:
    """*result* cut down to the combination *combination*; an unknown id is bad input."""
    from dataclasses import replace

    from envbuilder.errors import InputError

    if combination not in known:
        import difflib

        close = difflib.get_close_matches(combination, list(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InputError(f"no combination {combination!r} in the lockfile{hint}")
    return replace(
        result,
        matches=tuple(m for m in result.matches if m.entry.id == combination),
        rejected=tuple(r for r in result.rejected if r.entry.id == combination),
    )
