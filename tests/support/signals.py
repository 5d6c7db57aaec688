"""Signals in the processes a test starts."""

from __future__ import annotations

import signal

__all__ = ["sigint_at_default"]


def sigint_at_default() -> None:
    """A child's ``preexec_fn``: SIGINT at its default, as Ctrl-C in a terminal finds it.

    A test run started as a background job of a non-interactive shell (``cmd &`` in a
    script, as a CI wrapper may) inherits SIGINT ignored, and Python leaves an ignored
    SIGINT ignored: a test that sends it to envbuilder would wait for nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
