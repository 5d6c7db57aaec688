"""Test-wide rules: markers follow the directory, unit tests cannot reach the
network, start subprocesses or talk to Docker (they raise instead), and property
tests run under a Hypothesis profile: ``default`` (100 examples), or ``ci`` (1,000)
where ``CI`` is set; ``--hypothesis-profile=ci`` picks it anywhere."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

with contextlib.suppress(ImportError):  # setuptools is in every test environment we make
    # setuptools replaces the standard library's distutils when it is first imported, and
    # asserts that nobody imported the standard one before it. Tests import in one process
    # what torch's inductor, builds and benchmarks import in many; importing setuptools
    # first keeps one distutils for the whole run (inductor failed with "AssertionError:
    # …/python3.11/distutils/core.py" after other tests had run).
    import setuptools  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: F401

#: examples per property test under Hypothesis' own profiles, which it loads itself: ``ci``
#: where it finds a CI service's variables (CI=…), else ``default``; a test that sets its own
#: count keeps it, and the pytest plugin's --hypothesis-profile, applied later, wins
HYPOTHESIS_EXAMPLES = {"default": 100, "ci": 1000}
for _profile, _examples in HYPOTHESIS_EXAMPLES.items():
    settings.register_profile(_profile, settings.get_profile(_profile), max_examples=_examples)

_MARKER_BY_DIR = {
    "integration": "integration",
    "network": "network",
    "docker": "docker",
    "gpu": "gpu",
    "browser": "browser",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for directory, marker in _MARKER_BY_DIR.items():
            if directory in parts:
                item.add_marker(getattr(pytest.mark, marker))


class ForbiddenInUnitTests(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def _no_inherited_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers fit the terminal they are printed on: a test runner's own COLUMNS/LINES
    (pytest-xdist's workers get 80 x 24) must not decide what a test reads. A test that
    wants a terminal size sets it."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture(autouse=True)
def _unit_tests_stay_pure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if "unit" not in Path(str(request.node.fspath)).parts:
        return

    def no_network(self: socket.socket, address: Any) -> None:
        if isinstance(address, str):  # unix sockets (e.g. Docker) are forbidden too
            raise ForbiddenInUnitTests(f"unit tests must not connect to {address!r}")
        raise ForbiddenInUnitTests(f"unit tests must not connect to {address!r}")

    def no_subprocess(*args: Any, **kwargs: Any) -> Any:
        raise ForbiddenInUnitTests(f"unit tests must not start subprocesses: {args[:1]!r}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(subprocess.Popen, "__init__", no_subprocess)
