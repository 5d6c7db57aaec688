"""A run is evidence for a row only on the row's operating system."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from envbuilder.aggregate.claims import claim_problems
from envbuilder.model import ResolvedCombination, load_resolution

DATA = Path(__file__).parents[1] / "data"
CUDART = "py3.12-default-torch2.7.0-xformers0.0.30-cudart"
GOOD = json.loads((DATA / "results" / f"{CUDART}.h100.json").read_text())
LINUX_ROW = load_resolution(DATA / "locks" / "resolution.json").by_id()[CUDART]
LOCKED = {"torch": "2.7.0", "xformers": "0.0.30", "nvidia-cuda-runtime-cu12": "12.8.90"}


def on(platform: str) -> ResolvedCombination:
    """The same answer for a row of another platform."""
    return dataclasses.replace(
        LINUX_ROW, combination=dataclasses.replace(LINUX_ROW.combination, platform=platform)
    )


@pytest.mark.parametrize(
    ("row", "ran_on", "said"),
    [
        (on("win_amd64"), "Linux-6.8.0-x86_64-with-glibc2.39", "not a windows machine"),
        (on("win_amd64"), "macOS-14.5-arm64-arm-64bit", "not a windows machine"),
        (LINUX_ROW, "Windows-10-10.0.22631-SP0", "not a linux machine"),
        (on("musllinux_1_2_x86_64"), "Windows-11-10.0.26100-SP0", "not a linux machine"),
        (on("macosx_14_0_arm64"), "Linux-6.8.0-aarch64-with-glibc2.39", "not a macos machine"),
    ],
)
def test_a_run_on_another_operating_system_is_named(
    row: ResolvedCombination, ran_on: str, said: str
) -> None:
    data = copy.deepcopy(GOOD)
    data["runner"]["platform"] = ran_on
    problems = claim_problems(data, row, locked=LOCKED)
    assert any(said in p and repr(ran_on) in p for p in problems), problems


@pytest.mark.parametrize(
    ("row", "ran_on"),
    [
        (on("win_amd64"), "Windows-10-10.0.22631-SP0"),
        (LINUX_ROW, "Linux-6.8.0-x86_64-with-glibc2.39"),
        (on("musllinux_1_2_x86_64"), "Linux-6.6.0-x86_64-with"),
        (LINUX_ROW, "Linux"),
    ],
)
def test_a_run_on_the_row_s_operating_system_agrees(row: ResolvedCombination, ran_on: str) -> None:
    data = copy.deepcopy(GOOD)
    data["runner"]["platform"] = ran_on
    assert claim_problems(data, row, locked=LOCKED) == []
