"""`nox -s mutants -- --changed`: which plants local work can have touched."""

from __future__ import annotations

import dataclasses

import pytest

from tests.mutation.run import RUNNER, Plant, touched_plants

HASH = Plant(
    name="hash-check-removed",
    file="envbuilder/lockfile/read.py",
    find="if actual != recorded:",
    replace="if False:",
    tests=("tests/unit/test_compat_lockfile.py::test_an_edited_lockfile_is_refused[x]",),
    why="an edited lockfile would be read as genuine",
)
QUIET = Plant(
    name="quiet-pipes",
    file="envbuilder/textsafe.py",
    find="a",
    replace="b",
    tests=("tests/integration",),
    why="a directory of tests",
)
PLANTS = [HASH, QUIET]


@pytest.mark.parametrize(
    ("changed", "chosen"),
    [
        ((), []),
        (("README.md",), []),
        (("envbuilder/lockfile/read.py",), ["hash-check-removed"]),
        (("envbuilder/lockfile/read.pyi",), []),  # a neighbour is not the file
        (("tests/unit/test_compat_lockfile.py",), ["hash-check-removed"]),
        (("tests/unit/conftest.py",), ["hash-check-removed"]),
        (("tests/conftest.py",), ["hash-check-removed", "quiet-pipes"]),
        (("tests/integration/test_quiet_pipes.py",), ["quiet-pipes"]),
        (("tests/integration/conftest.py",), ["quiet-pipes"]),
        (("tests/integration_old/test_x.py",), []),  # a prefix that is not the directory
        (
            ("envbuilder/textsafe.py", "envbuilder/lockfile/read.py"),
            ["hash-check-removed", "quiet-pipes"],
        ),
        ((RUNNER,), ["hash-check-removed", "quiet-pipes"]),
    ],
)
def test_a_plant_is_chosen_when_an_input_of_it_changed(
    changed: tuple[str, ...], chosen: list[str]
) -> None:
    got = touched_plants(PLANTS, frozenset(changed), before=PLANTS)
    assert [p.name for p in got] == chosen


@pytest.mark.parametrize(
    ("before", "chosen"),
    [
        ([HASH, QUIET], []),
        ([QUIET], ["hash-check-removed"]),  # new since the base
        ([dataclasses.replace(HASH, find="if actual == recorded:"), QUIET], ["hash-check-removed"]),
        ([], ["hash-check-removed", "quiet-pipes"]),  # no plants file at the base
    ],
    ids=["unchanged", "new", "edited", "no-file-at-base"],
)
def test_a_plant_new_or_edited_since_the_base_is_chosen(
    before: list[Plant], chosen: list[str]
) -> None:
    got = touched_plants(PLANTS, frozenset(), before=before)
    assert [p.name for p in got] == chosen
