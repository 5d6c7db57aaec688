"""Arguments shared by the commands that select combinations of a matrix."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_matrix_argument", "add_selectors"]


def add_selectors(parser: argparse.ArgumentParser, *, none_means: str = "all") -> None:
    parser.add_argument(
        "selectors",
        nargs="*",
        metavar="SELECTOR",
        help=f"cu121, py3.11, torch2.5, an id, a glob; none = {none_means}",
    )


def add_matrix_argument(
    parser: argparse.ArgumentParser, *, default: Path | None = Path("matrix.toml"), help: str = ""
) -> None:
    parser.add_argument(
        "--matrix",
        type=Path,
        default=default,
        metavar="FILE",
        help=help or "matrix file (default: %(default)s)",
    )
