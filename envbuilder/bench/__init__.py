"""Benchmarks, one module per benchmark: ``envbuilder.bench.<name>`` with ``main(argv) -> int``.

``python -m envbuilder.bench NAME [ARGS...]`` (``nox -s bench -- NAME``) runs one.
Benchmarks print ratios against anchors measured in the same run; tests never time things.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Sequence

__all__ = ["available", "main"]


def available() -> list[str]:
    """Names of the benchmarks in this package."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    names = available()
    if not args or args[0] not in names:
        given = repr(args[0]) if args else "nothing"
        print(
            f"usage: python -m envbuilder.bench NAME [ARGS...]; NAME is one of {', '.join(names)} (got {given})",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(f"{__name__}.{args[0]}")
    rc: int = module.main(args[1:])
    return rc
