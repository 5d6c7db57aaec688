"""Arguments shared by the commands that read the lockfile."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence

from envbuilder.lockfile.model import USES

__all__ = [
    "PYTHON_HELP",
    "add_lock_argument",
    "add_python_argument",
    "add_selection_arguments",
    "choice",
]


def choice(options: Sequence[str]) -> Callable[[str], str]:
    """An argparse ``type`` for a closed set that suggests the nearest value on a typo
    (``invalid choice 'inferenc'; did you mean 'inference'?``)."""

    def parse(value: str) -> str:
        if value in options:
            return value
        near = difflib.get_close_matches(value, list(options), n=1, cutoff=0.5)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise argparse.ArgumentTypeError(
            f"invalid choice {value!r}{hint} (choose from {', '.join(options)})"
        )

    parse.__name__ = "choice"
    return parse


#: ``--python`` means the same in every consumer command: a version or an interpreter.
PYTHON_HELP = (
    "a Python version (3.12) or an interpreter (.venv/bin/python, a venv directory, "
    "python3.12 on PATH) (default: $VIRTUAL_ENV, else $CONDA_PREFIX, else the first python3 "
    "on PATH)"
)


def add_lock_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lock",
        default=None,
        metavar="FILE|URL",
        help="the compatibility lockfile, or the https URL of a published one (downloaded, "
        "its content hash checked) (default: $ENVBUILDER_LOCK, else $ENVBUILDER_LOCK_URL, "
        "fetched at most daily, else ./compat.lock.json, else the snapshot this envbuilder "
        "carries)",
    )


def add_python_argument(parser: argparse.ArgumentParser, help: str = PYTHON_HELP) -> None:
    parser.add_argument("--python", metavar="VERSION|PATH", help=help)


def add_selection_arguments(
    parser: argparse.ArgumentParser, *, python_help: str = PYTHON_HELP
) -> None:
    add_python_argument(parser, python_help)
    parser.add_argument(
        "--cuda", metavar="VERSION", help="CUDA version: 12.1, cu121, cpu or default"
    )
    parser.add_argument(
        "--torch", metavar="VERSION", help="torch version or prefix, e.g. 2.5 or 2.5.1"
    )
    parser.add_argument("--xformers", metavar="VERSION", help="xformers version or prefix")
    parser.add_argument(
        "--gpu",
        metavar="GPU",
        help="GPU: compute capability (sm90, 9.0) or a model name (H100, H200, A100)",
    )
    parser.add_argument(
        "--use",
        type=choice(USES),
        metavar="{" + ",".join(USES) + "}",
        help="judge by the verdict for this use instead of the worst over all four: eager "
        "inference, compiled inference, eager training, compiled training",
    )
