"""Architecture coverage and build-record parsing (pure parts of the environment checks)."""

from __future__ import annotations

import pytest

from envbuilder.conformance._archs import CudaArch, covering, parse_arch_list, torch_arch_list
from envbuilder.conformance.checks_environment import release_of


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
    assert covering(parse_arch_list(arch_list), capability) == covered_by


def test_parse_arch_list_reads_ptx_and_suffixes() -> None:
    assert list(parse_arch_list("7.5 8.0+PTX;9.0a, 8.6+ptx bogus")) == [
        CudaArch(7, 5),
        CudaArch(8, 0, ptx=True),
        CudaArch(9, 0, "a"),
        CudaArch(8, 6, ptx=True),
    ]


@pytest.mark.parametrize(
    ("names", "capability", "covered_by"),
    [
        (["sm_80", "sm_90", "compute_90"], (9, 0), "9.0"),
        (["sm_80", "sm_90", "compute_90"], (8, 9), "8.0"),  # sm_80 machine code on an L4
        (["sm_80", "sm_90", "compute_90"], (10, 0), "9.0+PTX"),  # only PTX JIT on a B200
        (["sm_90a"], (9, 0), "9.0a"),
        (["sm_90a"], (10, 0), None),
        (["compute_100"], (9, 0), None),  # PTX for later GPUs only
    ],
)
def test_torch_arch_names_are_read_like_the_arch_list(
    names: list[str], capability: tuple[int, int], covered_by: str | None
) -> None:
    assert covering(torch_arch_list(names), capability) == covered_by


@pytest.mark.parametrize(("version", "release"), [("2.10.0+cu128", "2.10.0"), ("2.11.0", "2.11.0")])
def test_release_of(version: str, release: str) -> None:
    assert release_of(version) == release
