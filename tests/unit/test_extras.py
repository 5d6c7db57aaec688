"""Which command needs which extra: the table agrees with pyproject.toml, and a missing
extra stops a command with the pip line that installs it."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from envbuilder.cli import COMMANDS
from envbuilder.errors import MissingToolError
from envbuilder.extras import COMMAND_NEEDS, Need, check_command, require

PYPROJECT = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
BASE = {Requirement(r).name for r in PYPROJECT["project"]["dependencies"]}
ABSENT = "envbuilder_test_absent_module"


def test_every_command_says_what_it_needs() -> None:
    assert set(COMMAND_NEEDS) == set(COMMANDS)


@pytest.mark.parametrize(
    "need", sorted({n for needs in COMMAND_NEEDS.values() for n in needs}, key=repr)
)
def test_each_needed_module_comes_with_its_extra_and_not_the_base(need: Need) -> None:
    assert need.module in {Requirement(r).name for r in EXTRAS[need.extra]}
    assert need.module not in BASE
    assert need.extra in Requirement(EXTRAS["all"][0]).extras


@pytest.mark.parametrize(
    ("needs", "in_place", "stops"),
    [
        ((), False, False),
        ((Need(module="json", extra="resolve"),), False, False),
        ((Need(module=ABSENT, extra="docker"),), False, True),
        ((Need(module=ABSENT, extra="docker", unless="in_place"),), True, False),
        ((Need(module=ABSENT, extra="docker", unless="in_place"),), False, True),
        ((Need(module="envbuilder", extra="docker"),), False, False),
        ((Need(module="docs", extra="docker"),), False, True),  # a bare directory here
    ],
)
def test_check_command(
    monkeypatch: pytest.MonkeyPatch, needs: tuple[Need, ...], in_place: bool, stops: bool
) -> None:
    monkeypatch.chdir(Path(__file__).parents[2])
    monkeypatch.syspath_prepend(".")
    monkeypatch.setitem(COMMAND_NEEDS, "conformance", needs)
    args = argparse.Namespace(in_place=in_place)
    if not stops:
        check_command("conformance", args)
        return
    with pytest.raises(MissingToolError) as e:
        check_command("conformance", args)
    extra = needs[0].extra
    assert f"pip install 'gpu-envbuilder[{extra}]'" in str(e.value)
    assert e.value.return_code == 3


def test_require_names_the_extra() -> None:
    assert require("json", extra="resolve", needed_for="x").__name__ == "json"
    with pytest.raises(MissingToolError, match=r"x needs the Python package .*\[resolve\]"):
        require(ABSENT, extra="resolve", needed_for="x")
