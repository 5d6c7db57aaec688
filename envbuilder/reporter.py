"""Console output for long-running commands: steps with ✓/✕ and timings,
``+ command`` echo before subprocesses, GitHub Actions log groups and a step
summary table when running in Actions. Everything goes to stderr, so that
``--json`` output on stdout stays clean.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

__all__ = ["Reporter", "Step", "terminal_size"]


def terminal_size(columns: int, lines: int) -> os.terminal_size:
    """The terminal's size: ``COLUMNS`` and ``LINES`` first, then the terminal's own, and
    *columns* × *lines* where output is not a terminal."""
    return shutil.get_terminal_size((columns, lines))


class Step:
    """A step in progress: `fail` marks it ✕ although nothing was raised."""

    def __init__(self) -> None:
        self.failed = False

    def fail(self) -> None:
        self.failed = True


class Reporter:
    def __init__(self, stream: TextIO | None = None, *, verbose: int = 0) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.verbose = verbose
        self.in_actions = os.environ.get("GITHUB_ACTIONS") == "true"

    @property
    def interactive(self) -> bool:
        return self.stream.isatty() and not self.in_actions

    def line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def detail(self, text: str) -> None:
        if self.verbose:
            self.line(f"    {text}")

    def command(self, argv: Sequence[str]) -> None:
        self.line("+ " + shlex.join(str(a) for a in argv))

    @contextmanager
    def step(self, title: str) -> Iterator[Step]:
        if self.in_actions:
            self.line(f"::group::{title}")
        else:
            self.line(f"▶ {title}")
        start = time.monotonic()
        ok = False
        outcome = Step()
        try:
            yield outcome
            ok = not outcome.failed
        finally:
            elapsed = time.monotonic() - start
            if self.in_actions:
                self.line("::endgroup::")
            mark = "✓" if ok else "✕"
            self.line(f"{mark} {title} ({elapsed:.1f}s)")

    def summary(self, markdown: str) -> None:
        """Append to the GitHub step summary when running in Actions."""
        path = os.environ.get("GITHUB_STEP_SUMMARY")
        if path:
            with Path(path).open("a", encoding="utf-8") as f:
                f.write(markdown.rstrip() + "\n")
