"""Test-wide rules: markers follow the directory, and unit tests cannot reach
the network, start subprocesses or talk to Docker (they raise instead)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

with contextlib.suppress(ImportError):  # setuptools is in every test environment we make
    # setuptools replaces the standard library's distutils when it is first imported, and
    # asserts that nobody imported the standard one before it. Tests import in one process
    # what torch's inductor, builds and benchmarks import in many; importing setuptools
    # first keeps one distutils for the whole run (inductor failed with "AssertionError:
    # …/python3.11/distutils/core.py" after other tests had run).
    import setuptools  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: F401

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
