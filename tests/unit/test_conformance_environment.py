"""Architecture coverage and build-record parsing (pure parts of the environment checks)."""

from __future__ import annotations

import pytest

from envbuilder.conformance.checks_environment import arch_covered, parse_arch_list, release_of


@pytest.mark.parametrize(
    ("arch_list", "capability", "covered_by"),
    [
        ("7.5 8.0+PTX 8.0 9.0a", (9, 0), "9.0a"),  # xformers 0.0.35's list on an H100/H200
        ("7.5 8.0+PTX 8.0 9.0a", (8, 6), "8.0"),  # same major, later minor
        ("7.5 8.0+PTX 8.0 9.0a", (10, 0), "8.0+PTX"),  # PTX JIT for a later GPU
        ("7.5 8.0 9.0a", (10, 0), None),  # 9.0a is arch-specific, no PTX: nothing runs
        ("8.0 8.6", (7, 5), None),
        ("9.0a", (9, 0), "9.0a"),
        ("", (9, 0), None),
    ],
)
def test_arch_covered(arch_list: str, capability: tuple[int, int], covered_by: str | None) -> None:
    assert arch_covered(parse_arch_list(arch_list), capability) == covered_by


def test_parse_arch_list_reads_ptx_and_suffixes() -> None:
    assert parse_arch_list("7.5 8.0+PTX 9.0a") == [
        (7, 5, ""),
        (8, 0, ""),
        (8, 0, "ptx"),
        (9, 0, "a"),
    ]


@pytest.mark.parametrize(("version", "release"), [("2.10.0+cu128", "2.10.0"), ("2.11.0", "2.11.0")])
def test_release_of(version: str, release: str) -> None:
    assert release_of(version) == release
