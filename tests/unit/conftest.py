"""Fixtures shared by the unit tests of the lockfile's consumers (query, doctor, site)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envbuilder.aggregate.merge import build_lockfile
from envbuilder.aggregate.results import find_results
from envbuilder.lockfile.model import CompatLock
from envbuilder.model import load_resolution

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(scope="session")
def compat(tmp_path_factory: pytest.TempPathFactory) -> CompatLock:
    """The compatibility lockfile of the synthetic ``tests/data`` (made by make_synthetic.py)."""
    root = tmp_path_factory.mktemp("compat")
    shutil.copytree(DATA / "locks", root / "locks")
    resolution = root / "locks" / "resolution.json"
    lock, rejected = build_lockfile(
        load_resolution(resolution),
        resolution_path=resolution,
        results=find_results([DATA / "results"]),
        out=root / "compat.lock.json",
    )
    assert not rejected
    return lock
