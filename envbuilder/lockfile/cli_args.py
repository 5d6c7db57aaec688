"""Arguments shared by the commands that read the lockfile."""

from __future__ import annotations

import argparse

from envbuilder.lockfile.model import USES

__all__ = ["PYTHON_HELP", "add_lock_argument", "add_python_argument", "add_selection_arguments"]

#: ``--python`` means the same in every consumer command: a version or an interpreter.
PYTHON_HELP = (
    "a Python version (3.12) or an interpreter (.venv/bin/python, a venv directory, "
    "python3.12 on PATH); default: $VIRTUAL_ENV, else $CONDA_PREFIX, else the first python3 "
    "on PATH"
)


def add_lock_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lock",
        default=None,
        metavar="FILE|URL",
        help="the compatibility lockfile, or the https URL of a published one (downloaded, "
        "its content hash checked); default: $ENVBUILDER_LOCK, else $ENVBUILDER_LOCK_URL (fetched "
        "at most daily), else ./compat.lock.json, else the snapshot this envbuilder carries",
    )


def add_python_argument(parser: argparse.ArgumentParser, help: str = PYTHON_HELP) -> None:
    parser.add_argument("--python", metavar="VERSION|PATH", help=help)


def add_selection_arguments(
    parser: argparse.ArgumentParser, *, python_help: str = PYTHON_HELP
) -> None:
    add_python_argument(parser, python_help)
    parser.add_argument("--cuda", help="CUDA version: 12.1, cu121, cpu or default")
    parser.add_argument("--torch", help="torch version or prefix, e.g. 2.5 or 2.5.1")
    parser.add_argument("--xformers", help="xformers version or prefix")
    parser.add_argument(
        "--gpu", help="GPU: compute capability (sm90, 9.0) or a model name (H100, H200, A100)"
    )
    parser.add_argument(
        "--use",
        choices=USES,
        help="judge by the verdict for this use instead of the worst over all four: eager "
        "inference, compiled inference, eager training, compiled training",
    )
