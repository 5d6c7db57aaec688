"""Benchmarks: ``python -m envbuilder.bench NAME [ARGS]`` (``nox -s bench -- NAME``).

Each benchmark measures envbuilder against an anchor in the same run and
prints the ratios next to the targets; none of them asserts a time.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

__all__ = ["BENCHMARKS", "main"]

#: benchmark name -> module exposing ``main(argv) -> int``
BENCHMARKS: dict[str, str] = {
    "resolve": "envbuilder.bench.resolve",
    "build": "envbuilder.bench.build",
    "doctor": "envbuilder.bench.doctor",
    "source-build": "envbuilder.bench.source_build",
    "suite": "envbuilder.bench.suite",
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in BENCHMARKS:
        names = ", ".join(BENCHMARKS)
        print(f"usage: python -m envbuilder.bench {{{names}}} [ARGS...]", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[args[0]])
    rc: int = module.main(args[1:])
    return rc
