"""Text from files and indexes on a terminal: control characters shown, never obeyed.

A results file, a lockfile or an index page can carry ANSI escape sequences or
other control characters in any string (a check's reason, a GPU name); printed
as they are, they recolour, move the cursor, retitle or clear the user's
terminal, or hide a line; bidirectional controls (U+202E and the like) reorder what
follows them, so that a line reads other than it is. Every command but ``resolve``
(whose progress bar is escape sequences of its own) writes through `PrintableStream`.
A value from a document printed inside a line of ours (a GPU name, a check's reason)
goes through `one_line` first: a newline in it would print a line that looks like ours.
"""

from __future__ import annotations

import re
from typing import TextIO

__all__ = ["PrintableStream", "one_line", "printable"]

#: Bidirectional controls (marks, embeddings, overrides, isolates) and the line and
#: paragraph separators.
_UNICODE = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
#: C0 controls but tab and newline, DEL, the C1 controls (U+0080-U+009F; U+009B is CSI),
#: and `_UNICODE`.
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_UNICODE}]")
#: `_CONTROL` and tab and newline.
_BREAKING = re.compile(f"[\x00-\x1f\x7f-\x9f{_UNICODE}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """*text* with each control character but tab and newline written as ``\\xNN`` (a
    bidirectional control as ``\\uNNNN``)."""
    return _CONTROL.sub(_escape, text)


def one_line(text: str) -> str:
    """`printable` *text* with its tabs and newlines escaped too: one line, as it was read."""
    return _BREAKING.sub(_escape, text)


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
