"""Text from files and indexes on a terminal: control characters shown, never obeyed.

A results file, a lockfile or an index page can carry ANSI escape sequences or
other control characters in any string (a check's reason, a GPU name); printed
as they are, they recolour, move the cursor, retitle or clear the user's
terminal, or hide a line. Every command but ``resolve`` (whose progress bar is
escape sequences of its own) writes through `PrintableStream`.
"""

from __future__ import annotations

import re
from typing import TextIO

__all__ = ["PrintableStream", "printable"]

#: C0 controls but tab and newline, DEL, and the C1 controls (U+0080-U+009F; U+009B is CSI).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """*text* with each control character but tab and newline written as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class PrintableStream:
    """A text stream that writes `printable` text to *inner*; everything else is *inner*'s."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(printable(text))
        return len(text)

    def writelines(self, lines: list[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)
